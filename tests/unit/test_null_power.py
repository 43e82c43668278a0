"""tooling/diagnose/null_power.py: the measured null's power from its design, with the validate stage's own test.
Few draws and relabellings (seconds): what is checked is that the simulation sees what the test must see, not the
table's figures."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest

from pipelines.checks.replicate_null import pooled_p
from support import REPO
from tooling.diagnose import null_power

ALPHA = 0.05 / 3


def test_the_simulated_p_is_the_validate_stages_pooled_p() -> None:
    draws = np.random.default_rng(2).standard_normal((12, 3, 6))
    draws[6:, 0] += 2.0
    ours = null_power.pooled_ps(draws, null_power.relabellings(6, 199, "key"))
    theirs = [pooled_p([list(group) for group in states], lambda a, b: abs(a - b), "key", permutations=199,
                       seed=null_power.seed("key"))[1] for states in draws]
    assert ours.tolist() == theirs
    exact = null_power.pooled_ps(draws[:, :, :3], null_power.relabellings(3, 199))  # 1,680: every one, exact
    assert exact.tolist() == [pooled_p([list(g) for g in states[:, :3]], lambda a, b: abs(a - b))[1]
                              for states in draws]


def test_a_moved_framework_is_found_and_more_parted_replicates_find_a_smaller_shift() -> None:
    draws = np.random.default_rng(0).standard_normal((60, 3, 6))
    five = null_power.relabellings(6, 199)
    curve = null_power.power_curve(draws, [ALPHA], five)[:, 0]
    assert curve[0] <= 0.1 and curve[-1] >= null_power.POWER  # no shift: about alpha / m
    moved = draws.copy()
    moved[:, 0] += 8.0
    assert (null_power.pooled_ps(moved, five) == 1 / 200).all()  # 8 sd: every draw, at the smallest p
    shift_five = null_power.shift_at(curve)
    three = null_power.power_curve(draws[:, :, :4], [ALPHA], null_power.relabellings(4, 199))[:, 0]
    shift_three = null_power.shift_at(three)
    assert shift_five is not None and shift_three is not None and 1.0 < shift_five < shift_three < 8.0


def test_the_interim_look_only_removes_rejections_and_stops_most_tests_with_no_bug() -> None:
    """Stopping to accept can only turn a rejection into an acceptance: every draw the sequential design rejects,
    the design with every replicate at once rejects too. With no bug a test goes on about `futility` of the time."""
    draws = np.random.default_rng(4).standard_normal((300, 3, 6))
    five = null_power.relabellings(6, 199)
    interim = null_power.Interim(2, null_power.relabellings(3, 199), 0.2)
    for shift in (0.0, 2.0):
        moved = draws.copy()
        moved[:, 0] += shift
        sequential, more = null_power.sequential_ps(moved, five, interim)
        at_once = null_power.pooled_ps(moved, five)
        assert not ((sequential <= ALPHA) & (at_once > ALPHA)).any()
        if shift == 0.0:
            assert 0.1 < more.mean() < 0.3, more.mean()
            assert (sequential[~more] > 0.2).all()
        else:
            assert more.mean() > 0.5  # a moved framework is rarely accepted at the look
    shift_sequential = null_power.shift_at(null_power.power_curve(draws, [ALPHA], five, interim=interim)[:, 0])
    shift_at_once = null_power.shift_at(null_power.power_curve(draws, [ALPHA], five)[:, 0])
    assert shift_sequential is not None and shift_at_once is not None and shift_at_once <= shift_sequential < 8.0


def test_where_the_looks_floor_is_above_alpha_over_m_every_test_goes_on() -> None:
    """The interim look's groups of 3 allow p down to 1/280: for a family whose alpha / m is below that, the
    null_interim stage sends every test on, so the design is every replicate at once; at or above it, the look."""
    draws = np.random.default_rng(5).standard_normal((200, 3, 6))
    draws[:, 0] += 2.0
    five = null_power.relabellings(6, 199)
    interim = null_power.Interim(2, null_power.relabellings(3, 199), 0.2)
    assert null_power.interim_floor(interim) == pytest.approx(1 / 280)
    large, small = 0.05 / 15, 0.05 / 14  # alpha 0.05: families of 15 and 14
    looked, every = null_power.judged_ps(draws, five, [small, large], interim)
    np.testing.assert_array_equal(every, null_power.pooled_ps(draws, five))
    np.testing.assert_array_equal(looked, null_power.sequential_ps(draws, five, interim)[0])
    assert (looked != every).any()


def test_the_rank_sum_for_comparison_finds_a_moved_framework() -> None:
    curve = null_power.power_curve(np.random.default_rng(3).standard_normal((30, 3, 11)), [ALPHA])[:, 0]
    shift = null_power.shift_at(curve)
    assert curve[0] <= 0.1 and shift is not None and 1.0 < shift < 8.0


def test_a_wider_framework_fails_more_often_than_equal_ones() -> None:
    draws = np.random.default_rng(1).standard_normal((400, 3, 6))
    labels = null_power.relabellings(6, 199)
    equal, wide = (null_power.false_failures(draws, spread, [ALPHA], labels)[0] for spread in (1.0, 3.0))
    assert equal <= 0.03 < wide  # a 3x spread reads as a difference


@pytest.mark.parametrize("argv, named", [
    (["--parted", "0"], "--parted 0"), (["--samples", "5"], "--samples 5"),
    (["--families", "4", "0"], "--families 0"), (["--spread", "0"], "--spread 0.0"),
    (["--first", "6"], "--first 6"), (["--futility", "0"], "--futility 0.0")])
def test_bad_arguments_are_one_error_line(argv: list[str], named: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tooling.diagnose.null_power", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {named}: "), done.stderr


def brute_force_p(cross: list[float], within: list[float]) -> float:
    pooled = np.asarray([*cross, *within], np.float64)
    ranks = null_power.mid_ranks(pooled)
    observed = ranks[: len(cross)].sum()
    splits = list(itertools.combinations(range(len(pooled)), len(cross)))
    return sum(ranks[list(s)].sum() >= observed - 1e-9 for s in splits) / len(splits)


@pytest.mark.parametrize("seed", range(8))
def test_rank_sum_p_is_the_exact_permutation_p_value_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cross, within = list(rng.integers(0, 4, 6).astype(float)), list(rng.integers(0, 4, 10).astype(float))
    assert null_power.rank_sum_p(cross, within) == pytest.approx(brute_force_p(cross, within), abs=1e-12)


def test_rank_sum_p_extremes() -> None:
    k = 5
    cross = [10.0 + i for i in range(k + 1)]  # every cross distance above every within one
    within = [float(i) for i in range(2 * k)]
    assert null_power.rank_sum_p(cross, within) == pytest.approx(1 / math.comb(3 * k + 1, k + 1))
    assert null_power.rank_sum_p(within[: k + 1], cross + within[k + 1 :]) == pytest.approx(1.0)
    assert null_power.rank_sum_p([0.0] * 4, [0.0] * 6) == 1.0  # all tied: no evidence either way
