"""Stage `validate`: judge every exported model under ONNX Runtime, in an environment with no framework.

Checks, each with an explicit tolerance from params.yaml:
- per framework and model: onnx.checker on model.onnx and init.onnx; ONNX Runtime vs the framework's own
  logits (trained and init); ONNX Runtime's test accuracy equals the native one; native reload round trip;
  minimum test accuracy;
- per model: the float64 numpy reference forward vs every init.onnx; every pair of frameworks' init.onnx
  on random inputs at several batch sizes (forward parity);
- per model and pair of frameworks: training parity (step-1 loss, first-epoch losses, test loss, test
  accuracy), plus the final weight difference as a figure.
Writes reports/validation.json and exits non-zero naming each failing check.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from pipelines import paths
from pipelines.stages import StageError, stage_main
from rosetta_common.data import load_prepared
from rosetta_common.io import read_json, write_json
from rosetta_common.metrics import accuracy, max_abs_diff, relative_diff
from rosetta_common.reference import forward
from rosetta_common.seeding import derive_seed
from rosetta_common.spec import ModelConfig, Spec, TolerancesSpec, load_spec
from rosetta_common.weights import load_weights


class Checks:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(
        self,
        model: str,
        framework: str,
        check: str,
        value: float | None,
        tolerance: float | None,
        passed: bool | None = None,
        detail: str = "",
    ) -> None:
        if passed is None:
            passed = value is not None and tolerance is not None and value <= tolerance
        row = {
            "model": model,
            "framework": framework,
            "check": check,
            "max_abs_err": value,
            "tolerance": tolerance,
            "passed": bool(passed),
        }
        if detail:
            row["detail"] = detail
        self.rows.append(row)

    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r["passed"]]


def providers() -> list:
    """CPU, or CUDA first where onnxruntime-gpu finds a GPU; TF32 off there, since its ~1e-3 relative error
    would swamp fp32 parity (the CUDA provider enables TF32 by default)."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def open_session(path: Path) -> ort.InferenceSession:
    """onnx.checker then an ONNX Runtime session; any problem becomes a StageError naming the file."""
    if not path.is_file():
        raise StageError(f"{path}: ONNX file is missing")
    try:
        onnx.checker.check_model(str(path), full_check=True)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        return ort.InferenceSession(str(path), options, providers=providers())
    except Exception as error:  # onnx and onnxruntime raise several unrelated types
        raise StageError(
            f"{path}: not a valid ONNX model ({type(error).__name__}: {str(error).splitlines()[0]})"
        ) from None


def onnx_tolerance(tol: TolerancesSpec, expected: np.ndarray) -> float:
    """allclose's bound at the largest logit: abs + rel * max|expected|."""
    return tol.onnx_vs_native_abs + tol.onnx_vs_native_rel * float(np.abs(expected).max())


def run_onnx(session: ort.InferenceSession, images: np.ndarray) -> np.ndarray:
    name = session.get_inputs()[0].name
    return session.run(None, {name: images.astype(np.float32)})[0]


def check_framework(spec: Spec, checks: Checks, arch: str, fw: str, data: Any, batch: np.ndarray) -> dict[str, Any]:
    """Checks of one exported framework model; returns the ONNX sessions and outputs for pairwise checks."""
    tol = spec.tolerances
    native = np.load(paths.native_outputs(arch, fw), allow_pickle=False)
    sessions = {}
    # (ONNX file, check name, native logits it must reproduce on the validation batch)
    exported = (
        ("model", paths.onnx_model(arch, fw), "onnx_vs_native", "validation_logits"),
        ("init", paths.init_onnx(arch, fw), "init_onnx_vs_native", "init_validation_logits"),
    )
    for kind, path, check, key in exported:
        try:
            sessions[kind] = open_session(path)
        except StageError as error:
            checks.add(arch, fw, f"onnx_checker_{kind}", None, 0.0, False, str(error))
            continue
        checks.add(arch, fw, f"onnx_checker_{kind}", 0.0, 0.0, True)
        expected = native[key]
        checks.add(
            arch,
            fw,
            check,
            max_abs_diff(run_onnx(sessions[kind], batch), expected),
            onnx_tolerance(tol, expected),
            detail=f"max |logit| {np.abs(expected).max():.3g}",
        )
    if "model" in sessions:
        onnx_acc = accuracy(run_onnx(sessions["model"], data.test_images), data.test_labels)
        native_acc = accuracy(native["test_logits"], data.test_labels)
        checks.add(
            arch,
            fw,
            "onnx_test_accuracy_equals_native",
            abs(onnx_acc - native_acc),
            0.0,
            onnx_acc == native_acc,
            f"onnx {onnx_acc:.4f}, native {native_acc:.4f}",
        )
    for fmt, err in read_json(paths.export_record(arch, fw))["native_roundtrip_max_abs"].items():
        checks.add(arch, fw, f"native_roundtrip_{fmt}", err, tol.native_roundtrip_abs)
    metrics = read_json(paths.metrics(arch, fw))
    minimum = spec.quality.min_test_accuracy[arch]  # the spec requires a floor for every model
    checks.add(
        arch,
        fw,
        "min_test_accuracy",
        metrics["test_accuracy"],
        minimum,
        metrics["test_accuracy"] >= minimum,
        f"test accuracy {metrics['test_accuracy']:.4f}, required >= {minimum}",
    )
    return sessions


