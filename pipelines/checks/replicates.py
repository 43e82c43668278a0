"""After two runs part: the end-of-training replicates (the replicates stage's, for the models
artifacts/null_plan.json names), read back and tied to their run, and the rule that judges every end-of-training
figure (end_of_training): within its float32 bound it passes; beyond it, runs still in lockstep fail, and runs that
parted are judged against the replicates' null (replicate_null), decided for the whole run at once by
Ledger.judge_nulls."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import CheckError, Ledger
from pipelines.checks.train_logs import read_step_losses
from rosetta_common.io import losses_sha256, read_json, sha256
from rosetta_common.metrics import accuracy, parting_step, softmax_cross_entropy
from rosetta_common.spec import Spec
from rosetta_common.training import plan


def read_names(path: Path, key: str, stage: str) -> list[str]:
    """The model names under `key` of a stage's JSON output (CheckError, naming the stage, where unreadable)."""
    try:
        named = read_json(path)[key]
        if not isinstance(named, list) or not all(isinstance(m, str) for m in named):
            raise TypeError(f"{key} = {named!r}: must be a list of model names")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckError(f"{path}: unreadable ({type(error).__name__}: {error}); the {stage} stage writes it"
                         ) from error
    return named


def read_plan() -> list[str]:
    """The models artifacts/null_plan.json gives end-of-training replicates."""
    return read_names(paths.NULL_PLAN, "replicates", "null_plan")


def read_interim() -> list[str]:
    """The models artifacts/null_interim.json sends on to more replicates."""
    return read_names(paths.NULL_INTERIM, "more", "null_interim")


def end_figures(arch: str, fw: str, data: Any) -> dict[str, Any]:
    """A run's test figures as validate computes them: from the framework's own test logits (native_outputs.npz)."""
    with np.load(paths.native_outputs(arch, fw), allow_pickle=False) as f:
        logits = f["test_logits"]
    return {"test_accuracy": accuracy(logits, data.test_labels),
            "test_loss": softmax_cross_entropy(logits, data.test_labels),
            "test_predictions": np.argmax(logits, axis=1), "replicates": None}


def all_replicates(ledger: Ledger, arch: str, fw: str, losses: Any, more: bool, at_most: int
                   ) -> list[dict[str, Any]] | None:
    """A model's end-of-training replicates in `fw`: the replicates stage's, then, where the interim look sent the
    model on (`more`), the replicates_more stage's, numbered on from them (none there only where the first stage
    trained `at_most` already); a gap or a missing folder is REPLICATES_READABLE, and gives None."""
    first = read_replicates(ledger, arch, fw, paths.replicates_run(arch, fw), losses)
    if first is None or not more:
        return first
    folder = paths.replicates_more_run(arch, fw)
    if not (folder / paths.REPLICATES_RECORD).exists() and len(first) >= at_most:
        return first
    rest = read_replicates(ledger, arch, fw, folder, losses)
    if rest is None:
        return None
    numbers = [r["replicate"] for r in first + rest]
    if numbers != list(range(1, len(numbers) + 1)):
        ledger.add(arch, fw, names.REPLICATES_READABLE, None, None, False,
                   f"{folder}: replicates {numbers}: must be numbered on from the first stage's, without a gap")
        return None
    return first + rest


def read_replicates(ledger: Ledger, arch: str, fw: str, run: Path, losses: Any) -> list[dict[str, Any]] | None:
    """The end-of-training replicates in folder `run` (the replicates stage's, or a data-parallel run's), each
    with its test figures, test predictions and BatchNorm running statistics, checked to belong to the run whose
    step losses are `losses` (their digest) and to the arrays their record hashed; a failure is
    REPLICATES_READABLE under `fw` ("torch", or "torch-dp") and gives None."""
    try:
        record = read_json(run / paths.REPLICATES_RECORD)
        if record["run_step_losses_sha256"] != losses_sha256(losses):
            raise ValueError("trained from another run (its step losses' digest differs): the replicates stage is "
                             "older than the run")
        if record["arrays_sha256"] != sha256(run / paths.REPLICATES_ARRAYS):
            raise ValueError(f"{paths.REPLICATES_ARRAYS} altered since the replicates were trained")
        with np.load(run / paths.REPLICATES_ARRAYS, allow_pickle=False) as f:
            arrays = {key: f[key] for key in f.files}
        reps = [{**r, "test_predictions": arrays["test_predictions"][i],
                 "statistics": {k: v[i] for k, v in arrays.items() if k != "test_predictions"}}
                for i, r in enumerate(record["replicates"])]
        if not reps or len(arrays["test_predictions"]) != len(reps):
            raise ValueError(f"{len(reps)} replicates, {len(arrays['test_predictions'])} test predictions")
    except (OSError, KeyError, ValueError, TypeError, IndexError) as error:
        ledger.add(arch, fw, names.REPLICATES_READABLE, None, None, False, f"{run}: {type(error).__name__}: {error}")
        return None
    return reps


