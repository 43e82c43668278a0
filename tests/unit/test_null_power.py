"""tooling/diagnose/null_power.py: the measured null's power from its design, with the validate stage's own test.
Few draws and relabellings (seconds): what is checked is that the simulation sees what the test must see, not the
table's figures."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

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


def record(within_run: int | None, within_pairs: int | None, across: int | None, replicates: int = 5,
           steps: int = 400) -> dict:
    """A `parting` record of validate's shape: every run-replicate pair of a framework parts at `within_run`, every
    replicate pair at `within_pairs`, every two frameworks' runs at `across` (None: never)."""
    pairs = replicates * (replicates - 1) // 2
    group = {"run": [within_run] * replicates, "replicates": [within_pairs] * pairs}
    return {"model": "cnn", "steps": steps, "within": {fw: dict(group) for fw in ("torch", "tf", "jax")},
            "across": {"torch|tf": across, "torch|jax": across, "tf|jax": across}}


def test_trainings_that_part_at_once_are_independent_and_late_ones_share_their_steps() -> None:
    assert np.allclose(null_power.parting_correlation(record(0, 0, 0)), np.eye(18))
    shared = null_power.parting_correlation(record(200, 200, 0))  # half the steps within a framework, none across
    assert np.allclose(shared[:6, :6], 0.5 + 0.5 * np.eye(6)) and np.allclose(shared[:6, 6:], 0.0)
    # Across frameworks a pair shares at most what its runs share: runs together for 100 steps, replicates 300.
    nested = null_power.parting_correlation(record(300, 300, 100))
    assert np.isclose(nested[0, 6], 0.25) and np.isclose(nested[1, 7], 0.25) and np.isclose(nested[1, 2], 0.75)
    # Steps that do not nest (replicates parting from each other before either parts from the run) still give a
    # correlation matrix: unit diagonal, no negative eigenvalue.
    odd = null_power.parting_correlation(record(300, 10, 0))
    assert np.allclose(np.diag(odd), 1.0) and np.linalg.eigvalsh(odd).min() > -1e-9


def test_a_group_stopped_at_the_look_is_grown_as_its_replicates_parted() -> None:
    grown = null_power.completed(record(30, 50, 40, replicates=2), parted=5)
    assert grown["within"]["tf"]["run"] == [30] * 5 and grown["within"]["tf"]["replicates"] == [50] * 10
    never = null_power.completed(record(None, None, None, replicates=2), parted=5)
    assert never["within"]["jax"]["run"] == [400] * 5


def test_near_copies_fail_a_faithful_port_and_replicates_that_part_early_do_not() -> None:
    """The pooled test with no bug: where each framework's replicates follow their run long after the frameworks'
    runs part, the groups have less spread than the distances across them and the test fails a correct port far
    above alpha; where they part first, about alpha."""
    labels = null_power.relabellings(6, 199)
    rng = np.random.default_rng(5)
    copies = null_power.parting_draws(null_power.parting_correlation(record(380, 380, 20)), 200, rng)
    samples = null_power.parting_draws(null_power.parting_correlation(record(20, 20, 40)), 200, rng)
    assert (null_power.pooled_ps(copies, labels) <= ALPHA).mean() > 0.5
    assert (null_power.pooled_ps(samples, labels) <= ALPHA).mean() <= 0.05


def test_the_parting_table_reads_a_validate_report(tmp_path: Path) -> None:
    report = tmp_path / "validation.json"
    report.write_text(json.dumps({"parting": [record(20, 20, 40, replicates=2)]}))
    done = subprocess.run([sys.executable, "-m", "tooling.diagnose.null_power", "--parting", str(report),
                           "--samples", "10", "--families", "3"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| cnn |")]
    assert len(rows) == 1 and "| 3 points | 40 / 20 | 3 | 0.01667 |" in rows[0], done.stdout
    bad = tmp_path / "other.json"
    bad.write_text("{}")
    done = subprocess.run([sys.executable, "-m", "tooling.diagnose.null_power", "--parting", str(bad)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: --parting {bad}: not a validate report with a parting record"), done.stderr


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
