"""The validate stage's measured null (pipelines/checks/replicate_null.py): the pooled permutation test and Holm's
procedure, against brute force and against the textbook cases."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from pipelines.checks.ledger import Ledger
from pipelines.checks.replicate_null import holm_rejected, partitions, pooled_null, pooled_p, pseudo_f
from pipelines.checks.replicates import null_group, parted
from support import run_in


def test_parted_reads_each_replicates_step_losses_against_its_own_runs() -> None:
    run = {"step_losses": [2.0, 1.0, 0.5],
           "replicates": [{"step_losses": [2.0, 1.0, 0.5]}, {"step_losses": [2.0, 1.0 + 2e-5, 0.5]},
                          {"step_losses": [2.0, 1.0 + 5e-6, 0.5]}]}
    assert parted(run, 1e-5) == [False, True, False]
    assert parted({"step_losses": [1.0], "replicates": None}, 1e-5) == []


def brute_force_f(points: list[float], labels: list[int]) -> float:
    """PERMANOVA's pseudo-F from its definition: sums of squares about the groups' means and the grand mean."""
    x, g = np.asarray(points), np.asarray(labels)
    groups = sorted(set(labels))
    within = sum(((x[g == k] - x[g == k].mean()) ** 2).sum() for k in groups)
    between = sum((g == k).sum() * (x[g == k].mean() - x.mean()) ** 2 for k in groups)
    return (between / (len(groups) - 1)) / (within / (len(x) - len(groups)))


@pytest.mark.parametrize("seed", range(4))
def test_pseudo_f_from_distances_is_the_one_way_anova_f_for_one_figure(seed: int) -> None:
    rng = np.random.default_rng(seed)
    points, labels = list(rng.standard_normal(12)), [0] * 4 + [1] * 5 + [2] * 3
    x = np.asarray(points)
    squared = (x[:, None] - x[None, :]) ** 2
    assert pseudo_f(squared, np.asarray([labels]), 3)[0] == pytest.approx(brute_force_f(points, labels))


def test_pooled_p_finds_a_moved_framework_and_not_equal_ones() -> None:
    rng = np.random.default_rng(0)
    same = [list(rng.standard_normal(6)) for _ in range(3)]
    moved = [[v + 4.0 for v in same[0]], same[1], same[2]]
    _, p_same = pooled_p(same, lambda a, b: abs(a - b), "same")
    f_moved, p_moved = pooled_p(moved, lambda a, b: abs(a - b), "moved")
    assert p_same > 0.05 and p_moved == pytest.approx(1 / 10000) and f_moved > 10
    assert pooled_p(moved, lambda a, b: abs(a - b), "renamed") == (f_moved, p_moved)  # the points seed it, not names


def brute_force_p(groups: list[list[float]]) -> float:
    """The exact p by its definition: the share of the distinct labellings (group sizes kept) whose pseudo-F is at
    least the observed one, each labelling built from itertools' permutations of the label vector."""
    points = [v for g in groups for v in g]
    labels = [k for k, g in enumerate(groups) for _ in g]
    distinct = sorted(set(itertools.permutations(labels)))
    observed = brute_force_f(points, labels)
    return sum(brute_force_f(points, list(lab)) >= observed * (1 - 1e-12) for lab in distinct) / len(distinct)


@pytest.mark.parametrize("sizes", [(3, 3, 2), (2, 2, 2), (4, 3)])
def test_few_relabellings_give_the_exact_p_whatever_the_test_is_called(sizes: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(sizes))
    groups = [list(rng.standard_normal(k) + 0.7 * i) for i, k in enumerate(sizes)]
    p = pooled_p(groups, lambda a, b: abs(a - b), "one name")[1]
    assert p == pytest.approx(brute_force_p(groups), abs=1e-12)
    assert pooled_p(groups, lambda a, b: abs(a - b), "another name")[1] == p
    null = pooled_null(dict(zip("abc", groups, strict=False)), lambda a, b: abs(a - b), "t")
    assert null["exact"] and null["p_value"] == p and null["p_value"] >= null["floor"]


def test_no_path_gives_a_p_below_the_floor() -> None:
    """Groups with no spread within (every replicate a copy of its run) are the most extreme split there is,
    which the other labellings that also leave none share: p is the floor, not a draw's smallest p."""
    distance = lambda a, b: abs(a - b)  # noqa: E731
    copies = {"torch": [1.0, 1.0, 1.0], "tf": [2.0, 2.0, 2.0], "jax": [3.0, 3.0, 3.0]}
    null = pooled_null(copies, distance, "copies")
    assert null["statistic"] is None and null["p_value"] == pytest.approx(null["floor"]) == pytest.approx(1 / 280)
    assert pooled_p([[1.0, 1.0], [1.0, 1.0]], distance, "equal") == (pytest.approx(np.nan, nan_ok=True), 1.0)
    drawn = pooled_null({"torch": [0.0] * 6, "tf": [1.0] * 6, "jax": [2.0] * 6}, distance, "drawn")
    assert not drawn["exact"] and drawn["p_value"] >= drawn["floor"]


