"""The validate stage's measured null (pipelines/checks/replicate_null.py): the exact permutation test and Holm's
procedure, against brute force and against the textbook cases."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from pipelines.checks.ledger import Ledger
from pipelines.checks.replicate_null import cross_and_within, holm_rejected, mid_ranks, rank_sum_p, smallest_p
from pipelines.checks.replicates import parted
from support import run_in


def brute_force_p(cross: list[float], within: list[float]) -> float:
    pooled = np.asarray([*cross, *within], np.float64)
    ranks = mid_ranks(pooled)
    observed = ranks[: len(cross)].sum()
    splits = list(itertools.combinations(range(len(pooled)), len(cross)))
    return sum(ranks[list(s)].sum() >= observed - 1e-9 for s in splits) / len(splits)


@pytest.mark.parametrize("seed", range(8))
def test_rank_sum_p_is_the_exact_permutation_p_value_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cross, within = list(rng.integers(0, 4, 6).astype(float)), list(rng.integers(0, 4, 10).astype(float))
    assert rank_sum_p(cross, within) == pytest.approx(brute_force_p(cross, within), abs=1e-12)


def test_rank_sum_p_extremes() -> None:
    k = 5
    cross = [10.0 + i for i in range(k + 1)]  # every cross distance above every within one
    within = [float(i) for i in range(2 * k)]
    assert rank_sum_p(cross, within) == pytest.approx(1 / math.comb(3 * k + 1, k + 1))
    assert rank_sum_p(within[: k + 1], cross + within[k + 1 :]) == pytest.approx(1.0)
    assert rank_sum_p([0.0] * 4, [0.0] * 6) == 1.0  # all tied: no evidence either way


def test_cross_and_within_pairs_replicate_i_with_replicate_i() -> None:
    cross, within = cross_and_within(0.0, 1.0, [0.1, 0.2], [1.5, 1.0], lambda x, y: abs(x - y),
                                     [True, True], [True, True])
    assert cross == [1.0, 1.4, 0.8]
    assert within == pytest.approx([0.1, 0.2, 0.5, 0.0])


def test_a_replicate_still_in_lockstep_with_its_run_is_no_sample_of_chaos() -> None:
    cross, within = cross_and_within(0.0, 1.0, [0.1, 0.2], [1.5, 1.0], lambda x, y: abs(x - y),
                                     [False, True], [True, False])
    assert cross == [1.0, 1.4, 0.8]
    assert within == pytest.approx([0.2, 0.5])


def test_parted_reads_each_replicates_step_losses_against_its_own_runs() -> None:
    run = {"step_losses": [2.0, 1.0, 0.5],
           "replicates": [{"step_losses": [2.0, 1.0, 0.5]}, {"step_losses": [2.0, 1.0 + 2e-5, 0.5]},
                          {"step_losses": [2.0, 1.0 + 5e-6, 0.5]}]}
    assert parted(run, 1e-5) == [False, True, False]
    assert parted({"step_losses": [1.0], "replicates": None}, 1e-5) == []


def test_a_null_too_thin_to_reject_leaves_the_float32_bound_standing() -> None:
    """A null whose smallest possible p is above alpha could not reject at any step of Holm's: it cannot judge,
    so its figure fails (it is beyond its float32 bound, or no null would judge it). One that could reject at a
    later step is judged by Holm, so a failure elsewhere does not silence it."""
    assert smallest_p(6, 10) == pytest.approx(1 / 8008)
    assert smallest_p(6, 0) == 1.0
    ledger = Ledger()
    thin = {"cross": [1.0] * 6, "within": [0.5], "p_value": 1 / 7}  # as small as one value allows
    wide = {"cross": [0.5] * 4, "within": [0.5] * 4, "p_value": 1.0}  # smallest possible p 1/70, above alpha / 3
    strong = {"cross": [2.0] * 6, "within": [0.1] * 10, "p_value": 1 / 8008}
    for subject, null in (("torch|tf", thin), ("torch|jax", wide), ("tf|jax", strong)):
        ledger.add_null("cnn", subject, "test_loss_rel", 0.01, 1e-3, null, "runs part")
    ledger.judge_nulls(0.05)
    thin_check, wide_check, strong_check = ledger.checks
    assert not thin_check.passed and "the float32 bound stands" in thin_check.detail, thin_check.detail
    assert wide_check.passed and "no larger at alpha 0.05, Holm over 3" in wide_check.detail, wide_check.detail
    assert not strong_check.passed and "different at alpha 0.05" in strong_check.detail
    assert all(c.null["holm_family"] == 3 for c in ledger.checks)


def test_holm_rejects_step_down() -> None:
    assert holm_rejected([0.001, 0.2, 0.01], 0.05) == [True, False, True]  # 0.001 <= 0.05/3, 0.01 <= 0.05/2
    assert holm_rejected([0.02, 0.03], 0.05) == [True, True]  # 0.02 <= 0.025, then 0.03 <= 0.05
    assert holm_rejected([0.03, 0.03], 0.05) == [False, False]  # 0.03 > 0.025 stops at the first
    assert holm_rejected([], 0.05) == []


def test_a_replicated_models_floor_judges_the_median_and_names_an_outlier() -> None:
    # In the validation environment, where the floor is judged (pipelines.checks.exports needs onnxruntime).
    code = """
import json
from pipelines.checks.exports import quality_floor
from pipelines.checks.ledger import MIN_TEST_ACCURACY, Ledger
from rosetta_common.spec import parse_spec

spec = parse_spec({"models": ["mlp", "cnn"], "quality": {"min_test_accuracy": {"mlp": 0.95, "cnn": 0.9}}})
ledger = Ledger()
reps = [{"test_accuracy": a} for a in (0.95, 0.96, 0.94)]
quality_floor(spec, ledger, "cnn", "torch", {"test_accuracy": 0.85, "replicates": reps})  # one bad path
quality_floor(spec, ledger, "cnn", "tf", {"test_accuracy": 0.95, "replicates": [{"test_accuracy": 0.8}] * 3})
quality_floor(spec, ledger, "mlp", "jax", {"test_accuracy": 0.85, "replicates": None})
print(json.dumps([{"name": c.name == MIN_TEST_ACCURACY, "passed": c.passed, "value": c.value,
                   "tolerance": c.tolerance, "detail": c.detail} for c in ledger.checks]))
"""
    done = run_in("validation", code)
    assert done.returncode == 0, done.stderr
    torch, tf, jax = json.loads(done.stdout.strip().splitlines()[-1])
    assert torch["name"] and tf["name"] and jax["name"]
    assert torch["passed"] and torch["value"] == 0.945 and "rank 1 of 4" in torch["detail"]
    assert "an outlier" in torch["detail"]
    assert not tf["passed"] and tf["value"] == 0.8 and "rank 4 of 4" in tf["detail"] and "outlier" not in tf["detail"]
    assert not jax["passed"] and jax["value"] == 0.85 and jax["tolerance"] == 0.95
