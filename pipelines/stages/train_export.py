"""Stage `train_export@<framework>`: one process of that framework's environment trains every model of
params.yaml's `models` from its shared init, exports each (native formats, ONNX, the framework's own logits),
records every per-layer tap of the validation batch (taps.npz, init and trained) and measures its latency.

    python -m pipelines.stages.train_export <framework> [<model> ...]   (no model: every model in params.yaml)

One process per framework rather than per model: starting an interpreter and importing a framework (and its
ONNX exporter, and the first compiles) costs seconds, far more than training or exporting most of these models,
and each model paid it again. Every input is read and checked before the framework is imported. Each model's
run folder, `artifacts/<framework>/<model>/`, is built in scratch space and published at once, only after every
check passed: a failure or a kill leaves it as it was (models published before stay published; under DVC the
whole output folder is removed before the stage runs, so the next `dvc repro` runs it again). Timings go to
`measurements/` (not lineage, see pipelines/measurements.py), per model and for the stage as a whole (its start-up
breakdown).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pipelines import latency, measurements, paths
from pipelines.environments import ENVIRONMENTS, installed_versions, thread_environment
from pipelines.stages import IMPORTS_STARTED, framework_stage_args, stage_main
from pipelines.stages.common import (
    Job,
    load_jobs,
    rebuilt,
    record_training,
    replicate_start,
    seeded_backend,
    steady_samples_per_second,
)
from rosetta_common.data import Dataset
from rosetta_common.errors import TrainingError
from rosetta_common.interface import TrainResult
from rosetta_common.io import read_json, sha256, staged_outputs, write_json
from rosetta_common.metrics import max_abs_diff
from rosetta_common.spec import Spec
from rosetta_common.training import StepHook


class Checkpoints:
    """The run's state at each of tolerances.lockstep_checkpoints, for the validator's lockstep checks, taken
    by a StepHook from the training itself: its canonical weights (BatchNorm's running statistics among them) and
    eval-mode logits of the validation batch, as checkpoints.npz. The same for each of `replicates.count`
    replicates (replicate_start), for every model, with their step losses through the lockstep window: the null
    of the lockstep checks, what the framework's own rounding does to the state in those steps
    ("replicate<i>/..."). They train only through the last checkpoint or the window (the replicates stage trains
    those the end-of-training null needs to the end), before the run, on the model the run then trains from its
    init (rebuilt): a framework that traces its training step (Keras) traces it once a model, not twice."""

    def __init__(self, backend: ModuleType, spec: Spec, job: Job, batch: np.ndarray) -> None:
        self.backend, self.spec, self.job, self.batch = backend, spec, job, batch
        self.steps = list(spec.tolerances.lockstep_checkpoints)
        self.window = min(spec.tolerances.lockstep_steps, job.plan.num_steps)
        self.states: dict[int, dict[str, np.ndarray]] = {}  # replicate (0: the run itself) -> its arrays

    def hook(self, replicate: int) -> StepHook:
        prefix = "" if replicate == 0 else f"replicate{replicate}/"
        arrays = self.states.setdefault(replicate, {})

        def record(step: int, model: Any) -> None:
            arrays.update({f"{prefix}step{step}/{name}": value
                           for name, value in self.backend.to_canonical(model).items()})
            arrays[f"{prefix}step{step}/validation_logits"] = self.backend.predict(model, self.batch)

        return StepHook(frozenset(self.steps), record)

    def ran(self, replicate: int, result: TrainResult) -> None:
        """A replicate's training through the window ended: its window's losses."""
        if len(result.step_losses) < self.window:
            raise TrainingError(f"replicate {replicate}: {len(result.step_losses)} steps, fewer than the lockstep "
                                f"window's {self.window}")
        self.states[replicate][f"replicate{replicate}/step_losses"] = np.asarray(
            result.step_losses[:self.window], np.float64)

    def replicates(self, data: Dataset) -> Any:
        """Train the replicates through the last checkpoint or the window; the model they trained on (None when
        replicates.count is 0)."""
        last = max([*self.steps, self.window])  # lockstep_checkpoints may be empty: the window is then the last
        model = None
        for replicate in range(1, self.spec.replicates.count + 1):
            self.backend.configure(self.spec.seed)  # as the run itself starts
            init, plan, _ = replicate_start(self.job, replicate)
            model = rebuilt(self.backend, self.job, model, init)
            # As the whole replicate trains, to `last`.
            self.ran(replicate, self.backend.train(model, plan.truncated(last), data, self.hook(replicate)))
        return model

    def write(self, out: Path) -> None:
        """checkpoints.npz: the run's arrays, then each replicate's."""
        arrays = {k: v for replicate in sorted(self.states) for k, v in self.states[replicate].items()}
        with open(out / paths.CHECKPOINTS_FILE, "wb") as f:
            np.savez(f, **arrays)


def train(backend: ModuleType, spec: Spec, job: Job, data: Dataset, out: Path, where: str,
          checkpoints: Checkpoints, model: Any) -> tuple[Any, TrainResult]:
    """The run, from the job's init, on `model` (the replicates' model; None: a fresh build)."""
    backend.configure(spec.seed)
    model = rebuilt(backend, job, model, job.init)
    result = backend.train(model, job.plan, data, checkpoints.hook(0))
    record_training(backend, job, model, result, data, out, where)
    return model, result


def export(backend: ModuleType, job: Job, model: Any, batch: np.ndarray, out: Path,
           clock: measurements.StageClock) -> tuple[Any, dict[str, float]]:
    """Native formats, model.onnx, and init.onnx (the untrained model: the forward-parity witness). Returns the
    untrained model and the export timings."""
    initial = backend.build(job.config, job.init)
    with clock.phase(f"{job.arch}.export_native"):
        backend.export_native(model, out / "native", batch)
    with clock.phase(f"{job.arch}.export_onnx"):
        backend.export_onnx(initial, out / "init.onnx", batch)
        started = time.perf_counter()
        backend.export_onnx(model, out / "model.onnx", batch)
    return initial, {"native_export_seconds": clock.phases[f"{job.arch}.export_native"],
                     "onnx_export_seconds": time.perf_counter() - started}


def record_outputs(backend: ModuleType, job: Job, model: Any, initial: Any, data: Dataset, batch: np.ndarray,
                   out: Path) -> None:
    """The framework's own logits, each reloaded native format's (round trip, and its inference-mode record: the
    validator has no framework, so it judges native exports from these), and export.json tying every figure to
    the sha256 of the files it was measured on."""
    logits = backend.predict(model, batch)
    arrays = {"validation_logits": logits, "init_validation_logits": backend.predict(initial, batch),
              "test_logits": backend.predict(model, data.test_inputs)}
    roundtrip = {}
    for fmt, predict in backend.load_native(out / "native").items():
        runs = np.stack([predict(batch), predict(batch)])
        runs_key, alone_key = paths.native_inference_keys(fmt)
        arrays[runs_key] = runs
        alone = range(min(paths.NATIVE_ALONE, len(batch)))
        arrays[alone_key] = np.concatenate([predict(batch[i:i + 1]) for i in alone])
        # Every reloaded native format must reproduce the in-memory model; the validator cannot load them, so it
        # re-hashes the files these figures were measured on.
        roundtrip[fmt] = max_abs_diff(runs[0], logits)
    with open(out / "native_outputs.npz", "wb") as f:
        np.savez(f, **arrays)
    write_json(out / "export.json", {
        "framework": backend.FRAMEWORK,
        "model": job.arch,
        "native_roundtrip_max_abs": roundtrip,
        "sha256": file_hashes(out),
        # Every CPU thread pool's size (environments.thread_environment): the last bits of the logits recorded
        # here depend on it, so a server of this export runs with it (pipelines/serving/servers.py).
        "threads": int(thread_environment(os.environ)["ROSETTA_THREADS"]),
        "versions": installed_versions([*ENVIRONMENTS[backend.FRAMEWORK].distributions, "onnx", "onnxruntime",
                                        "numpy"]),
    })


def file_hashes(out: Path) -> dict[str, str]:
    """The sha256 of every file of a run folder but export.json itself (relative path -> digest, sorted), as
    export.json records them."""
    return {str(p.relative_to(out)): sha256(p) for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out) != Path("export.json") and not paths.unhashed(p.relative_to(out))}


def record_taps(backend: ModuleType, run: Trained, batch: np.ndarray, clock: measurements.StageClock) -> None:
    """Every tap (rosetta_common.taps) of the validation batch for the initial and the trained weights, added
    to the published run folder as taps.npz (np.savez) and hashed in its export.json, the folder republished
    whole: the validator has no framework, so it localizes a failing forward or lockstep check from these.

    Taken after every model is exported, as latency is (measure_model): reading taps makes TF build graphs, and
    every graph advances the process-wide counter that names the functions TF traces later, so taken in between
    it changed the next models' SavedModel and ONNX bytes (measured). Here nothing is exported after them."""
    fw, arch = backend.FRAMEWORK, run.job.arch
    with clock.phase(f"{arch}.taps"):
        initial = backend.build(run.job.config, run.job.init)
        arrays = {f"{kind}/{name}": value for kind, model in (("init", initial), ("trained", run.model))
                  for name, value in backend.forward_with_taps(model, batch).items()}
    published = paths.run_dir(arch, fw)
    with staged_outputs(published) as out:
        shutil.copytree(published, out, symlinks=True, dirs_exist_ok=True)
        with open(out / paths.TAPS_FILE, "wb") as f:
            np.savez(f, **arrays)
        record = read_json(out / "export.json")
        record["sha256"] = file_hashes(out)  # in place: export.json as one pass that wrote taps.npz would have
        write_json(out / "export.json", record)