def test_the_pooled_null_records_its_test_and_the_floor_its_groups_allow() -> None:
    assert partitions([6, 6, 6]) == 17_153_136 // 6 and partitions([2, 1]) == 3 and partitions([2, 2]) == 3
    null = pooled_null({"torch": [0.0, 0.1], "tf": [1.0]}, lambda a, b: abs(a - b), "cnn test_loss_rel torch|tf")
    assert null["method"] == "pooled_permutation" and null["groups"] == {"torch": 2, "tf": 1}
    assert null["floor"] == pytest.approx(1 / 3) and null["test"] == "cnn test_loss_rel torch|tf"


def test_a_pooled_group_is_the_run_and_its_parted_replicates() -> None:
    run = {"step_losses": [2.0, 1.0, 0.5], "replicates": [{"step_losses": [2.0, 1.0, 0.5], "id": 1},
                                                         {"step_losses": [2.0, 1.1, 0.5], "id": 2}]}
    assert [r.get("id") for r in null_group(run, 1e-5)] == [None, 2]


def test_a_null_too_thin_to_reject_leaves_the_float32_bound_standing() -> None:
    """A null whose smallest possible p is above alpha could not reject at any step of Holm's: it cannot judge,
    so its figure fails (it is beyond its float32 bound, or no null would judge it). One that could reject at a
    later step is judged by Holm, so a failure elsewhere does not silence it. A test two pairs share counts once
    in Holm's family."""
    ledger = Ledger()
    distance = lambda a, b: abs(a - b)  # noqa: E731
    thin = pooled_null({"torch": [0.0, 0.1], "tf": [1.0, 1.1]}, distance, "thin")  # 3 splits: p at least 1/3
    wide = pooled_null({"torch": [0.0, 0.1, 0.2, 0.3], "tf": [0.05, 0.15, 0.25, 0.35]}, distance, "wide")  # 1/35
    rng = np.random.default_rng(0)
    strong = pooled_null({"torch": list(rng.standard_normal(6)), "tf": list(rng.standard_normal(6) + 5),
                          "jax": list(rng.standard_normal(6))}, distance, "strong")
    for subject, null in (("torch|tf", thin), ("torch|jax", wide), ("torch|tf", strong), ("tf|jax", strong)):
        ledger.add_null("cnn", subject, "test_loss_rel", 0.01, 1e-3, null, "runs part")
    ledger.judge_nulls(0.05)
    thin_check, wide_check, strong_a, strong_b = ledger.checks
    assert thin["floor"] == pytest.approx(1 / 3) and wide["floor"] == pytest.approx(1 / 35)
    assert not thin_check.passed and "the float32 bound stands" in thin_check.detail, thin_check.detail
    assert wide_check.passed and "no larger at alpha 0.05, Holm over 3" in wide_check.detail, wide_check.detail
    assert not strong_a.passed and not strong_b.passed and "different at alpha 0.05" in strong_a.detail
    assert all(c.null["holm_family"] == 3 for c in ledger.checks)
    assert strong_a.null["threshold"] == pytest.approx(0.05 / 3) and wide_check.null["threshold"] == 0.05


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


def test_an_interim_test_is_accepted_above_the_futility_boundary_and_fails_at_or_below_it() -> None:
    """A test of the interim look (every framework's run with its first replicates only) enters Holm's family with
    its interim p. The null_interim stage sends any model with a p at most `futility` on to more replicates, so a
    row still holding the interim look's samples with such a p names the stale decision and fails."""
    ledger = Ledger()
    distance = lambda a, b: abs(a - b)  # noqa: E731
    rng = np.random.default_rng(1)
    alike = pooled_null({fw: list(rng.standard_normal(3)) for fw in ("torch", "tf", "jax")}, distance, "alike")
    apart = pooled_null({"torch": [0.0, 0.1, 0.2], "tf": [5.0, 5.1, 5.2], "jax": [0.05, 0.15, 0.25]}, distance,
                        "apart")
    for null in (alike, apart):
        ledger.add_null("cnn", "torch|tf", "test_loss_rel", 0.01, 1e-3, {**null, "look": "interim"}, "runs part")
    ledger.judge_nulls(0.05, 0.2)
    accepted, stale = ledger.checks
    assert alike["p_value"] > 0.2 and apart["p_value"] <= 0.2
    assert accepted.passed and "accepted at the interim look" in accepted.detail, accepted.detail
    assert not stale.passed and "null_interim.json is older" in stale.detail, stale.detail
