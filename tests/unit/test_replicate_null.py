"""The validate stage's measured null (pipelines/checks/replicate_null.py): the pooled permutation test and Holm's
procedure, against brute force and against the textbook cases.

Holm's procedure is statsmodels' (holm_rejected), which only the validation environment holds: what decides with it
(holm_rejected itself, Ledger.judge_nulls) runs there through the runner, as the validate stage does, and its
decisions come back as JSON to be judged here."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pipelines.checks.replicate_null import floor_thresholds, partitions, pooled_null, pooled_p, pseudo_f
from pipelines.checks.replicates import null_group, parted
from support import run_in


def in_validation(code: str) -> Any:
    """Run `code` in the validation environment; what its last line printed, as JSON."""
    done = run_in("validation", code)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


JUDGE = """
import json
from pipelines.checks.ledger import Ledger
rows, alpha, futility = json.loads({payload!r})
ledger = Ledger()
for row in rows:
    ledger.add_null(*row)
ledger.judge_nulls(alpha, futility)
print(json.dumps([{{"passed": c.passed, "detail": c.detail, "null": c.null}} for c in ledger.checks]))
"""


def judged(rows: list[tuple[Any, ...]], alpha: float, futility: float | None = None) -> list[SimpleNamespace]:
    """Ledger.judge_nulls over these add_null rows, in the validation environment: each check's verdict."""
    checks = in_validation(JUDGE.format(payload=json.dumps([rows, alpha, futility])))
    return [SimpleNamespace(**check) for check in checks]


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
    # Three groups of 4: 34,650 relabellings, drawn; the observed split's 6 equivalents are 1 / 5,775 of them, so a
    # draw that meets none (about one seed in six) would give 1e-4: p stays at the floor.
    fours = [[0.0] * 4, [1.0] * 4, [2.0] * 4]
    drawn_p = [pooled_p(fours, distance, seed=seed)[1] for seed in range(30)]
    assert min(drawn_p) == pytest.approx(1 / 5775) and all(p >= 1 / 5775 for p in drawn_p), drawn_p
    assert pooled_null(dict(zip("abc", fours, strict=True)), distance, "fours")["floor"] == pytest.approx(1 / 5775)


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
    """A null whose floor (the smallest p its groups allow) lies above Holm's threshold at the rank that floor
    would take could not be rejected whatever its figures: it cannot judge, so its figure fails (it is beyond its
    float32 bound), naming that threshold. The same null in a smaller family, where its floor meets the threshold,
    is judged by Holm. A test two pairs share counts once in Holm's family."""
    distance = lambda a, b: abs(a - b)  # noqa: E731
    thin = pooled_null({"torch": [0.0, 0.1], "tf": [1.0, 1.1]}, distance, "thin")  # 3 splits: p at least 1/3
    wide = pooled_null({"torch": [0.0, 0.1, 0.2, 0.3], "tf": [0.05, 0.15, 0.25, 0.35]}, distance, "wide")  # 1/35
    rng = np.random.default_rng(0)
    strong = pooled_null({"torch": list(rng.standard_normal(6)), "tf": list(rng.standard_normal(6) + 5),
                          "jax": list(rng.standard_normal(6))}, distance, "strong")
    assert thin["floor"] == pytest.approx(1 / 3) and wide["floor"] == pytest.approx(1 / 35)
    assert strong["p_value"] < wide["floor"] < 0.05 / 2 * 1.2 and wide["p_value"] > 0.05
    # Family of 3: wide's floor 0.0286 ranks second (strong's p is below it): threshold 0.05 / 2 = 0.025.
    checks = judged([("cnn", subject, "test_loss_rel", 0.01, 1e-3, null, "runs part")
                     for subject, null in (("torch|tf", thin), ("torch|jax", wide), ("torch|tf", strong),
                                           ("tf|jax", strong))], 0.05)
    thin_check, wide_check, strong_a, strong_b = checks
    assert not thin_check.passed and "the float32 bound stands" in thin_check.detail, thin_check.detail
    assert not wide_check.passed and "above Holm's threshold at its rank, 0.025" in wide_check.detail, \
        wide_check.detail
    assert not strong_a.passed and not strong_b.passed and "different at alpha 0.05" in strong_a.detail
    assert all(c.null["holm_family"] == 3 for c in checks)
    assert strong_a.null["threshold"] == pytest.approx(0.05 / 3) and wide_check.null["threshold"] == 0.05
    # Family of 2: its rank's threshold is 0.05, which the floor meets: Holm judges it, and it is no larger.
    wide_alone, _ = judged([("cnn", "torch|jax", "test_loss_rel", 0.01, 1e-3, null, "runs part")
                            for null in (wide, strong)], 0.05)
    assert wide_alone.passed and "no larger at alpha 0.05, Holm over 2" in wide_alone.detail, wide_alone.detail


