"""Stage `validate`: judge every exported model under ONNX Runtime, in an environment with no framework.

Checks, each with an explicit tolerance from params.yaml:
- per framework and model: onnx.checker on model.onnx and init.onnx; ONNX Runtime vs the framework's own
  logits (trained and init); ONNX Runtime's test accuracy equals the native one; native reload round trip;
  minimum test accuracy; inference mode of every export (rosetta_common.metrics.inference_mode_problems): each
  ONNX file run here, each native format from the logits its reload recorded in native_outputs.npz (two runs
  on the validation batch, its first images alone);
- per model: the float64 numpy reference forward vs every init.onnx; every pair of frameworks' init.onnx
  on random inputs at several batch sizes (forward parity);
- per model and pair of frameworks: training parity (step-1 loss, first-epoch losses, test loss, test
  accuracy), plus the final weight difference as a figure; for a model with BatchNorm, its running mean and
  variance after training, from the trained canonical files (figure `running_statistics`);
- with data_parallel.workers > 1: each framework's data-parallel run against its single-process run and the
  data-parallel runs pairwise (pipelines/stages/validate_data_parallel.py).
Writes reports/validation.json and exits non-zero naming each failing check.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from pipelines import measurements, paths
from pipelines.stages import IMPORTS_STARTED, StageError, stage_main
from pipelines.stages.replicate_null import cross_and_within, holm_rejected, rank_sum_p
from pipelines.stages.train_logs import lockstep_figures, read_step_losses
from pipelines.stages.validate_data_parallel import data_parallel_parity
from rosetta_common.data import load_prepared
from rosetta_common.errors import RosettaError
from rosetta_common.interface import Predict
from rosetta_common.io import read_json, sha256, write_json
from rosetta_common.metrics import (
    accuracy,
    inference_mode_problems,
    max_abs_diff,
    parting_step,
    relative_diff,
    softmax_cross_entropy,
)
from rosetta_common.onnx_conventions import violations
from rosetta_common.reference import forward
from rosetta_common.seeding import derive_seed
from rosetta_common.spec import ModelConfig, Spec, TolerancesSpec, load_spec
from rosetta_common.training import plan
from rosetta_common.weights import Weights, is_statistic, load_weights


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

    def add_null(self, model: str, framework: str, check: str, value: float, tolerance: float | None,
                 null: dict[str, Any], detail: str) -> None:
        """A figure beyond its float32 bound after the runs parted, judged against the replicates' null
        (replicate_null): passed is decided by `judge_nulls`, over every such row of the run at once (Holm)."""
        self.add(model, framework, check, value, tolerance, False, detail)
        self.rows[-1]["null"] = null

    def judge_nulls(self, alpha: float) -> None:
        rows = [r for r in self.rows if "null" in r]
        for row, rejected in zip(rows, holm_rejected([r["null"]["p_value"] for r in rows], alpha), strict=True):
            row["passed"] = not rejected
            row["null"]["holm_family"] = len(rows)
            row["detail"] += f"; {'different' if rejected else 'no larger'} at alpha {alpha}, Holm over {len(rows)}"

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
        # The runner pins every runtime's threads (pipelines/environments.py): results must not depend on cores.
        options.intra_op_num_threads = int(os.environ.get("ROSETTA_THREADS", "2"))
        options.inter_op_num_threads = 1
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


class Spread:
    """A predict function that remembers the first logits it gave each image (by its bytes) and the largest change
    of an image's logits in any later call: the figure behind inference_mode_problems' verdict (two runs on the
    same images, an image alone vs in its batch)."""

    def __init__(self, predict: Predict) -> None:
        self.predict = predict
        self.first: dict[bytes, np.ndarray] = {}
        self.value = 0.0

    def __call__(self, images: np.ndarray) -> np.ndarray:
        out = self.predict(images)
        new: dict[bytes, np.ndarray] = {}
        for image, logits in zip(images, out, strict=True):
            key = image.tobytes()
            if key in self.first:
                self.value = max(self.value, max_abs_diff(logits, self.first[key]))
            else:
                new.setdefault(key, logits)  # a duplicate within one call is no second run
        self.first.update(new)
        return out


def replay(runs: np.ndarray, alone: np.ndarray, batch: np.ndarray, where: str) -> Predict:
    """The logits a native export recorded, played back as a predict function: the validation batch gets its
    recorded runs in order, one of its first images alone gets its alone logits; anything else is a StageError
    (the record lacks what the check asks for)."""
    calls = iter(runs)

    def predict(images: np.ndarray) -> np.ndarray:
        if images.shape == batch.shape and np.array_equal(images, batch):
            found = next(calls, None)
            if found is not None:
                return found
            raise StageError(f"{where}: records {len(runs)} runs on the validation batch, the check needs more")
        if len(images) == 1:
            for i in range(len(alone)):
                if np.array_equal(images[0], batch[i]):
                    return alone[i : i + 1]
        raise StageError(f"{where}: records no logits for {len(images)} such images (shape {images.shape})")

    return predict


def inference_mode(checks: Checks, tol: TolerancesSpec, arch: str, fw: str, check: str, predict: Predict,
                   batch: np.ndarray) -> None:
    """One export's inference-mode check: rosetta_common.metrics.inference_mode_problems decides (dropout active:
    two runs differ; batch statistics: an image's logits change with its batch), the row's value is the largest
    such change it saw (Spread), judged against tolerances.inference_mode_abs."""
    spread = Spread(predict)
    try:
        problems = inference_mode_problems(spread, batch, tol.inference_mode_abs)
    except StageError as error:
        checks.add(arch, fw, check, None, tol.inference_mode_abs, False, str(error))
        return
    checks.add(arch, fw, check, spread.value, tol.inference_mode_abs, not problems,
               "; ".join(problems) or "within tolerance: no dropout, no batch statistics seen")


REQUIRED = ("trained.safetensors", "train_log.json", "native_outputs.npz", "model.onnx", "init.onnx", "export.json")


def intact(checks: Checks, arch: str, fw: str) -> dict[str, Any] | None:
    """The run's export.json if every file it records is there with the sha256 it records, else None (and a
    failed check naming the file): every figure judged below is tied to these exact bytes."""
    run = paths.run_dir(arch, fw)
    problems = [f"{run / name}: missing" for name in REQUIRED if not (run / name).is_file()]
    record: dict[str, Any] = {}
    if not problems:
        try:
            record = read_json(run / "export.json")
            recorded = record["sha256"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            problems.append(f"{run / 'export.json'}: unreadable ({type(error).__name__}: {error})")
            recorded = {}
        native = {str(p.relative_to(run)) for p in (run / "native").rglob("*") if p.is_file()}
        native = {rel for rel in native if not paths.unhashed(Path(rel))}
        for rel in sorted(native - set(recorded)):
            problems.append(f"{run / rel}: not among the files export.json recorded")
        for rel, digest in sorted(recorded.items()):
            path = run / rel
            if not path.is_file():
                problems.append(f"{path}: missing (export.json recorded it)")
            elif sha256(path) != digest:
                problems.append(f"{path}: altered since export (sha256 differs from export.json's)")
        for name in ("trained.safetensors", "native_outputs.npz", "model.onnx", "init.onnx"):
            if name not in recorded:
                problems.append(f"{run / 'export.json'}: records no sha256 for {name}")
    checks.add(arch, fw, "artifacts_intact", float(len(problems)), 0.0, not problems, "; ".join(problems[:3]))
    return None if problems else record


def check_framework(spec: Spec, checks: Checks, arch: str, fw: str, data: Any, batch: np.ndarray,
                    record: dict[str, Any]) -> dict[str, Any]:
    """Checks of one exported framework model; returns its ONNX sessions and the figures the pairwise checks use,
    all computed here from the artifacts."""
    tol = spec.tolerances
    with np.load(paths.native_outputs(arch, fw), allow_pickle=False) as f:
        native = {key: f[key] for key in f.files}
    sessions: dict[str, Any] = {}
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
        problems = violations(onnx.load(str(path), load_external_data=False), fw)
        checks.add(arch, fw, f"onnx_checker_{kind}", float(len(problems)), 0.0, not problems, "; ".join(problems))
        expected = native[key]
        checks.add(
            arch,
            fw,
            check,
            max_abs_diff(run_onnx(sessions[kind], batch), expected),
            onnx_tolerance(tol, expected),
            detail=f"max |logit| {np.abs(expected).max():.3g}",
        )
        session = sessions[kind]
        inference_mode(checks, tol, arch, fw, f"inference_mode_onnx_{kind}", lambda x, s=session: run_onnx(s, x),
                       batch)
    test_logits = native["test_logits"]
    figures = {"test_accuracy": accuracy(test_logits, data.test_labels),
               "test_loss": softmax_cross_entropy(test_logits, data.test_labels)}
    if "model" in sessions:
        onnx_acc = accuracy(run_onnx(sessions["model"], data.test_images), data.test_labels)
        checks.add(
            arch,
            fw,
            "onnx_test_accuracy_equals_native",
            abs(onnx_acc - figures["test_accuracy"]),
            0.0,
            onnx_acc == figures["test_accuracy"],
            f"onnx {onnx_acc:.4f}, native {figures['test_accuracy']:.4f}",
        )
    # A reloaded format may be recompiled (jax.export: XLA fuses anew), so a few float32 steps at the largest
    # logit are allowed, as for ONNX Runtime: abs + rel * max|logit| of the validation batch.
    roundtrip_bound = tol.native_roundtrip_abs + tol.native_roundtrip_rel * float(
        np.abs(native["validation_logits"]).max())
    for fmt, err in record["native_roundtrip_max_abs"].items():
        checks.add(arch, fw, f"native_roundtrip_{fmt}", err, roundtrip_bound)
        runs_key, alone_key = paths.native_inference_keys(fmt)
        where = f"{paths.native_outputs(arch, fw)}: {fmt}"
        if runs_key in native and alone_key in native:
            predict = replay(native[runs_key], native[alone_key], batch, where)
            inference_mode(checks, tol, arch, fw, f"inference_mode_native_{fmt}", predict, batch)
        else:
            checks.add(arch, fw, f"inference_mode_native_{fmt}", None, tol.inference_mode_abs, False,
                       f"{where}: no inference-mode record ({runs_key}, {alone_key})")
    figures["test_predictions"] = np.argmax(test_logits, axis=1)
    figures["replicates"] = read_replicates(checks, arch, fw,
                                            spec.replicates.count if arch in spec.replicates.models else 0)
    minimum = spec.quality.min_test_accuracy[arch]  # the spec requires a floor for every model
    checks.add(
        arch,
        fw,
        "min_test_accuracy",
        figures["test_accuracy"],
        minimum,
        figures["test_accuracy"] >= minimum,
        f"test accuracy {figures['test_accuracy']:.4f}, required >= {minimum}",
    )
    return {"sessions": sessions, **figures}


def read_replicates(checks: Checks, arch: str, fw: str, count: int) -> list[dict[str, Any]] | None:
    """The run's replicates (train_export's train_replicates), each with its test figures, test predictions and
    BatchNorm running statistics; None when params ask for none. Their files are among those export.json hashed,
    so artifacts_intact has already tied them to the run."""
    if not count:
        return None
    run = paths.run_dir(arch, fw)
    try:
        record = read_json(run / "replicates.json")
        with np.load(run / "replicates.npz", allow_pickle=False) as f:
            arrays = {key: f[key] for key in f.files}
        reps = [{**r, "test_predictions": arrays["test_predictions"][i],
                 "statistics": {k: v[i] for k, v in arrays.items() if k != "test_predictions"}}
                for i, r in enumerate(record["replicates"])]
        if len(reps) != count:
            raise ValueError(f"{len(reps)} replicates, params.yaml replicates.count is {count}")
    except (OSError, KeyError, ValueError, TypeError, IndexError) as error:
        checks.add(arch, fw, "replicates_readable", None, None, False, f"{run}: {type(error).__name__}: {error}")
        return None
    return reps


def end_of_training(checks: Checks, arch: str, pair: str, check: str, value: float, tolerance: float | None,
                    parting: int | None, null: tuple[list[float], list[float]] | None) -> None:
    """An end-of-training figure: within its float32 bound it passes; beyond it, two runs still in lockstep fail,
    and two runs that parted are judged against the replicates' null (replicate_null), when there are some."""
    if tolerance is not None and value <= tolerance:
        where = "in lockstep to the end" if parting is None else f"runs part at step {parting}"
        checks.add(arch, pair, check, value, tolerance, True, f"{where}; within the float32 bound")
        return
    if parting is None or null is None:
        why = ("the runs are in lockstep to the end, so the float32 bound holds" if parting is None else
               f"the runs part at step {parting} and there are no replicates to judge against (params.yaml "
               "replicates: add the model to replicates.models)")
        checks.add(arch, pair, check, value, tolerance, False, why)
        return
    cross, within = null
    p = rank_sum_p(cross, within)
    checks.add_null(arch, pair, check, value, tolerance, {"cross": cross, "within": within, "p_value": p},
                    f"runs part at step {parting}: cross-framework median {np.median(cross):.3g} against "
                    f"within-framework {np.median(within):.3g} (one-ulp replicates), p = {p:.3g}")