NullOf = Callable[[], dict[str, Any] | None]


def end_of_training(ledger: Ledger, arch: str, pair: str, check: str, value: float, tolerance: float | None,
                    parting: int | None, null: NullOf) -> None:
    """One end-of-training figure of a pair of runs. Within its float32 bound it passes; beyond it, runs in
    lockstep to the end fail, and runs that parted are judged by `null()`: the test of that figure over the
    runs and their replicates (replicate_null.pooled_null, shared by every pair it judges), None where there
    are no replicates, which fails naming params.yaml's list."""
    if tolerance is not None and value <= tolerance:
        where = "in lockstep to the end" if parting is None else f"runs part at step {parting}"
        ledger.add(arch, pair, check, value, tolerance, True, f"{where}; within the float32 bound")
        return
    judged = None if parting is None else null()
    if judged is None:
        why = ("the runs are in lockstep to the end, so the float32 bound holds" if parting is None else
               f"the runs part at step {parting} and there are no replicates to judge against (params.yaml "
               "replicates.models, artifacts/null_plan.json)")
        ledger.add(arch, pair, check, value, tolerance, False, why)
        return
    sizes = ", ".join(f"{name} {n}" for name, n in judged["groups"].items())
    ledger.add_null(arch, pair, check, value, tolerance, judged,
                    f"runs part at step {parting}: pooled permutation test over each run and its parted "
                    f"replicates ({sizes}), pseudo-F {judged['statistic'] or 0:.3g}, p = {judged['p_value']:.3g}")


def replicate_figures(spec: Spec, arch: str, fw: str, run: dict[str, Any], train_size: int) -> list[dict[str, Any]]:
    """Each replicate's test figures, and the step where it parts from its framework's own run (None: never)."""
    if not run["replicates"]:
        return []
    own = read_step_losses(paths.train_log(arch, fw), plan(spec, arch, train_size).num_steps)
    return [{"replicate": r["replicate"], "test_accuracy": r["test_accuracy"], "test_loss": r["test_loss"],
             "parts_from_run_at_step": parting_step(r["step_losses"], own, spec.tolerances.lockstep_loss_rel)}
            for r in run["replicates"]]


def parted(run: dict[str, Any], tolerance: float) -> list[bool]:
    """Per replicate of `run` (a record with its "step_losses" and "replicates"): whether it parted from the run
    (their step losses beyond `tolerance`, tolerances.lockstep_loss_rel, at some step)."""
    return [parting_step(r["step_losses"], run["step_losses"], tolerance) is not None
            for r in run["replicates"] or []]


def null_group(run: dict[str, Any], tolerance: float) -> list[dict[str, Any]]:
    """One side of the pooled test: the run and those of its replicates that parted from it (one that never parted
    ends where the run ends: a second copy of one draw, not a draw of its own), as the same kind of record."""
    return [run, *(r for r, p in zip(run["replicates"] or [], parted(run, tolerance), strict=True) if p)]


def disagreement(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The share of test images two runs classify differently."""
    return float(np.mean(a["test_predictions"] != b["test_predictions"]))


def parting_record(arch: str, runs: dict[str, dict[str, Any]], across: dict[str, int | None], tolerance: float
                   ) -> dict[str, Any] | None:
    """Where a model's trainings part (rosetta_common.metrics.parting_step at `tolerance`, lockstep_loss_rel; None:
    in lockstep to the end): within each framework, its run against each end-of-training replicate and each two
    replicates; across frameworks, the runs (`across`, the training-parity figures' parting steps). None for a model
    without such replicates. The measured null is the null it names only where the replicates part as early as the
    frameworks' runs part from each other (docs/judge.md, "Where the trainings part")."""
    if not any(run.get("replicates") for run in runs.values()):
        return None
    within = {}
    for fw, run in runs.items():
        if "step_losses" not in run:  # its training record was unreadable (TRAINING_RECORD_READABLE)
            continue
        reps = [r["step_losses"] for r in run.get("replicates") or []]
        within[fw] = {"run": [parting_step(run["step_losses"], r, tolerance) for r in reps],
                      "replicates": [parting_step(a, b, tolerance) for a, b in itertools.combinations(reps, 2)]}
    steps = max((len(run["step_losses"]) for run in runs.values() if "step_losses" in run), default=0)
    return {"model": arch, "steps": steps, "within": within, "across": across}