def test_an_interim_floor_fails_in_a_family_too_large_for_it() -> None:
    """The interim look's groups of 3 allow p down to 1/280 (0.0036): rejectable in a Holm family of 6 (0.05 / 6 =
    0.0083, the default digits run's), not in one of 15 (0.0033), where accepting it would be a pass by
    construction: it fails, naming the threshold."""
    def family(size: int) -> list[SimpleNamespace]:
        nulls = [{"test": f"m{i} test_loss_rel torch|tf|jax", "p_value": 0.5, "floor": 1 / 280 if i == 0 else 1e-4,
                  "look": "interim" if i == 0 else None} for i in range(size)]
        return judged([(f"m{i}", "torch|tf", "test_loss_rel", 0.01, 1e-3, null, "runs part")
                       for i, null in enumerate(nulls)], 0.05, 0.2)
    small, large = family(6)[0], family(15)[0]
    assert small.passed and "accepted at the interim look" in small.detail, small.detail
    assert not large.passed and "Holm family of 15" in large.detail and "0.00333" in large.detail, large.detail


def test_the_floors_threshold_is_holms_at_the_rank_it_would_take() -> None:
    p, floors = [0.001, 0.5, 0.3], [1e-4, 0.0036, 0.01]
    assert floor_thresholds(p, floors, 0.05) == pytest.approx([0.05 / 3, 0.05 / 2, 0.05 / 2])
    assert floor_thresholds([0.5] * 15, [1 / 280] * 15, 0.05)[0] == pytest.approx(0.05 / 15)


INTERIM = """
import json
from pipelines.stages.null_interim import go_on
end = {{"cnn test_loss_rel torch|tf|jax": {{"p_value": 0.5, "floor": 1 / 280}},
        "cnn prediction_disagreement torch|tf|jax": {{"p_value": {p}, "floor": 1 / 280}}}}
print(json.dumps([go_on(end, 0.2, 0.05, family) for family in (6, 14, 15)] + [go_on(end, 0.2, 0.05, 6, True)]))
"""


def test_the_interim_look_sends_on_a_model_whose_floor_validates_family_could_not_reject() -> None:
    """null_interim's decision: a p at or below the futility boundary, a floor above alpha over the family
    validate will judge (Bonferroni's bound, which a floor must meet to be rejectable whatever the others' p), or
    data-parallel tests to come."""
    alike = in_validation(INTERIM.format(p=0.7))
    assert alike[0] == [] and alike[1] == [], alike  # 1/280 at most 0.05 / 14
    assert alike[2] == ["test_loss_rel floor 0.00357 above alpha / 15 = 0.00333",
                        "prediction_disagreement floor 0.00357 above alpha / 15 = 0.00333"], alike
    apart = in_validation(INTERIM.format(p=0.1))
    assert apart[0] == ["prediction_disagreement p 0.1 at most 0.2"], apart
    # A model that trains data-parallel too goes on: its data-parallel tests pool these replicates.
    assert alike[3] == ["it trains data-parallel too (data_parallel.models), whose tests pool these replicates"]


