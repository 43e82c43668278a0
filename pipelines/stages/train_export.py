"""Stage `train_export@<framework>-<model>`: one process of that framework's environment trains the model from
the shared init, exports it (native formats, ONNX, the framework's own logits) and measures its latency.

One process rather than three (train, export, bench) because starting an interpreter and importing a framework
costs 4-8 s, far more than training or exporting these models. Everything the stage makes is built in scratch
space and published as one folder, `artifacts/<model>/<framework>/`, only after every check passed: a failure
or a kill leaves the previous folder as it was. Timings go to `measurements/` (not lineage, see
pipelines/measurements.py).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from benchmarks import latency
from pipelines import measurements, paths
from pipelines.environments import ENVIRONMENTS, installed_versions
from pipelines.stages import framework_stage_args, stage_main
from pipelines.stages.backend import load_backend, model_config
from rosetta_common.data import Dataset, load_prepared
from rosetta_common.errors import TrainingError
from rosetta_common.interface import TrainResult
from rosetta_common.io import sha256, staged_outputs, write_json
from rosetta_common.metrics import accuracy, max_abs_diff, softmax_cross_entropy
from rosetta_common.spec import ModelConfig
from rosetta_common.training import TrainPlan, plan
from rosetta_common.weights import check_weights, count_parameters, load_weights, save_weights


def check_training(result: TrainResult, train_plan: TrainPlan, where: str) -> None:
    """A diverged run publishes nothing: name the first step whose loss is not finite."""
    if len(result.step_losses) != train_plan.num_steps:
        raise TrainingError(f"{where}: {len(result.step_losses)} step losses, the plan has {train_plan.num_steps}")
    bad = np.flatnonzero(~np.isfinite(np.asarray(result.step_losses, np.float64)))
    if bad.size:
        step = int(bad[0])
        raise TrainingError(
            f"{where}: training diverged at step {step + 1} (epoch {step // train_plan.steps_per_epoch + 1}): "
            f"loss {result.step_losses[step]} (try a smaller optimizers.{train_plan.optimizer_name}.learning_rate)"
        )


def train(backend: ModuleType, config: ModelConfig, init: dict, train_plan: TrainPlan, data: Dataset, out: Path,
          where: str) -> tuple[Any, TrainResult]:
    model = backend.build(config, init)
    result = backend.train(model, train_plan, data)
    check_training(result, train_plan, where)
    trained = backend.to_canonical(model)
    check_weights(trained, config, f"{where}: trained weights")  # names, shapes, all finite
    test_logits = backend.predict(model, data.test_images)
    save_weights(out / "trained.safetensors", trained, config.arch, framework=backend.FRAMEWORK)
    write_json(out / "train_log.json", {
        "framework": backend.FRAMEWORK, "model": config.arch, **train_plan.describe(),
        "step_losses": result.step_losses, "epoch_losses": result.epoch_losses,
    })
    write_json(out / "metrics.json", {
        "test_accuracy": accuracy(test_logits, data.test_labels),
        "test_loss": softmax_cross_entropy(test_logits, data.test_labels),
        "final_train_loss": result.epoch_losses[-1],
        "parameters": count_parameters(trained),
        "epochs": train_plan.epochs,
        "optimizer": train_plan.optimizer_name,
    })
    return model, result


def export(backend: ModuleType, config: ModelConfig, init: dict, model: Any, data: Dataset, batch: np.ndarray,
           out: Path) -> dict[str, float]:
    """Native formats, model.onnx, init.onnx (the untrained model: the forward-parity witness), the framework's own
    logits, and export.json tying every figure to the sha256 of the files it was measured on."""
    initial = backend.build(config, init)
    backend.export_onnx(initial, out / "init.onnx", batch)
    started = time.perf_counter()
    backend.export_native(model, out / "native", batch)
    native_seconds = time.perf_counter() - started
    started = time.perf_counter()
    backend.export_onnx(model, out / "model.onnx", batch)
    onnx_seconds = time.perf_counter() - started
    logits = backend.predict(model, batch)
    with open(out / "native_outputs.npz", "wb") as f:
        np.savez(f, validation_logits=logits, init_validation_logits=backend.predict(initial, batch),
                 test_logits=backend.predict(model, data.test_images))
    # Every reloaded native format must reproduce the in-memory model; the validator cannot load them (it has
    # no framework), so it re-hashes the files these figures were measured on.
    roundtrip = {name: max_abs_diff(predict(batch), logits)
                 for name, predict in backend.load_native(out / "native").items()}
    write_json(out / "export.json", {
        "framework": backend.FRAMEWORK,
        "model": config.arch,
        "native_roundtrip_max_abs": roundtrip,
        "sha256": {str(p.relative_to(out)): sha256(p) for p in sorted(out.rglob("*"))
                   if p.is_file() and not paths.unhashed(p.relative_to(out))},
        "versions": installed_versions([*ENVIRONMENTS[backend.FRAMEWORK].distributions, "onnx", "onnxruntime",
                                        "numpy"]),
    })
    return {"native_export_seconds": native_seconds, "onnx_export_seconds": onnx_seconds}


def measure_latency(backend: ModuleType, model: Any, onnx_path: Path, images: np.ndarray) -> dict[str, Any]:
    threads = latency.framework_threads(backend.FRAMEWORK)
    ort_threads = int(os.environ.get("ROSETTA_THREADS", "0")) or threads["intra_op"] or latency.available_cores()
    session = latency.onnx_session(onnx_path, ort_threads)
    settings = latency.Settings()
    results = latency.measure(lambda x: backend.predict(model, x), latency.onnx_predict(session), images, settings)
    return {"native": f"{backend.__name__}.predict (numpy in, numpy out)", "results": results,
            "settings": latency.settings_dict(settings), "environment": latency.environment(threads, ort_threads)}


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    fw, arch, spec = framework_stage_args(argv, __doc__)
    where = f"train_export@{fw}-{arch}"
    # Every input is checked where it enters, before anything is built or written.
    data = load_prepared(paths.PREPARED)
    config = model_config(spec, arch, data)
    init = load_weights(paths.init_weights(arch), config)
    train_plan = plan(spec, arch, len(data.train_labels))
    backend = load_backend(fw, spec.seed)
    ready = time.perf_counter()

    with staged_outputs(paths.run_dir(arch, fw)) as out:
        model, result = train(backend, config, init, train_plan, data, out, where)
        exported = export(backend, config, init, model, data, data.validation_batch(spec.export.validation_batch_size),
                          out)
    figures = json.loads((paths.run_dir(arch, fw) / "metrics.json").read_text())

    steady = result.epoch_seconds[1:] or result.epoch_seconds  # the first epoch holds compilation
    samples = train_plan.steps_per_epoch * train_plan.batch_size
    measurements.write(arch, fw, {
        "framework": fw, "model": arch,
        "startup_seconds": ready - started,
        "train": {"train_seconds": result.train_seconds, "epoch_seconds": result.epoch_seconds,
                  "steady_samples_per_second": samples / statistics.median(steady) if steady else None},
        "export": exported,
        "latency": measure_latency(backend, model, paths.onnx_model(arch, fw), data.test_images),
        "stage_seconds": time.perf_counter() - started,
    })
    print(f"train_export: {fw}/{arch} test_accuracy={figures['test_accuracy']:.4f} "
          f"test_loss={figures['test_loss']:.5f} (trained in {result.train_seconds:.1f}s) -> {paths.run_dir(arch, fw)}")
    return 0


if __name__ == "__main__":
    stage_main(main)
