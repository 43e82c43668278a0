"""What more than one stage needs, so that no stage imports another: the framework package as a stage starts
it, each model's job (config, init, plan), and a trained model's run record (train_export and train_dp write the
same files)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pipelines import paths
from rosetta_common.data import Dataset, load_for
from rosetta_common.errors import ArtifactError, TrainingError
from rosetta_common.interface import TrainResult, load_backend
from rosetta_common.io import losses_sha256, read_json, sha256, write_json
from rosetta_common.metrics import accuracy, parting_step, softmax_cross_entropy
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.training import TrainPlan, plan
from rosetta_common.weights import (
    Weights,
    check_weights,
    count_parameters,
    is_statistic,
    load_weights,
    perturbed,
    save_weights,
)

# train_dp tells its workers where rank 0 writes (its scratch folder, published only if every worker succeeds).
DP_OUT_VARIABLE = "ROSETTA_DP_OUT"


def seeded_backend(framework: str, seed: int) -> ModuleType:
    """The package for `framework`, seeded and in deterministic mode (its import checks the contract)."""
    module = load_backend(framework)
    module.configure(seed)
    return module


def job_config(spec: Spec, arch: str, data: Dataset) -> ModelConfig:
    """The model's config: the spec's architecture section and the prepared data's input (image shape, or
    vocabulary and length) and classes."""
    return data.model_config(spec, arch)


@dataclass(frozen=True)
class Job:
    """One model to train and export, its inputs read and checked."""

    arch: str
    config: ModelConfig
    init: Weights
    plan: TrainPlan
    data: Dataset  # what it trains on: the prepared images, or the prepared token ids


def load_jobs(spec: Spec, models: list[str], folder: Path = paths.PREPARED) -> list[Job]:
    """Each model's config, checked init weights, plan and prepared data (each kind read once), every one's
    validation batch checked to fit its test split."""
    jobs, cache = [], {}
    for arch in models:
        data = load_for(arch, folder, cache)
        data.validation_batch(spec.export.validation_batch_size)
        config = job_config(spec, arch, data)
        jobs.append(Job(arch, config, load_weights(paths.init_weights(arch), config),
                        plan(spec, arch, len(data.train_labels)), data))
    return jobs


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


def record_training(backend: ModuleType, job: Job, model: Any, result: TrainResult, data: Dataset, out: Path,
                    where: str, **run: Any) -> None:
    """A trained model's run record: its canonical weights, every step's loss, its test figures as the framework
    computes them; `run` adds fields to train_log.json and metrics.json (a data-parallel run's `workers`)."""
    check_training(result, job.plan, where)
    trained = backend.to_canonical(model)
    check_weights(trained, job.config, f"{where}: trained weights")  # names, shapes, all finite
    test_logits = backend.predict(model, data.test_inputs)
    save_weights(out / "trained.safetensors", trained, job.arch, framework=backend.FRAMEWORK)
    write_json(out / "train_log.json", {
        "framework": backend.FRAMEWORK, "model": job.arch, **job.plan.describe(), **run,
        "step_losses": result.step_losses, "epoch_losses": result.epoch_losses,
    })
    write_json(out / "metrics.json", {
        "test_accuracy": accuracy(test_logits, data.test_labels),
        "test_loss": softmax_cross_entropy(test_logits, data.test_labels),
        "final_train_loss": result.epoch_losses[-1],
        "parameters": count_parameters(trained),
        "epochs": job.plan.epochs,
        "optimizer": job.plan.optimizer_name,
        **run,
    })


def steady_samples_per_second(result: TrainResult, job: Job) -> float | None:
    steady = result.epoch_seconds[1:] or result.epoch_seconds  # the first epoch holds compilation
    return job.plan.steps_per_epoch * job.plan.batch_size / statistics.median(steady) if steady else None


def replicate_start(job: Job, replicate: int, ulps: int = 1, stream: str = "") -> tuple[Weights, TrainPlan, str]:
    """What replicate `replicate` (1, 2, ...) of a job is, in one place: its init moved by `ulps` ulps with signs of
    `stream`'s own (rosetta_common.weights.perturbed: one ulp alike in every framework, the lockstep window's;
    replicates.ulps with the group's name, the end-of-training replicates'), its plan with each batch's rows in
    their own order (TrainPlan.replicate), and a description of both."""
    init, moved = perturbed(job.init, replicate, ulps, stream)
    return init, job.plan.replicate(replicate), f"{moved}; each batch's rows in the order of replicate {replicate}"


def named_models(models: list[str], path: Path, key: str, stage: str) -> list[str]:
    """The models of `models` that a stage's JSON output names under `key`, in params.yaml's order."""
    try:
        named = read_json(path)[key]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ArtifactError(f"{path}: unreadable ({type(error).__name__}: {error}); "
                            f"the {stage} stage writes it (dvc repro {stage})") from error
    return [arch for arch in models if arch in named]


def planned_models(models: list[str]) -> list[str]:
    """The models of `models` that artifacts/null_plan.json names."""
    return named_models(models, paths.NULL_PLAN, "replicates", "null_plan")


def interim_continued(models: list[str]) -> list[str]:
    """The models of `models` that artifacts/null_interim.json sends on to more replicates."""
    return named_models(models, paths.NULL_INTERIM, "more", "null_interim")


def replicates_stage(stage: str, fw: str, models: list[str], spec: Spec, clock: Any, out: Path, wanted: int,
                     after: Callable[[str], tuple[int, int]]) -> None:
    """A replicates stage's work in `fw`'s environment: for each of `models`, replicates trained to the end
    (`replicates`, until `wanted` have parted, numbered on from `after(model)`: (trained, parted) before), into
    out/<model>/, and out/plan.json naming the models. With no model the framework is never imported."""
    jobs = load_jobs(spec, models)
    clock.lap("inputs")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "plan.json", {"framework": fw, "models": models})
    if not jobs:
        print(f"{stage}@{fw}: no model to train replicates for", flush=True)
    backend = seeded_backend(fw, spec.seed) if jobs else None
    clock.lap("framework_import")
    for job in jobs:
        where = f"{stage}@{fw} {job.arch}"
        own = read_json(paths.train_log(job.arch, fw))["step_losses"]  # train_export checked them
        model = None

        def fit(replicate: int, init: Weights, plan: Any, job: Job = job) -> Any:
            nonlocal model
            model = rebuilt(backend, job, model, init)
            return model, backend.train(model, plan, job.data)

        started = time.time()
        with clock.phase(f"{job.arch}.replicates"):
            replicates(backend, spec, job, job.data, out / job.arch, where, fit, own, wanted, after(job.arch),
                       group=fw)
        print(f"{where}: done in {time.time() - started:.1f}s", flush=True)