def measure_latency(backend: ModuleType, model: Any, onnx_path: Path, images: np.ndarray) -> dict[str, Any]:
    threads = latency.framework_threads(backend.FRAMEWORK)
    ort_threads = int(os.environ.get("ROSETTA_THREADS", "0")) or threads["intra_op"] or latency.available_cores()
    session = latency.onnx_session(onnx_path, ort_threads)
    settings = latency.Settings()
    results = latency.measure(lambda x: backend.predict(model, x), latency.onnx_predict(session), images, settings)
    return {"native": f"{backend.__name__}.predict (numpy in, numpy out)", "results": results,
            "settings": latency.settings_dict(settings), "environment": latency.environment(threads, ort_threads)}


@dataclass
class Trained:
    """One model's run, published, with what its measurements record once every model is done."""

    job: Job
    model: Any
    result: TrainResult
    exported: dict[str, Any]
    seconds: float


def run_model(backend: ModuleType, spec: Spec, job: Job, data: Dataset, clock: measurements.StageClock) -> Trained:
    """Train, export and publish one model's run folder."""
    fw, arch = backend.FRAMEWORK, job.arch
    where = f"train_export@{fw} {arch}"
    started = time.time()
    # Seeded again for each model, so that no random state carries over from the models trained before it. torch
    # and jax then give a model's folder byte for byte as a single-model run does (measured). TF does not: its
    # SavedModel and tf2onnx files name traced functions by a process-wide counter (__inference_serve_2642), so
    # their bytes depend on what the process ran before: the same for every run of the whole stage (the
    # lineage is stable), but a single-model run's TF files differ in those names.
    backend.configure(spec.seed)
    batch = data.validation_batch(spec.export.validation_batch_size)
    with staged_outputs(paths.run_dir(arch, fw)) as out:
        checkpoints = Checkpoints(backend, spec, job, batch)
        with clock.phase(f"{arch}.checkpoints"):
            model = checkpoints.replicates(data)
        with clock.phase(f"{arch}.train"):
            model, result = train(backend, spec, job, data, out, where, checkpoints, model)
        checkpoints.write(out)
        initial, exported = export(backend, job, model, batch, out, clock)
        with clock.phase(f"{arch}.outputs"):
            record_outputs(backend, job, model, initial, data, batch, out)
    figures = json.loads(paths.metrics(arch, fw).read_text())
    print(f"train_export: {fw}/{arch} test_accuracy={figures['test_accuracy']:.4f} "
          f"test_loss={figures['test_loss']:.5f} (trained in {result.train_seconds:.1f}s) -> {paths.run_dir(arch, fw)}",
          flush=True)
    return Trained(job, model, result, exported, time.time() - started)


