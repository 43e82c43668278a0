"""The ledger of the validate stage: one record per check, and every check's name, which the report imports
instead of spelling them again.

A record's `subject` is what was judged: a framework ("torch"), a pair of them ("torch|tf"), a data-parallel run
("torch-dp") or a pair of runs ("torch-dp|torch"). In reports/validation.json it is written under `framework`,
the name the report and `dvc metrics show` have always read it by."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pipelines.checks.replicate_null import floor_thresholds, holm_rejected
from rosetta_common.errors import RosettaError

# One framework's run (pipelines/checks/integrity.py, exports.py, inference_mode.py).
ARTIFACTS_INTACT = "artifacts_intact"
ARTIFACTS_READABLE = "artifacts_readable"
ONNX_VS_NATIVE = "onnx_vs_native"
INIT_ONNX_VS_NATIVE = "init_onnx_vs_native"
ONNX_TEST_ACCURACY_EQUALS_NATIVE = "onnx_test_accuracy_equals_native"
MIN_TEST_ACCURACY = "min_test_accuracy"
ONNX_CHECKER_PREFIX = "onnx_checker_"  # + "model" / "init"
NATIVE_ROUNDTRIP_PREFIX = "native_roundtrip_"  # + the native format
INFERENCE_MODE_PREFIX = "inference_mode_"  # + "onnx_model", "onnx_init", "native_<format>"
# One model's forward pass (pipelines/checks/forward.py).
INIT_ONNX_VS_REFERENCE = "init_onnx_vs_reference"
TRAINED_WEIGHTS_VS_NATIVE = "trained_weights_vs_native"  # the trained canonical file, run by the reference
FORWARD_PARITY_INIT_ONNX = "forward_parity_init_onnx"
# One framework's per-layer taps of the init forward against the float64 reference (pipelines/checks/taps.py).
INIT_TAPS_VS_REFERENCE = "init_taps_vs_reference"
TAPS_READABLE = "taps_readable"
# Pairs of frameworks' trained runs (parity.py).
TRAINING_RECORD_READABLE = "training_record_readable"
TRAIN_STEP1_LOSS_REL = "train_step1_loss_rel"
TRAIN_LOCKSTEP_LOSS_REL = "train_lockstep_loss_rel"
TEST_LOSS_REL = "test_loss_rel"
TEST_ACCURACY_POINTS = "test_accuracy_points"
PREDICTION_DISAGREEMENT = "prediction_disagreement"
# Pairs' whole state at the lockstep checkpoints (pipelines/checks/lockstep.py), every model, float32 bound.
CHECKPOINTS_READABLE = "checkpoints_readable"
LOCKSTEP_WEIGHTS_REL = "lockstep_weights_rel"
LOCKSTEP_RUNNING_STATS_REL = "lockstep_running_stats_rel"
LOCKSTEP_LOGITS_REL = "lockstep_logits_rel"
REPLICATES_READABLE = "replicates_readable"  # the replicates of a run (pipelines/checks/replicates.py)
RUNNING_STATISTICS = ("running_mean", "running_var")  # BatchNorm's, each judged as "<statistic>_rel"
# The end-of-training checks of a pair of frameworks' trained models: a mistake that changes no init forward and
# no training loss (BatchNorm's momentum convention moves only the running statistics) shows first here, and in
# the pair's trained taps (pipelines/checks/taps.py where_it_parts).
END_OF_TRAINING_PAIR = (TEST_LOSS_REL, TEST_ACCURACY_POINTS, PREDICTION_DISAGREEMENT,
                        *(f"{statistic}_rel" for statistic in RUNNING_STATISTICS))  # statistic_check's names
# The checks whose failure names, in its detail, the first tap over its tolerance (pipelines/checks/taps.py
# localize), and which the report links to its per-layer taps figure.
TAP_LOCALIZED = (INIT_ONNX_VS_REFERENCE, FORWARD_PARITY_INIT_ONNX, ONNX_VS_NATIVE, INIT_ONNX_VS_NATIVE,
                 TRAINED_WEIGHTS_VS_NATIVE, TRAIN_STEP1_LOSS_REL, TRAIN_LOCKSTEP_LOSS_REL, INIT_TAPS_VS_REFERENCE,
                 *END_OF_TRAINING_PAIR)
# Data-parallel runs (pipelines/checks/data_parallel.py).
DP_RUN_READABLE = "dp_run_readable"
DP_STEP1_LOSS_REL = "dp_step1_loss_rel"
DP_LOCKSTEP_LOSS_REL = "dp_lockstep_loss_rel"
DP_TEST_LOSS_REL = "dp_test_loss_rel"
DP_TEST_ACCURACY_POINTS = "dp_test_accuracy_points"
# The model servers' answers (pipelines/checks/serving.py), each logits check per protocol: "<check>_<protocol>".
SERVED_READABLE = "served_readable"
SERVED_NATIVE_VS_IN_PROCESS = "served_native_vs_in_process"
SERVED_ONNX_VS_IN_PROCESS = "served_onnx_vs_in_process"
SERVED_ONNX_VS_NATIVE = "served_onnx_vs_native"
SERVED_METADATA_IDENTICAL = "served_metadata_identical"
# ... and each server's <model>-init, the model of the shared canonical init weights (the same bits everywhere).
SERVED_INIT_VS_IN_PROCESS = "served_init_vs_in_process"  # a framework server, bit for bit, per protocol
SERVED_ONNX_INIT_VS_IN_PROCESS = "served_onnx_init_vs_in_process"  # the ONNX server's init.onnx, per protocol
SERVED_INIT_VS_REFERENCE = "served_init_vs_reference"  # a framework server vs the float64 reference, per protocol
SERVED_ONNX_INIT_VS_REFERENCE = "served_onnx_init_vs_reference"  # the ONNX server vs the reference, per protocol
SERVED_INIT_ACROSS_SERVERS = "served_init_across_servers"  # a pair of servers ("torch|onnx"), the worst protocol
SERVED_INIT_ARGMAX_ACROSS_SERVERS = "served_init_argmax_across_servers"  # every server and protocol at once


@dataclass(frozen=True)
class Figure:
    """One figure of a pair of trained runs (pipelines/checks/parity.py computes them all)."""

    key: str  # in validation.json's pair figures
    label: str  # as the report prints it
    check: str | None  # the check that judges it for a pair of frameworks (None: a figure only)
    dp_check: str | None  # ... for a pair with a data-parallel run
    tolerance: str | None  # its field of params.yaml's tolerances (TolerancesSpec)
    # An end-of-training figure: for a pair of frameworks, strict while the runs are in lockstep, judged against
    # the replicates' null after they part (pipelines/checks/replicates.py). False: strict for every pair.
    end_of_training: bool = False


# The report's training-parity and data-parallel tables are these rows, in this order.
FIGURES = (
    Figure("step1_loss_rel", "step-1 loss, rel", TRAIN_STEP1_LOSS_REL, DP_STEP1_LOSS_REL, "step1_loss_rel"),
    Figure("lockstep_loss_max_rel", "lockstep window losses, max rel", TRAIN_LOCKSTEP_LOSS_REL,
           DP_LOCKSTEP_LOSS_REL, "lockstep_loss_rel"),
    Figure("parting_step", "step where the runs part", None, None, None),
    Figure("test_loss_rel", "test loss, rel", TEST_LOSS_REL, DP_TEST_LOSS_REL, "test_loss_rel", True),
    Figure("test_accuracy_diff_points", "test accuracy, points", TEST_ACCURACY_POINTS, DP_TEST_ACCURACY_POINTS,
           "test_accuracy_points", True),
    # Its float32 bound is none at all (the same class for every test image); judged only after parting.
    Figure("prediction_disagreement", "test predictions that differ", PREDICTION_DISAGREEMENT, None, None, True),
    Figure("first_epoch_loss_max_rel", "first-epoch losses, max rel", None, None, None),
    Figure("all_steps_loss_max_rel", "all step losses, max rel", None, None, None),
    Figure("final_weights_max_abs", "final weights, max abs", None, None, None),
)


def onnx_checker(kind: str) -> str:
    return f"{ONNX_CHECKER_PREFIX}{kind}"


def native_roundtrip(fmt: str) -> str:
    return f"{NATIVE_ROUNDTRIP_PREFIX}{fmt}"


def inference_mode(export: str) -> str:
    return f"{INFERENCE_MODE_PREFIX}{export}"


def statistic_check(statistic: str) -> str:
    return f"{statistic}_rel"


def served(check: str, protocol: str) -> str:
    return f"{check}_{protocol}"


class CheckError(RosettaError):
    """An input a check needs is missing or malformed (named in the message): the check fails with it."""


@dataclass(frozen=True)
class Check:
    """One judged figure. `value` is the measured figure (an error, a count of problems, an accuracy), `tolerance`
    its bound (a minimum for min_test_accuracy); either is None where the check could not be computed."""

    name: str
    model: str
    subject: str
    value: float | None
    tolerance: float | None
    passed: bool
    detail: str = ""
    # Judged against the replicates' null (replicate_null.pooled_null): its test, statistic, p-value, floor and
    # groups; judge_nulls adds Holm's threshold and family.
    null: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        """As reports/validation.json stores it (`detail` and `null` only where there are some)."""
        row: dict[str, Any] = {"model": self.model, "framework": self.subject, "check": self.name,
                               "value": self.value, "tolerance": self.tolerance, "passed": self.passed}
        if self.detail:
            row["detail"] = self.detail
        if self.null is not None:
            row["null"] = self.null
        return row


class Ledger:
    """Every check of one validate run, in the order they were made."""

    def __init__(self) -> None:
        self.checks: list[Check] = []

    def add(self, model: str, subject: str, name: str, value: float | None, tolerance: float | None,
            passed: bool | None = None, detail: str = "") -> None:
        """Record a check; without `passed`, it passes where value <= tolerance (an error within its bound)."""
        if passed is None:
            passed = value is not None and tolerance is not None and value <= tolerance
        self.checks.append(Check(name, model, subject, value, tolerance, bool(passed), detail))

    def add_null(self, model: str, subject: str, name: str, value: float, tolerance: float | None,
                 null: dict[str, Any], detail: str) -> None:
        """A figure beyond its float32 bound after the runs parted, judged against the replicates' null
        (replicate_null): whether it passes is decided by `judge_nulls`, over every such check of the run at once
        (Holm); until then it stands failed."""
        self.checks.append(Check(name, model, subject, value, tolerance, False, detail, null))

    def judge_nulls(self, alpha: float, futility: float | None = None) -> None:
        """Decide every null-judged check together: Holm's step-down at `alpha` over the run's tests (a test
        judged several pairs, replicate_null.pooled_null, counts once). A test whose floor (the smallest p its
        groups allow) lies above Holm's threshold at the rank that floor would take (replicate_null.floor_thresholds)
        could not be rejected whatever its figures: too few replicates parted for a family this large, so it cannot
        judge, its figure stays held to the float32 bound it exceeded, and it fails, naming that threshold. A test
        of the interim look (its null's `look`) enters with its interim p, which the look found above `futility`;
        one at or below it should have trained more replicates, and fails. Each row's "null" gets its test's Holm
        threshold and the family's size."""
        at = [i for i, check in enumerate(self.checks) if check.null is not None]
        tests: dict[str, float] = {}
        floors: dict[str, float] = {}
        for i in at:
            tests.setdefault(self.checks[i].null["test"], self.checks[i].null["p_value"])
            floors.setdefault(self.checks[i].null["test"], self.checks[i].null["floor"])
        keys = list(tests)
        rejected = dict(zip(keys, holm_rejected([tests[k] for k in keys], alpha), strict=True))
        at_floor = dict(zip(keys, floor_thresholds([tests[k] for k in keys], [floors[k] for k in keys], alpha),
                            strict=True))
        order = sorted(keys, key=lambda k: tests[k])
        threshold = {k: alpha / (len(keys) - step) for step, k in enumerate(order)}
        for i in at:
            check = self.checks[i]
            null = check.null
            different = rejected[null["test"]]
            if null["floor"] > at_floor[null["test"]]:
                verdict = (f"too few replicates parted from their runs for a Holm family of {len(keys)}: the smallest "
                           f"p possible, {null['floor']:.3g}, is above Holm's threshold at its rank, "
                           f"{at_floor[null['test']]:.3g} (alpha {alpha}), so the null cannot judge and the float32 "
                           "bound stands")
                different = True
            elif null.get("look") == "interim" and futility is not None and null["p_value"] <= futility:
                verdict = (f"p {null['p_value']:.3g} at the interim look is at most the futility boundary "
                           f"{futility}, yet no more replicates were trained: artifacts/null_interim.json is older "
                           "than the replicates")
                different = True
            else:
                verdict = f"{'different' if different else 'no larger'} at alpha {alpha}, Holm over {len(keys)}"
                if null.get("look") == "interim":
                    verdict += f"; accepted at the interim look (p above the futility boundary {futility})"
            self.checks[i] = replace(check, passed=not different,
                                     null={**null, "threshold": threshold[null["test"]], "holm_family": len(keys)},
                                     detail=f"{check.detail}; {verdict}")

    def rows(self) -> list[dict[str, Any]]:
        return [check.row() for check in self.checks]

    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]
