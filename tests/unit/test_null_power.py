"""tooling/null_power.py: the measured null's power from its design, with the validate stage's own test. Few draws
(seconds): what is checked is that the simulation sees what the test must see, not the table's figures."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from support import REPO
from tooling import null_power


def test_the_smallest_p_is_one_split_of_all() -> None:
    assert null_power.smallest_p(11, 20) == pytest.approx(1 / math.comb(31, 11))


def test_a_moved_framework_is_found_and_more_replicates_find_a_smaller_shift() -> None:
    draws = np.random.default_rng(0).standard_normal((60, 3, 11))
    curve = null_power.power_curve(draws, [0.05 / 4])[:, 0]
    assert curve[0] <= 0.1 and curve[-1] == 1.0  # no shift: about alpha / m; 8 sd: every draw
    ten = null_power.shift_at(curve)
    five = null_power.shift_at(null_power.power_curve(draws[:, :, :6], [0.05 / 4])[:, 0])
    assert ten is not None and five is not None and 1.0 < ten < five < 8.0


def test_a_wider_framework_fails_more_often_than_equal_ones() -> None:
    draws = np.random.default_rng(1).standard_normal((200, 3, 11))
    equal, wide = null_power.false_failures(draws, 1.0, [0.05])[0], null_power.false_failures(draws, 3.0, [0.05])[0]
    assert equal <= 0.15 < wide  # any of three pairs at alpha 0.05; a 3x spread reads as a difference


@pytest.mark.parametrize("argv, named", [
    (["--count", "0"], "--count 0"), (["--samples", "5"], "--samples 5"), (["--families", "4", "0"], "--families 0"),
    (["--spread", "0"], "--spread 0.0")])
def test_bad_arguments_are_one_error_line(argv: list[str], named: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tooling.null_power", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {named}: "), done.stderr