def measure_model(backend: ModuleType, run: Trained, data: Dataset, clock: measurements.StageClock) -> None:
    """Latency and training speed of one published model, into measurements/ (not an output of the stage).

    Runs after every model is exported: the latency loop repeats until a time budget is spent, so its number of
    calls varies from run to run, and every TF call advances the process-wide counter that names the functions
    TF traces later. Measured in between, it made the next models' TF files differ between two runs."""
    fw, arch = backend.FRAMEWORK, run.job.arch
    started = time.time()
    with clock.phase(f"{arch}.latency"):
        measured_latency = measure_latency(backend, run.model, paths.onnx_model(arch, fw), data.test_inputs)
    measurements.write(arch, fw, {
        "framework": fw, "model": arch, "stage": f"train_export@{fw}",
        "train": {"train_seconds": run.result.train_seconds, "epoch_seconds": run.result.epoch_seconds,
                  "steady_samples_per_second": steady_samples_per_second(run.result, run.job)},
        "export": run.exported,
        "latency": measured_latency,
        "model_seconds": run.seconds + time.time() - started,
    })


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("train_export", IMPORTS_STARTED)
    fw, models, spec = framework_stage_args(argv, __doc__, "train_export")
    clock.stage = f"train_export@{fw}"
    # Every input of every model is checked where it enters, before the framework is imported or anything written.
    jobs = load_jobs(spec, models)  # each with its data: the test split holds the whole validation batch
    clock.lap("inputs")
    backend = seeded_backend(fw, spec.seed)
    clock.lap("framework_import")
    runs = [run_model(backend, spec, job, job.data, clock) for job in jobs]
    for run in runs:
        record_taps(backend, run, run.job.data.validation_batch(spec.export.validation_batch_size), clock)
    for run in runs:
        measure_model(backend, run, run.job.data, clock)
    measurements.write_stage(clock.record(models=models))
    return 0


if __name__ == "__main__":
    stage_main(main)