def replicate_figures(spec: Spec, arch: str, fw: str, run: dict[str, Any], train_size: int) -> list[dict[str, Any]]:
    """Each replicate's test figures, and the step where it parts from its framework's own run (None: never)."""
    if not run["replicates"]:
        return []
    own = read_train_log(arch, fw, plan(spec, arch, train_size).num_steps)
    return [{"replicate": r["replicate"], "test_accuracy": r["test_accuracy"], "test_loss": r["test_loss"],
             "parts_from_run_at_step": parting_step(r["step_losses"], own, spec.tolerances.lockstep_loss_rel)}
            for r in run["replicates"]]


def end_figures(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run and its replicates as the same kind of record: test loss, accuracy and predictions."""
    return [run, *(run["replicates"] or [])]


def read_train_log(arch: str, fw: str, expected_steps: int) -> np.ndarray:
    """The step losses of a single-process run, checked (train_logs.read_step_losses)."""
    return read_step_losses(paths.train_log(arch, fw), expected_steps)


def forward_parity(
    spec: Spec, checks: Checks, arch: str, sessions: dict[str, dict], batch: np.ndarray, config: ModelConfig
) -> None:
    tol = spec.tolerances.forward_parity_abs
    init = load_weights(paths.init_weights(arch), config)
    reference = forward(config, init, batch)
    inits = {fw: s["sessions"]["init"] for fw, s in sessions.items() if "init" in s["sessions"]}
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


def training_parity(spec: Spec, checks: Checks, arch: str, runs: dict[str, dict[str, Any]], data: Any,
                    config: ModelConfig) -> tuple[list[dict[str, Any]], dict[str, Weights]]:
    """Pairwise training figures and checks; also returns each framework's trained canonical weights (read here
    once, for running_statistics)."""
    tol = spec.tolerances.for_model(arch)
    train_plan = plan(spec, arch, len(data.train_labels))
    logs, weights = {}, {}
    for fw in runs:
        try:
            logs[fw] = read_train_log(arch, fw, train_plan.num_steps)
            weights[fw] = load_weights(paths.trained_weights(arch, fw), config)
        except RosettaError as error:
            checks.add(arch, fw, "training_record_readable", None, None, False, str(error))
    figures = []
    for a, b in itertools.combinations(logs, 2):
        pair = f"{a}|{b}"
        fig = {"model": arch, "frameworks": pair, "optimizer": spec.train.optimizer,
               **lockstep_figures(logs[a], logs[b], train_plan.steps_per_epoch, tol),
               "test_loss_rel": float(relative_diff(runs[a]["test_loss"], runs[b]["test_loss"])),
               "test_accuracy_diff_points": 100 * abs(runs[a]["test_accuracy"] - runs[b]["test_accuracy"]),
               "prediction_disagreement": disagreement(runs[a], runs[b]),
               "final_weights_max_abs": max(max_abs_diff(weights[a][k], weights[b][k]) for k in weights[a])}
        figures.append(fig)
        checks.add(arch, pair, "train_step1_loss_rel", fig["step1_loss_rel"], tol.step1_loss_rel)
        checks.add(arch, pair, "train_lockstep_loss_rel", fig["lockstep_loss_max_rel"], tol.lockstep_loss_rel,
                   detail=f"steps 1-{fig['lockstep_steps']}; the runs part at step {fig['parting_step']}")
        parting = fig["parting_step"]
        have = runs[a]["replicates"] is not None and runs[b]["replicates"] is not None
        for check, key, bound, distance in (
            ("test_loss_rel", "test_loss_rel", tol.test_loss_rel,
             lambda x, y: float(relative_diff(x["test_loss"], y["test_loss"]))),
            ("test_accuracy_points", "test_accuracy_diff_points", tol.test_accuracy_points,
             lambda x, y: 100 * abs(x["test_accuracy"] - y["test_accuracy"])),
            ("prediction_disagreement", "prediction_disagreement", 0.0, disagreement),
        ):
            if check == "prediction_disagreement" and parting is None:
                continue  # runs in lockstep to the end: their test figures above already judge them
            # (prediction disagreement's float32 bound is none at all: the same class for every test image)
            null = None
            if have:
                fa, fb = end_figures(runs[a]), end_figures(runs[b])
                null = cross_and_within(fa[0], fb[0], fa[1:], fb[1:], distance)
            end_of_training(checks, arch, pair, check, fig[key], bound, parting, null)
    return figures, weights


def disagreement(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The share of test images two runs classify differently."""
    return float(np.mean(a["test_predictions"] != b["test_predictions"]))