def forward_parity(
    spec: Spec, checks: Checks, arch: str, sessions: dict[str, dict], batch: np.ndarray, num_classes: int
) -> None:
    tol = spec.tolerances.forward_parity_abs
    config = ModelConfig.of(spec, arch, batch.shape[1:], num_classes)
    init = load_weights(paths.init_weights(arch), config)
    reference = forward(config, init, batch)
    inits = {fw: s["init"] for fw, s in sessions.items() if "init" in s}
    for fw, session in inits.items():
        checks.add(arch, fw, "init_onnx_vs_reference", max_abs_diff(run_onnx(session, batch), reference), tol)
    rng = np.random.default_rng(derive_seed(spec.seed, "parity", arch))
    inputs = [rng.random((n, *batch.shape[1:]), dtype=np.float32) for n in spec.export.parity_batch_sizes]
    for a, b in itertools.combinations(inits, 2):
        worst = max(max_abs_diff(run_onnx(inits[a], x), run_onnx(inits[b], x)) for x in [batch, *inputs])
        checks.add(
            arch,
            f"{a}|{b}",
            "forward_parity_init_onnx",
            worst,
            tol,
            detail=f"batch sizes {[len(x) for x in [batch, *inputs]]}",
        )


def training_parity(spec: Spec, checks: Checks, arch: str, frameworks: list[str], data: Any) -> list[dict[str, Any]]:
    tol = spec.tolerances
    logs = {fw: read_json(paths.train_log(arch, fw)) for fw in frameworks}
    metrics = {fw: read_json(paths.metrics(arch, fw)) for fw in frameworks}
    weights = {fw: load_weights(paths.trained_weights(arch, fw)) for fw in frameworks}
    figures = []
    for a, b in itertools.combinations(frameworks, 2):
        la, lb = np.array(logs[a]["step_losses"]), np.array(logs[b]["step_losses"])
        if la.shape != lb.shape:
            checks.add(arch, f"{a}|{b}", "same_number_of_steps", None, 0.0, False, f"{la.size} vs {lb.size} steps")
            continue
        per_epoch = logs[a]["steps_per_epoch"]
        rel = relative_diff(la, lb)
        fig = {
            "model": arch,
            "frameworks": f"{a}|{b}",
            "optimizer": spec.train.optimizer,
            "step1_loss_rel": float(rel[0]),
            "first_epoch_loss_max_rel": float(rel[:per_epoch].max()),
            "all_steps_loss_max_rel": float(rel.max()),
            "all_steps_loss_max_abs": max_abs_diff(la, lb),
            "test_loss_rel": float(relative_diff(metrics[a]["test_loss"], metrics[b]["test_loss"])),
            "test_accuracy_diff_points": 100 * abs(metrics[a]["test_accuracy"] - metrics[b]["test_accuracy"]),
            "final_weights_max_abs": max(max_abs_diff(weights[a][k], weights[b][k]) for k in weights[a]),
        }
        figures.append(fig)
        pair = f"{a}|{b}"
        checks.add(arch, pair, "train_step1_loss_rel", fig["step1_loss_rel"], tol.step1_loss_rel)
        checks.add(arch, pair, "train_first_epoch_loss_rel", fig["first_epoch_loss_max_rel"], tol.first_epoch_loss_rel)
        checks.add(arch, pair, "test_loss_rel", fig["test_loss_rel"], tol.test_loss_rel)
        checks.add(arch, pair, "test_accuracy_points", fig["test_accuracy_diff_points"], tol.test_accuracy_points)
    return figures


def main(argv: list[str]) -> int:
    spec = load_spec(paths.PARAMS)
    data = load_prepared(paths.PREPARED)
    batch = data.validation_batch(spec.export.validation_batch_size)
    checks = Checks()
    parity: list[dict[str, Any]] = []
    for arch in spec.models:
        sessions = {}
        for fw in spec.frameworks:
            try:
                sessions[fw] = check_framework(spec, checks, arch, fw, data, batch)
            except (OSError, KeyError, ValueError) as error:
                checks.add(arch, fw, "artifacts_readable", None, None, False, f"{type(error).__name__}: {error}")
        forward_parity(spec, checks, arch, sessions, batch, data.num_classes)
        parity += training_parity(spec, checks, arch, list(spec.frameworks), data)
    failures = checks.failures()
    report = {
        "passed": not failures,
        "checks": checks.rows,
        "training_parity": parity,
        "summary": {"checks": len(checks.rows), "failed": len(failures)},
    }
    write_json(paths.REPORTS / "validation.json", report)
    for row in failures:
        print(
            f"FAILED {row['model']}/{row['framework']} {row['check']}: value {row['max_abs_err']} "
            f"tolerance {row['tolerance']} {row.get('detail', '')}".rstrip(),
            file=sys.stderr,
        )
    print(f"validate: {len(checks.rows) - len(failures)}/{len(checks.rows)} checks passed -> reports/validation.json")
    return 1 if failures else 0


if __name__ == "__main__":
    stage_main(main)
