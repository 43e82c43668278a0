"""After two runs part: the replicates each framework trained (train_export's train_replicates), read back
and tied to the run, and the rule that judges every end-of-training figure (end_of_training): within its float32
bound it passes; beyond it, runs still in lockstep fail, and runs that parted are judged against the replicates'
null (replicate_null), decided for the whole run at once by Ledger.judge_nulls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Ledger
from pipelines.checks.replicate_null import rank_sum_p
from pipelines.checks.train_logs import read_step_losses
from rosetta_common.io import read_json
from rosetta_common.metrics import parting_step
from rosetta_common.spec import Spec
from rosetta_common.training import plan


def read_replicates(ledger: Ledger, arch: str, fw: str, count: int, run: Path | None = None
                    ) -> list[dict[str, Any]] | None:
    """The run's replicates, each with its test figures, test predictions and BatchNorm running statistics; None
    when params ask for none. `fw` names the run in the ledger ("torch", or "torch-dp" with `run` its
    data-parallel folder); a train_export run's replicate files are among those export.json hashed, so
    artifacts_intact has already tied them to the run."""
    if not count:
        return None
    run = paths.run_dir(arch, fw) if run is None else run
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
        ledger.add(arch, fw, names.REPLICATES_READABLE, None, None, False, f"{run}: {type(error).__name__}: {error}")
        return None
    return reps


def end_of_training(ledger: Ledger, arch: str, pair: str, check: str, value: float, tolerance: float | None,
                    parting: int | None, null: tuple[list[float], list[float]] | None) -> None:
    """One end-of-training figure of a pair of frameworks (`null`: its cross-framework distances and the
    within-framework ones of replicates that parted from their run, or None where there are no replicates)."""
    if tolerance is not None and value <= tolerance:
        where = "in lockstep to the end" if parting is None else f"runs part at step {parting}"
        ledger.add(arch, pair, check, value, tolerance, True, f"{where}; within the float32 bound")
        return
    if parting is None or null is None:
        why = ("the runs are in lockstep to the end, so the float32 bound holds" if parting is None else
               f"the runs part at step {parting} and there are no replicates to judge against (params.yaml "
               "replicates: add the model to replicates.models)")
        ledger.add(arch, pair, check, value, tolerance, False, why)
        return
    cross, within = null
    p = rank_sum_p(cross, within)
    ledger.add_null(arch, pair, check, value, tolerance, {"cross": cross, "within": within, "p_value": p},
                    f"runs part at step {parting}: cross-framework median {np.median(cross):.3g} against "
                    f"within-framework {np.median(within):.3g} (replicates), p = {p:.3g}")


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


def end_figures(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run and its replicates as the same kind of record: test loss, accuracy and predictions."""
    return [run, *(run["replicates"] or [])]


def disagreement(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The share of test images two runs classify differently."""
    return float(np.mean(a["test_predictions"] != b["test_predictions"]))