# Holm's procedure: holm_rejected's decisions against brute force, on the textbook cases, on vectors where a wrong
# procedure differs, and on thousands of random ones.
TEXTBOOK = [
    ([0.001, 0.2, 0.01], 0.05, [True, False, True]),  # 0.001 <= 0.05/3, 0.01 <= 0.05/2, 0.2 > 0.05
    ([0.02, 0.03], 0.05, [True, True]),  # 0.02 <= 0.025, then 0.03 <= 0.05
    ([0.03, 0.03], 0.05, [False, False]),  # 0.03 > 0.025 stops at the first
    ([], 0.05, []),
]
# Where a procedure often taken for Holm's decides otherwise: Bonferroni holds every p to alpha / m (keeps 0.04 of
# the first), Hochberg's step-up rejects all below the largest p within its threshold (rejects both of the second).
WHERE_THEY_DIFFER = [([0.01, 0.04], 0.05), ([0.04, 0.04], 0.05)]
PLANTED = ("bonferroni", "simes-hochberg")  # statsmodels' names for them
RANDOM_VECTORS = 6000
# multipletests' Holm branch calls gc.collect() on every call: 20 ms each with statsmodels loaded, minutes over the
# cases below. gc.freeze() leaves what is loaded out of those collections; it decides nothing.
DECIDE = """
import gc, json
from statsmodels.stats.multitest import multipletests
from pipelines.checks.replicate_null import holm_rejected
gc.freeze()
cases = json.load(open({path!r}))
decisions = {{"holm_rejected": [holm_rejected(p, alpha) for p, alpha in cases]}}
for method in {planted!r}:
    decisions[method] = [[bool(r) for r in multipletests(p, alpha=alpha, method=method)[0]] for p, alpha in cases]
print(json.dumps(decisions))
"""


def holm_by_closed_testing(p: list[float], alpha: float) -> list[bool]:
    """Holm's procedure by its definition as a closed test (Holm 1979): a hypothesis is rejected where every
    intersection of hypotheses that holds it is rejected by Bonferroni's test (its smallest p at most alpha over
    its size). Every subset, by brute force; no sorting, no steps."""
    kept = [subset for size in range(1, len(p) + 1) for subset in itertools.combinations(range(len(p)), size)
            if min(p[i] for i in subset) > alpha / size]
    covered = {i for subset in kept for i in subset}
    return [i not in covered for i in range(len(p))]


def random_cases(count: int, seed: int = 0) -> list[tuple[list[float], float]]:
    """Families of 0 to 8 p-values at several alphas: uniform on [0, 1], near the thresholds, exactly at a
    threshold alpha / k or one ulp either side of it, and ties drawn from a few such values."""
    rng = np.random.default_rng(seed)
    cases = []
    for n in range(count):
        m, alpha = int(rng.integers(0, 9)), float(rng.choice([0.05, 0.01, 0.1]))
        thresholds = [alpha / k for k in range(1, m + 1)]
        kind = n % 4
        if kind == 0:
            p = rng.uniform(0, 1, m).tolist()
        elif kind == 1:
            p = rng.uniform(0, 2.5 * alpha, m).tolist()
        elif kind == 2:
            p = [float(np.nextafter(t, [0.0, 1.0][int(rng.integers(2))])) if rng.random() < 0.3 else t
                 for t in rng.choice(thresholds, m).tolist()] if m else []
        else:
            pool = [*rng.choice(thresholds, 2).tolist(), *rng.uniform(0, 2 * alpha, 2).tolist()] if m else []
            p = rng.choice(pool, m).tolist() if m else []
        cases.append((p, alpha))
    return cases


