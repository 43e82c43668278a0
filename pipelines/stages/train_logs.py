"""train_log.json as the validator reads it back: the one reader of the single-process runs' logs
(validate.py) and of the data-parallel runs' (validate_data_parallel.py), so both refuse a bad log alike, and the
one comparison of two runs' step losses (lockstep_figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipelines.stages import StageError
from rosetta_common.io import read_json
from rosetta_common.metrics import max_abs_diff, parting_step, relative_diff
from rosetta_common.spec import TolerancesSpec


def read_step_losses(path: Path, expected_steps: int, workers: int = 1) -> np.ndarray:
    """The log's step losses, checked: `expected_steps` finite numbers (what the plan makes the stage take), from a
    run on `workers` workers (a log without the field is a single-process run's)."""
    log: Any = read_json(path)
    losses = np.asarray(log.get("step_losses", []), dtype=np.float64) if isinstance(log, dict) else np.zeros(0)
    if losses.shape != (expected_steps,) or not np.isfinite(losses).all():
        raise StageError(f"{path}: step_losses has {losses.size} values (finite: {bool(np.isfinite(losses).all())}), "
                         f"expected {expected_steps} finite losses")
    if int(log.get("workers", 1)) != workers:
        raise StageError(f"{path}: workers = {log.get('workers', 1)}, expected {workers}")
    return losses


def lockstep_figures(a: np.ndarray, b: np.ndarray, steps_per_epoch: int, tol: TolerancesSpec) -> dict[str, Any]:
    """Two runs' step losses compared, for single-process and data-parallel pairs alike: step 1, the lockstep
    window (the first tolerances.lockstep_steps steps, judged for every model), the step where they part (None:
    in lockstep to the end), and as figures the first epoch and every step."""
    rel = relative_diff(a, b)
    return {
        "step1_loss_rel": float(rel[0]),
        "lockstep_steps": min(tol.lockstep_steps, len(rel)),
        "lockstep_loss_max_rel": float(rel[:tol.lockstep_steps].max()),
        "parting_step": parting_step(a, b, tol.lockstep_loss_rel),
        "first_epoch_loss_max_rel": float(rel[:steps_per_epoch].max()),
        "all_steps_loss_max_rel": float(rel.max()),
        "all_steps_loss_max_abs": max_abs_diff(a, b),
    }
