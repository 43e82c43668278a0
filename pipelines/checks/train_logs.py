"""train_log.json as the validator reads it back: the one reader of the single-process runs' logs
(parity.py) and of the data-parallel runs' (data_parallel.py), so both refuse a bad log alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipelines.checks.ledger import CheckError
from rosetta_common.io import read_json


def read_step_losses(path: Path, expected_steps: int, workers: int = 1) -> np.ndarray:
    """The log's step losses, checked: `expected_steps` finite numbers (what the plan makes the stage take), from a
    run on `workers` workers (a log without the field is a single-process run's)."""
    log: Any = read_json(path)
    losses = np.asarray(log.get("step_losses", []), dtype=np.float64) if isinstance(log, dict) else np.zeros(0)
    if losses.shape != (expected_steps,) or not np.isfinite(losses).all():
        raise CheckError(f"{path}: step_losses has {losses.size} values (finite: {bool(np.isfinite(losses).all())}), "
                         f"expected {expected_steps} finite losses")
    if int(log.get("workers", 1)) != workers:
        raise CheckError(f"{path}: workers = {log.get('workers', 1)}, expected {workers}")
    return losses
