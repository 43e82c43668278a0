"""The TPU subject (`jax@tpu`, tooling/devices/tpu_train.py's run folders) judged against every CPU run present, by
the rules every pair of frameworks is judged by, with the bounds of tooling/devices/tpu_bounds.py in place of the
CPU's float32 ones.

Per model: the run's files against export.json's sha256 (and tpu.json's record of what stayed on the TPU host);
model.onnx under ONNX Runtime on the CPU against the TPU's own logits, ONNX Runtime's test accuracy against the
TPU's, the native reloads, the accuracy floor (on the median with the TPU's replicates); then against each CPU
framework (training_parity, lockstep_checkpoints, running_statistics): strict while the runs are in lockstep,
after parting the measured null of both sides' end-of-training replicates, Holm over the run. The TPU's own are
trained on the TPU beside its run (in its run folder) for every model of params.yaml's replicates.models; a CPU
run's are the replicates stages' (artifacts/replicates/<framework>/<model>/, then artifacts/replicates_more/), for
the models artifacts/null_plan.json names (none where it is missing), then those tooling/devices/tpu_null.py
trained on where the TPU run's tests need more (artifacts/jax@tpu-null/). Each is tied to its run by the digest of
the run's step losses. The lockstep checkpoints are strict at the TPU bounds: the TPU's lockstep replicates' states
(210 MB for attention) stay on the host, so no null judges there.

The bounds are always those of float32 products (precision `highest`): that is what a port claims. A run that
multiplied at another precision (tpu.json) fails where its error passes them, and every failing check names the
matrix precision as the likely cause, with the product error measured at each precision.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.exports import quality_floor
from pipelines.checks.inference_mode import inference_mode
from pipelines.checks.ledger import Check, CheckError, Ledger
from pipelines.checks.lockstep import lockstep_checkpoints
from pipelines.checks.parity import running_statistics, training_parity
from pipelines.checks.replicates import all_replicates, read_interim, read_plan, read_replicates
from pipelines.checks.sessions import open_session, run_onnx
from rosetta_common.data import Dataset, load_for
from rosetta_common.io import read_json, sha256
from rosetta_common.metrics import accuracy, max_abs_diff, softmax_cross_entropy
from rosetta_common.onnx_conventions import violations
from rosetta_common.spec import Spec, load_spec
from rosetta_common.training import plan
from tooling.devices.tpu_bounds import CLAIMED, subject_name, tolerances_for
from tooling.devices.tpu_null import null_dir


def intact(ledger: Ledger, arch: str, subject: str, record: dict[str, Any]) -> dict[str, Any] | None:
    """export.json, with every file it hashed there with that sha256, except what tpu.json says stayed on the
    host (absent) or was rewritten (its new sha256); None and a failed check naming the file otherwise."""
    run = paths.run_dir(arch, subject)
    slimmed = record.get("slimmed", {}).get(arch, {"left_on_host": {}, "rewritten": {}})
    problems = []
    try:
        export = read_json(run / "export.json")
        for rel, digest in sorted(export["sha256"].items()):
            path = run / rel
            if rel in slimmed["left_on_host"]:
                if path.exists():
                    problems.append(f"{path}: tpu.json says it stayed on the host")
                continue
            expected = slimmed["rewritten"].get(rel, {}).get("sha256", digest)
            if not path.is_file():
                problems.append(f"{path}: missing (export.json recorded it)")
            elif sha256(path) != expected:
                problems.append(f"{path}: altered since export (sha256 differs)")
    except (OSError, ValueError, KeyError, TypeError) as error:
        problems.append(f"{run / 'export.json'}: unreadable ({type(error).__name__}: {error})")
        export = {}
    ledger.add(arch, subject, names.ARTIFACTS_INTACT, float(len(problems)), 0.0, not problems, "; ".join(problems[:3]))
    return None if problems else export


def onnx_scale_bound(tol: Any, logits: np.ndarray) -> float:
    return tol.onnx_vs_native_abs + tol.onnx_vs_native_rel * float(np.abs(logits).max())


def check_exports(spec: Spec, ledger: Ledger, arch: str, subject: str, data: Dataset, batch: np.ndarray,
                  export: dict[str, Any]) -> dict[str, Any]:
    """The TPU run's model.onnx under ONNX Runtime on the CPU against the TPU's own logits, its test accuracy, the
    native reloads (each against the TPU's logits, run on the TPU); returns the test figures."""
    tol = spec.tolerances
    with np.load(paths.native_outputs(arch, subject), allow_pickle=False) as f:
        native = {key: f[key] for key in f.files}
    expected = native["validation_logits"]
    test_logits = native["test_logits"]
    figures = {"test_accuracy": accuracy(test_logits, data.test_labels),
               "test_loss": softmax_cross_entropy(test_logits, data.test_labels),
               "test_predictions": np.argmax(test_logits, axis=1)}
    path = paths.onnx_model(arch, subject)
    try:
        session = open_session(path)
    except CheckError as error:
        ledger.add(arch, subject, names.onnx_checker("model"), None, 0.0, False, str(error))
        return figures
    problems = violations(onnx.load(str(path), load_external_data=False), "jax")
    ledger.add(arch, subject, names.onnx_checker("model"), float(len(problems)), 0.0, not problems,
               "; ".join(problems))
    ledger.add(arch, subject, names.ONNX_VS_NATIVE, max_abs_diff(run_onnx(session, batch), expected),
               onnx_scale_bound(tol, expected),
               detail=f"ONNX Runtime on the CPU against the TPU's logits; max |logit| {np.abs(expected).max():.3g}")
    inference_mode(ledger, tol, arch, subject, names.inference_mode("onnx_model"),
                   lambda x: run_onnx(session, x), batch)
    onnx_acc = accuracy(run_onnx(session, data.test_inputs), data.test_labels)
    ledger.add(arch, subject, names.ONNX_TEST_ACCURACY_EQUALS_NATIVE, abs(onnx_acc - figures["test_accuracy"]), 0.0,
               onnx_acc == figures["test_accuracy"], f"onnx {onnx_acc:.4f}, TPU {figures['test_accuracy']:.4f}")
    scale = float(np.abs(expected).max())
    for fmt, err in export["native_roundtrip_max_abs"].items():
        bound = (onnx_scale_bound(tol, expected) if fmt == "jax_export"
                 else tol.native_roundtrip_abs + tol.native_roundtrip_rel * scale)
        ledger.add(arch, subject, names.native_roundtrip(fmt), err, bound, detail="reloaded and run on the TPU")
    return figures


def replicates_of(ledger: Ledger, arch: str, fw: str, folder: Path | None, at_most: int = 0, more: bool = False
                  ) -> list[dict[str, Any]] | None:
    """The end-of-training replicates in `folder` (None: the replicates stages' of a CPU run, and the
    replicates_more stage's where `more`), checked against the step losses of run `fw` (its train_log.json) by
    read_replicates; None, with REPLICATES_READABLE failed, where that log is unreadable."""
    log = paths.train_log(arch, fw)
    try:
        losses = read_json(log)["step_losses"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        ledger.add(arch, fw, names.REPLICATES_READABLE, None, None, False, f"{log}: {type(error).__name__}: {error}")
        return None
    if folder is None:
        return all_replicates(ledger, arch, fw, losses, more, at_most)
    return read_replicates(ledger, arch, fw, folder, losses)


def planned_models() -> tuple[list[str], list[str]]:
    """The models whose CPU runs have end-of-training replicates (those artifacts/null_plan.json names) and those
    of them with more after the interim look (artifacts/null_interim.json); none where a file is missing."""
    return (read_plan() if paths.NULL_PLAN.exists() else [],
            read_interim() if paths.NULL_INTERIM.exists() else [])


def subject_replicates(spec: Spec, ledger: Ledger, arch: str, subject: str) -> list[dict[str, Any]] | None:
    """The TPU run's end-of-training replicates: tooling/devices/tpu_train.py trains them in its run folder for every
    model of replicates.models (a TPU host has no CPU runs, so no null plan)."""
    if arch not in spec.replicates.models:
        return None
    return replicates_of(ledger, arch, subject, paths.run_dir(arch, subject))


def cpu_run(arch: str, fw: str, data: Dataset, planned: tuple[list[str], list[str]], at_most: int
            ) -> dict[str, Any] | None:
    """A CPU run's test figures and replicates (the replicates stages', for a model `planned` names: the null
    plan's, and the interim look's more), as validate reads them (its own checks are validate's)."""
    try:
        with np.load(paths.native_outputs(arch, fw), allow_pickle=False) as f:
            logits = f["test_logits"]
    except (OSError, KeyError, ValueError):
        return None
    reps = replicates_of(Ledger(), arch, fw, None, at_most, arch in planned[1]) if arch in planned[0] else None
    reps = with_tpu_null(arch, fw, reps)
    return {"test_accuracy": accuracy(logits, data.test_labels),
            "test_loss": softmax_cross_entropy(logits, data.test_labels),
            "test_predictions": np.argmax(logits, axis=1), "replicates": reps}


def with_tpu_null(arch: str, fw: str, reps: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A CPU run's replicates, then those tooling/devices/tpu_null.py trained on for a TPU run's judgement
    (artifacts/jax@tpu-null/<framework>/<model>/, numbered on from the replicates stages'); `reps` as it was where
    there are none. Unreadable ones, or ones that do not follow on without a gap, stop the judgement (one line)."""
    folder = null_dir(fw) / arch
    if not (folder / paths.REPLICATES_RECORD).exists() or not read_json(folder / paths.REPLICATES_RECORD).get(
            "replicates", True):  # none there, or none trained (the stages had trained replicates.at_most)
        return reps
    rest = replicates_of(Ledger(), arch, fw, folder)
    if rest is None:
        raise SystemExit(f"error: {folder}: unreadable, or trained from another run: train it again "
                         "(tooling/devices/tpu_null.py)")
    numbers = [r["replicate"] for r in (reps or []) + rest]
    if numbers != list(range(1, len(numbers) + 1)):
        raise SystemExit(f"error: {folder}: replicates {numbers}: they must follow on from the replicates stages' "
                         "without a gap: train it again (tooling/devices/tpu_null.py)")
    return (reps or []) + rest


def step_seconds(record: Path, steps_per_epoch: int) -> float | None:
    """The median training step's seconds of one run (its epochs after the first, which compiles)."""
    try:
        epochs = read_json(record)["train"]["epoch_seconds"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    steady = epochs[1:] or epochs
    return statistics.median(steady) / steps_per_epoch


def precision_cause(record: dict[str, Any], op_accuracy: dict[str, Any] | None) -> str:
    """What a failing check of this run says about the matrix precision."""
    ran = record.get("precision", CLAIMED)
    if ran == CLAIMED:
        return "the run multiplied at precision highest (float32 products): not the matrix precision"
    products = ""
    if op_accuracy:
        matmul = op_accuracy["ops"]["matmul"]
        products = (f" (matrix products measured on the device: {matmul[ran]['rel_norm']:.1e} relative error "
                    f"against {matmul[CLAIMED]['rel_norm']:.1e} at highest)")
    return (f"likely cause: the matrix precision: the run multiplied at jax_default_matmul_precision="
            f"{record.get('jax_default_matmul_precision')!s} (JAX's default on a TPU: float32 products as bfloat16 "
            f"passes){products}; the bounds are float32's: set jax.config.update('jax_default_matmul_precision', "
            "'highest')")


def involves(check: Check, subject: str) -> bool:
    return check.subject == subject or subject in check.subject.split("|")


def judge(bounds: dict[str, Any], precision: str, op_accuracy: dict[str, Any] | None = None,
          cpu_frameworks: list[str] | None = None) -> dict[str, Any]:
    """The TPU run at `precision` (artifacts/<subject_name(precision)>/) against every CPU run in artifacts/;
    a JSON-ready result: every check, the pair figures, and per model the summary the report prints."""
    spec = load_spec(paths.PARAMS)
    subject = subject_name(precision)
    record = read_json(paths.framework_dir(subject) / "tpu.json")
    cpu = [fw for fw in (cpu_frameworks or spec.frameworks) if paths.framework_dir(fw).is_dir()]
    claimed = bounds["precisions"][CLAIMED]
    ledger = Ledger()
    planned = planned_models()
    cache: dict[str, Dataset] = {}
    parity: list[dict[str, Any]] = []
    lockstep: list[dict[str, Any]] = []
    models: dict[str, dict[str, Any]] = {}
    for arch in spec.models:
        data = load_for(arch, paths.PREPARED, cache)
        batch = data.validation_batch(spec.export.validation_batch_size)
        config = data.model_config(spec, arch)
        mspec = spec.model_copy(update={"tolerances": tolerances_for(spec.tolerances, claimed[arch])})
        export = intact(ledger, arch, subject, record)
        if export is None:
            continue
        tpu = check_exports(mspec, ledger, arch, subject, data, batch, export)
        tpu["replicates"] = subject_replicates(spec, ledger, arch, subject)
        quality_floor(spec, ledger, arch, subject, tpu)
        no_states = mspec.model_copy(update={"replicates": spec.replicates.model_copy(update={"count": 0})})
        for fw in cpu:
            other = cpu_run(arch, fw, data, planned, spec.replicates.at_most)
            if other is None:
                continue
            runs = {fw: other, subject: dict(tpu)}
            figures, trained = training_parity(mspec, ledger, arch, runs, data, config)
            lockstep += lockstep_checkpoints(no_states, ledger, arch, runs, config, len(batch))
            running_statistics(mspec, ledger, arch, trained, runs, {f["frameworks"]: f["parting_step"]
                                                                    for f in figures})
            parity += figures
        steps = plan(spec, arch, len(data.train_labels)).steps_per_epoch
        models[arch] = {
            "bounds": {k: claimed[arch][k] for k in ("step1_loss_rel", "lockstep_loss_rel", "lockstep_state_rel")},
            "test_accuracy": tpu["test_accuracy"],
            "step_seconds": {subject: step_seconds(paths.framework_dir(subject) / "measurements" / arch / "jax.json",
                                                   steps),
                             **{fw: step_seconds(Path("measurements") / arch / f"{fw}.json", steps) for fw in cpu}},
        }
    ledger.judge_nulls(spec.tolerances.null_alpha)
    cause = precision_cause(record, op_accuracy)
    ledger.checks = [check if check.passed or not involves(check, subject) else
                     Check(check.name, check.model, check.subject, check.value, check.tolerance, False,
                           f"{check.detail}; {cause}".lstrip("; "), check.null) for check in ledger.checks]
    for arch, summary in models.items():
        summary.update(model_summary(ledger, arch, [f for f in parity if f["model"] == arch]))
    failures = ledger.failures()
    return {"subject": subject, "precision": precision, "run": record, "cpu_frameworks": cpu,
            "judged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "bounds": {"op_accuracy": bounds["op_accuracy"], "method": bounds["method"], "precision": CLAIMED},
            "passed": not failures, "cause": None if not failures else cause,
            "summary": {"checks": len(ledger.checks), "failed": len(failures)},
            "models": models, "training_parity": [{k: v for k, v in f.items()} for f in parity],
            "lockstep": lockstep, "checks": ledger.rows()}


def model_summary(ledger: Ledger, arch: str, figures: list[dict[str, Any]]) -> dict[str, Any]:
    """One model's verdict, its parting step against each CPU run, and its closest margin: the strict check
    (a float32 or TPU bound, not a null) whose value came nearest its bound, as value over bound."""
    checks = [c for c in ledger.checks if c.model == arch]
    strict = [c for c in checks if c.null is None and c.value is not None and c.tolerance
              and c.name != names.MIN_TEST_ACCURACY]
    closest = max(strict, key=lambda c: c.value / c.tolerance, default=None)
    return {"passed": all(c.passed for c in checks),
            "failed": sorted({c.name for c in checks if not c.passed}),
            "parting_step": {f["frameworks"]: f["parting_step"] for f in figures},
            "step1_loss_rel": {f["frameworks"]: f["step1_loss_rel"] for f in figures},
            "lockstep_loss_max_rel": {f["frameworks"]: f["lockstep_loss_max_rel"] for f in figures},
            "closest": None if closest is None else {
                "check": closest.name, "subject": closest.subject, "value": closest.value,
                "tolerance": closest.tolerance, "ratio": closest.value / closest.tolerance}}


# The verdicts judge_nulls appends to a null-judged row's detail (pipelines/checks/ledger.py), stripped before the
# row is decided again.
VERDICTS = ("; no larger at alpha", "; different at alpha", "; too few replicates parted", "; p ")


def rejudge(result: dict[str, Any], alpha: float) -> dict[str, Any]:
    """A recorded result's null-judged rows decided again by the current Ledger.judge_nulls (Holm over the same
    tests, the floor rule as it stands), every other row as recorded: which verdicts the rule changes, without a
    TPU. Returns the new counts and each row whose verdict moved (model, framework, check, then and now, why)."""
    ledger = Ledger()
    for row in result["checks"]:
        null = row.get("null")
        detail = row.get("detail", "")
        if null is None:
            ledger.checks.append(Check(row["check"], row["model"], row["framework"], row["value"],
                                       row["tolerance"], row["passed"], detail))
            continue
        cut = min((i for i in (detail.find(v) for v in VERDICTS) if i >= 0), default=len(detail))
        ledger.add_null(row["model"], row["framework"], row["check"], row["value"], row["tolerance"],
                        {k: v for k, v in null.items() if k not in ("threshold", "holm_family")}, detail[:cut])
    ledger.judge_nulls(alpha)
    moved = [{"model": c.model, "framework": c.subject, "check": c.name, "was": row["passed"], "now": c.passed,
              "why": c.detail[c.detail.rfind("; ") + 2:]}
             for c, row in zip(ledger.checks, result["checks"], strict=True) if c.passed != row["passed"]]
    return {"checks": len(ledger.checks), "passed": sum(c.passed for c in ledger.checks), "moved": moved}