def disagreements(decisions: list[list[bool]], cases: list[tuple[list[float], float]]
                  ) -> list[tuple[list[float], float]]:
    """The cases where `decisions` differ from Holm's by its definition."""
    return [(p, alpha) for (p, alpha), got in zip(cases, decisions, strict=True)
            if got != holm_by_closed_testing(p, alpha)]


@pytest.fixture(scope="module")
def holm_decisions(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[tuple[list[float], float]], dict]:
    """Every case (the textbook's, where they differ, the random ones) and the decisions of holm_rejected and of
    the planted procedures on each, made in the validation environment in one run."""
    cases = [(p, alpha) for p, alpha, _ in TEXTBOOK] + WHERE_THEY_DIFFER + random_cases(RANDOM_VECTORS)
    path = Path(tmp_path_factory.mktemp("holm"), "cases.json")
    path.write_text(json.dumps(cases))  # floats as repr: the same bits there
    return cases, in_validation(DECIDE.format(path=str(path), planted=PLANTED))


def test_holm_rejects_step_down(holm_decisions: tuple[list, dict]) -> None:
    _, decisions = holm_decisions
    assert decisions["holm_rejected"][:len(TEXTBOOK)] == [expected for _, _, expected in TEXTBOOK]
    assert [holm_by_closed_testing(p, alpha) for p, alpha, _ in TEXTBOOK] == [e for _, _, e in TEXTBOOK]


def test_holm_is_holm_by_its_definition_on_thousands_of_families(holm_decisions: tuple[list, dict]) -> None:
    """statsmodels' Holm (holm_rejected) decides as the closed test does on every case, ties and p-values exactly
    at a threshold among them (p at its threshold is rejected; one ulp above is not)."""
    cases, decisions = holm_decisions
    assert disagreements(decisions["holm_rejected"], cases) == []
    at_threshold = [(p, alpha) for p, alpha in cases
                    if any(v == alpha / k for v in p for k in range(1, len(p) + 1))]
    tied = [(p, alpha) for p, alpha in cases if len(set(p)) < len(p)]
    rejected_at = [(p, alpha) for p, alpha in at_threshold
                   if any(r and any(v == alpha / k for k in range(1, len(p) + 1))
                          for v, r in zip(p, holm_by_closed_testing(p, alpha), strict=True))]
    assert len(cases) > RANDOM_VECTORS and len(at_threshold) > 1000 and len(tied) > 1000, (len(at_threshold), len(tied))
    assert len(rejected_at) > 100, len(rejected_at)


@pytest.mark.parametrize("method", PLANTED)
def test_the_comparison_fails_a_planted_wrong_procedure(holm_decisions: tuple[list, dict], method: str) -> None:
    """The same comparison, given Bonferroni's or Hochberg's decisions for holm_rejected's, fails, and on the
    vector where that procedure and Holm's are known to differ."""
    cases, decisions = holm_decisions
    wrong = disagreements(decisions[method], cases)
    assert WHERE_THEY_DIFFER[PLANTED.index(method)] in wrong
    assert len(wrong) > 10, len(wrong)


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
    distance = lambda a, b: abs(a - b)  # noqa: E731
    rng = np.random.default_rng(1)
    alike = pooled_null({fw: list(rng.standard_normal(3)) for fw in ("torch", "tf", "jax")}, distance, "alike")
    apart = pooled_null({"torch": [0.0, 0.1, 0.2], "tf": [5.0, 5.1, 5.2], "jax": [0.05, 0.15, 0.25]}, distance,
                        "apart")
    accepted, stale = judged([("cnn", "torch|tf", "test_loss_rel", 0.01, 1e-3, {**null, "look": "interim"},
                               "runs part") for null in (alike, apart)], 0.05, 0.2)
    assert alike["p_value"] > 0.2 and apart["p_value"] <= 0.2
    assert accepted.passed and "accepted at the interim look" in accepted.detail, accepted.detail
    assert not stale.passed and "null_interim.json is older" in stale.detail, stale.detail