def rebuilt(backend: ModuleType, job: Job, model: Any, init: Weights) -> Any:
    """The job's model holding `init`: a fresh build the first time (`model` None), then the same model with its
    weights put back (from_canonical, the call every build makes), which the contract trains exactly as a fresh
    build. A replicate, and train_export's run after its window replicates, reuse what the framework made for
    the last one (Keras' traced step: seconds a model).

    Always from an init, never from a trained state: a run's weights put back through to_canonical and
    from_canonical would let a porting bug in that mapping (torch's LSTM bias given to both of its bias vectors)
    change the model whose outputs, exports and taps are recorded (tests/pipeline/test_taps_localize.py plants
    it)."""
    if model is None:
        return backend.build(job.config, init)
    backend.from_canonical(model, init)
    return model


def replicates(backend: ModuleType, spec: Spec, job: Job, data: Dataset, out: Path | None, where: str,
               fit: Callable[[int, Weights, TrainPlan], tuple[Any, TrainResult]], own: Sequence[float],
               wanted: int, after: tuple[int, int] = (0, 0), *, group: str) -> None:
    """The measured null's end-of-training replicates (params.yaml `replicates`): the same training from the init
    moved by replicates.ulps, signs of the null group's own (`group`: "torch", "torch-dp", a TPU's), with each
    batch's rows in their own order (replicate_start), replicates 1, 2, ... each trained
    by `fit(i, init, plan)` (a single process, or every worker of a data-parallel run: the step losses are the
    global batch's, so every worker stops at the same one) until `wanted` of them have parted from the run (`own`:
    its step losses; rosetta_common.metrics.parting_step at tolerances.lockstep_loss_rel) or `replicates.at_most`
    were trained. `after` (trained, parted): replicates an earlier stage trained, so numbering and counting go on
    from there. A replicate that never parts ends where the run ends and says nothing of the spread. Into `out`
    (None: a data-parallel worker other than rank 0): replicates.json with each one's test figures, step losses
    and parting step; replicates.npz with its test predictions and BatchNorm running statistics, which the
    validator compares across and within frameworks."""
    settings, tol = spec.replicates, spec.tolerances.lockstep_loss_rel
    runs, predictions, running = [], [], {}
    trained_before, parted = after
    for i in range(trained_before + 1, settings.at_most + 1):
        if parted >= wanted:
            break
        backend.configure(spec.seed)  # as the run itself started: only the ulps and the rows' order differ
        init, train_plan, moved = replicate_start(job, i, settings.ulps, group)
        model, result = fit(i, init, train_plan)
        check_training(result, job.plan, f"{where} replicate {i}")
        step = parting_step(result.step_losses, own, tol)
        parted += step is not None
        if out is None:
            continue
        logits = backend.predict(model, data.test_inputs)
        predictions.append(np.argmax(logits, axis=1).astype(np.int16))
        for name, value in backend.to_canonical(model).items():
            if is_statistic(name):
                running.setdefault(name, []).append(value)
        runs.append({"replicate": i, "perturbation": moved, "parts_from_run_at_step": step,
                     "test_accuracy": accuracy(logits, data.test_labels),
                     "test_loss": softmax_cross_entropy(logits, data.test_labels),
                     "step_losses": result.step_losses})
        print(f"{where}: replicate {i} {'parts from the run at step ' + str(step) if step else 'never parts'} "
              f"({parted} of {wanted} parted)", flush=True)
    if out is None or not runs:
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / paths.REPLICATES_ARRAYS, "wb") as f:
        np.savez(f, test_predictions=np.stack(predictions), **{k: np.stack(v) for k, v in running.items()})
    write_json(out / paths.REPLICATES_RECORD, {
        "framework": backend.FRAMEWORK, "model": job.arch, "parted": parted, "trained": trained_before + len(runs),
        "wanted": {"parted": wanted, "at_most": settings.at_most},
        "run_step_losses_sha256": losses_sha256(own), "arrays_sha256": sha256(out / paths.REPLICATES_ARRAYS),
        "replicates": runs})