def statistic_rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the tensor's largest magnitude: a running mean near 0 in one channel does not blow the
    figure up, and a variance of 40 is judged at its own scale."""
    scale = max(float(np.abs(a).max()), float(np.abs(b).max()))
    return max_abs_diff(a, b) / scale if scale > 0 else 0.0


def statistics_rel(a: Weights, b: Weights, statistic: str) -> tuple[float, str]:
    """The largest statistic_rel of one kind of statistic over the BatchNorm layers, and that layer."""
    layers = {n.rsplit(".", 1)[0]: statistic_rel(a[n], b[n]) for n in a if is_statistic(n) and n.endswith(statistic)}
    worst = max(layers, key=layers.__getitem__)
    return layers[worst], worst


def running_statistics(spec: Spec, checks: Checks, arch: str, weights: dict[str, Weights],
                       runs: dict[str, dict[str, Any]], parting: dict[str, int | None]) -> list[dict[str, Any]]:
    """BatchNorm running mean and variance after training, pairwise, from each framework's trained canonical file
    (rosetta_common.weights.is_statistic names them): one figure per pair with each layer's, and a check per
    statistic (its worst layer), judged as every end-of-training figure is (end_of_training: the float32 bound,
    or after parting the replicates' null). Nothing for a model without BatchNorm."""
    tol = spec.tolerances.for_model(arch).running_stats_rel
    figures = []
    for a, b in itertools.combinations(weights, 2):
        names = [n for n in weights[a] if is_statistic(n)]
        if not names:
            break
        pair = f"{a}|{b}"
        layers: dict[str, dict[str, float]] = {}
        for name in names:
            layer, statistic = name.rsplit(".", 1)
            layers.setdefault(layer, {})[statistic] = statistic_rel(weights[a][name], weights[b][name])
        fig: dict[str, Any] = {"model": arch, "frameworks": pair}
        reps = [runs.get(fw, {}).get("replicates") for fw in (a, b)]
        for statistic in ("running_mean", "running_var"):
            value, worst = statistics_rel(weights[a], weights[b], statistic)
            fig[f"{statistic}_max_rel"] = value
            null = None
            if reps[0] is not None and reps[1] is not None:
                null = cross_and_within(weights[a], weights[b], [r["statistics"] for r in reps[0]],
                                        [r["statistics"] for r in reps[1]],
                                        lambda x, y, s=statistic: statistics_rel(x, y, s)[0])
            end_of_training(checks, arch, pair, f"{statistic}_rel", value, tol, parting.get(pair), null)
            checks.rows[-1]["detail"] = f"worst layer {worst}; " + checks.rows[-1].get("detail", "")
        figures.append({**fig, "layers": layers})
    return figures


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("validate", IMPORTS_STARTED)
    spec = load_spec(paths.PARAMS)
    data = load_prepared(paths.PREPARED)
    clock.lap("inputs")
    batch = data.validation_batch(spec.export.validation_batch_size)
    checks = Checks()
    parity: list[dict[str, Any]] = []
    statistics: list[dict[str, Any]] = []
    measured: list[dict[str, Any]] = []  # test figures this stage computed from each run's artifacts
    judged: set[tuple[str, str]] = set()  # (model, framework) runs whose files are the ones their figures came from
    for arch in spec.models:
        config = ModelConfig.of(spec, arch, data.image_shape, data.num_classes)
        runs = {}
        for fw in spec.frameworks:
            record = intact(checks, arch, fw)
            if record is None:
                continue  # nothing of this run is judged: its files are not the ones measured
            judged.add((arch, fw))
            try:
                runs[fw] = check_framework(spec, checks, arch, fw, data, batch, record)
            except (OSError, KeyError, ValueError, TypeError) as error:
                checks.add(arch, fw, "artifacts_readable", None, None, False, f"{type(error).__name__}: {error}")
        measured += [{"model": arch, "framework": fw, "test_accuracy": run["test_accuracy"],
                      "test_loss": run["test_loss"],
                      "replicates": replicate_figures(spec, arch, fw, run, len(data.train_labels))}
                     for fw, run in runs.items()]
        forward_parity(spec, checks, arch, runs, batch, config)
        figures, trained = training_parity(spec, checks, arch, runs, data, config)
        parity += figures
        parting = {f["frameworks"]: f["parting_step"] for f in figures}
        statistics += running_statistics(spec, checks, arch, trained, runs, parting)
        clock.lap(arch)
    data_parallel = data_parallel_parity(spec, checks, data, judged)
    clock.lap("data_parallel")
    checks.judge_nulls(spec.tolerances.null_alpha)
    failures = checks.failures()
    report = {
        "passed": not failures,
        "checks": checks.rows,
        "training_parity": parity,
        "running_statistics": statistics,
        "runs": measured,
        "data_parallel": data_parallel,
        "summary": {"checks": len(checks.rows), "failed": len(failures)},
    }
    write_json(paths.VALIDATION, report)
    measurements.write_stage(clock.record(checks=len(checks.rows), failed=len(failures)))
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
