"""One framework's exports of one model: onnx.checker and the ONNX conventions, ONNX Runtime against the
framework's own logits (trained and init), ONNX Runtime's test accuracy against the native one, every native
format's reload, every export's inference mode, and the model's accuracy floor."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.inference_mode import inference_mode, replay
from pipelines.checks.ledger import CheckError, Ledger
from pipelines.checks.sessions import open_session, run_onnx
from rosetta_common.metrics import accuracy, max_abs_diff, softmax_cross_entropy
from rosetta_common.onnx_conventions import violations
from rosetta_common.spec import Spec, TolerancesSpec

# Native formats whose reload compiles the program anew (the rest reload the same program).
RECOMPILED_ON_RELOAD = frozenset({"jax_export"})


def onnx_tolerance(tol: TolerancesSpec, expected: np.ndarray) -> float:
    """allclose's bound at the largest logit: abs + rel * max|expected|."""
    return tol.onnx_vs_native_abs + tol.onnx_vs_native_rel * float(np.abs(expected).max())


def check_framework(spec: Spec, ledger: Ledger, arch: str, fw: str, data: Any, batch: np.ndarray,
                    record: dict[str, Any]) -> dict[str, Any]:
    """Checks of one exported framework model; returns its ONNX sessions and the figures the pairwise checks use,
    all computed here from the artifacts."""
    tol = spec.tolerances
    with np.load(paths.native_outputs(arch, fw), allow_pickle=False) as f:
        native = {key: f[key] for key in f.files}
    sessions: dict[str, Any] = {}
    # (ONNX file, check name, native logits it must reproduce on the validation batch)
    exported = (
        ("model", paths.onnx_model(arch, fw), names.ONNX_VS_NATIVE, "validation_logits"),
        ("init", paths.init_onnx(arch, fw), names.INIT_ONNX_VS_NATIVE, "init_validation_logits"),
    )
    for kind, path, check, key in exported:
        try:
            sessions[kind] = open_session(path, record.get("threads"))  # as the export's own and its server's
        except CheckError as error:
            ledger.add(arch, fw, names.onnx_checker(kind), None, 0.0, False, str(error))
            continue
        problems = violations(onnx.load(str(path), load_external_data=False), fw)
        ledger.add(arch, fw, names.onnx_checker(kind), float(len(problems)), 0.0, not problems, "; ".join(problems))
        expected = native[key]
        ledger.add(arch, fw, check, max_abs_diff(run_onnx(sessions[kind], batch), expected),
                   onnx_tolerance(tol, expected), detail=f"max |logit| {np.abs(expected).max():.3g}")
        session = sessions[kind]
        inference_mode(ledger, tol, arch, fw, names.inference_mode(f"onnx_{kind}"),
                       lambda x, s=session: run_onnx(s, x), batch)
    test_logits = native["test_logits"]
    figures = {"test_accuracy": accuracy(test_logits, data.test_labels),
               "test_loss": softmax_cross_entropy(test_logits, data.test_labels),
               "test_predictions": np.argmax(test_logits, axis=1)}
    if "model" in sessions:
        onnx_acc = accuracy(run_onnx(sessions["model"], data.test_inputs), data.test_labels)
        ledger.add(arch, fw, names.ONNX_TEST_ACCURACY_EQUALS_NATIVE, abs(onnx_acc - figures["test_accuracy"]), 0.0,
                   onnx_acc == figures["test_accuracy"],
                   f"onnx {onnx_acc:.4f}, native {figures['test_accuracy']:.4f}")
    # A reload of the same program gives its logits within a float32 step or two of the largest (abs + rel *
    # max|logit| of the validation batch). A format reloaded as a program compiled anew is another compilation,
    # held to what ONNX Runtime's is (onnx_vs_native): jax.export's StableHLO has a symbolic batch dimension, and
    # XLA fuses and orders the sums of the polymorphic program otherwise (measured: 1.9e-6, two float32 steps at a
    # largest logit of 8.0, in 2 of 10 seeds).
    scale = float(np.abs(native["validation_logits"]).max())
    for fmt, err in record["native_roundtrip_max_abs"].items():
        if fmt in RECOMPILED_ON_RELOAD:
            bound, why = tol.onnx_vs_native_abs + tol.onnx_vs_native_rel * scale, "compiled anew on reload"
        else:
            bound, why = tol.native_roundtrip_abs + tol.native_roundtrip_rel * scale, ""
        ledger.add(arch, fw, names.native_roundtrip(fmt), err, bound, detail=why)
        runs_key, alone_key = paths.native_inference_keys(fmt)
        where = f"{paths.native_outputs(arch, fw)}: {fmt}"
        if runs_key in native and alone_key in native:
            predict = replay(native[runs_key], native[alone_key], batch, where)
            inference_mode(ledger, tol, arch, fw, names.inference_mode(f"native_{fmt}"), predict, batch)
        else:
            ledger.add(arch, fw, names.inference_mode(f"native_{fmt}"), None, tol.inference_mode_abs, False,
                       f"{where}: no inference-mode record ({runs_key}, {alone_key})")
    return {"sessions": sessions, "threads": record.get("threads"), **figures}  # threads: export.json's, checked


def quality_floor(spec: Spec, ledger: Ledger, arch: str, fw: str, run: dict[str, Any]) -> None:
    """params.yaml's floor (quality.min_test_accuracy, per source) on the run's test accuracy; for a model with
    replicates, on the median of the run and its replicates (what the training gives, not what one
    rounding path gave), the run's own accuracy and its rank among them in the detail, and a run below every one
    of its replicates named an outlier."""
    minimum = spec.quality.min_test_accuracy[arch]  # the spec requires a floor for every model
    own = float(run["test_accuracy"])
    reps = run.get("replicates")
    if not reps:
        ledger.add(arch, fw, names.MIN_TEST_ACCURACY, own, minimum, own >= minimum,
                   f"test accuracy {own:.4f}, required >= {minimum}")
        return
    others = [float(r["test_accuracy"]) for r in reps]
    median = float(np.median([own, *others]))
    rank = 1 + sum(other < own for other in others)
    detail = (f"median {median:.4f} of the run and its {len(others)} replicates, required >= {minimum}; "
              f"the run {own:.4f}, rank {rank} of {len(others) + 1} from the lowest")
    if own < min(others):
        detail += f"; an outlier: below every replicate (lowest {min(others):.4f})"
    ledger.add(arch, fw, names.MIN_TEST_ACCURACY, median, minimum, median >= minimum, detail)
