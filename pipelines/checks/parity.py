"""Training parity: every pairwise figure, computed by one function (pair_figures) for every kind of pair: two
frameworks' trained runs, a data-parallel run against its single-process run or another framework's, and the GPU
check's CUDA run against its CPU run (ledger.FIGURES says what each figure is and which check judges it). Also
BatchNorm's running statistics after training. No ONNX Runtime here: the GPU check imports this on the host."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import FIGURES, Ledger
from pipelines.checks.replicate_null import pooled_null
from pipelines.checks.replicates import NullOf, disagreement, end_of_training, null_group
from pipelines.checks.train_logs import read_step_losses
from rosetta_common.errors import RosettaError
from rosetta_common.metrics import max_abs_diff, parting_step, relative_diff
from rosetta_common.spec import ModelConfig, Spec, TolerancesSpec
from rosetta_common.training import plan
from rosetta_common.weights import Weights, is_statistic, load_weights


@dataclass(frozen=True)
class Side:
    """One side of a pair: a trained run's step losses and test figures, and its canonical weights where read."""

    losses: np.ndarray
    test_loss: float
    test_accuracy: float
    weights: Weights | None = None


def pair_figures(a: Side, b: Side, steps_per_epoch: int | None = None,
                 tol: TolerancesSpec | None = None) -> dict[str, Any]:
    """Every pairwise figure of two trained runs: step-1 loss; given the tolerances, the lockstep window (the first
    tolerances.lockstep_steps steps) and the step where the runs part (None: in lockstep to the end); the first
    epoch's steps (given its length), every step, test loss and accuracy, and the final weights (where both sides
    have them)."""
    rel = relative_diff(a.losses, b.losses)
    figures: dict[str, Any] = {"step1_loss_rel": float(rel[0])}
    if tol is not None:
        figures |= {"lockstep_steps": min(tol.lockstep_steps, len(rel)),
                    "lockstep_loss_max_rel": float(rel[:tol.lockstep_steps].max()),
                    "parting_step": parting_step(a.losses, b.losses, tol.lockstep_loss_rel)}
    if steps_per_epoch is not None:
        figures["first_epoch_loss_max_rel"] = float(rel[:steps_per_epoch].max())
    figures |= {
        "all_steps_loss_max_rel": float(rel.max()),
        "all_steps_loss_max_abs": max_abs_diff(a.losses, b.losses),
        "test_loss_rel": float(relative_diff(a.test_loss, b.test_loss)),
        "test_accuracy_diff_points": 100 * abs(a.test_accuracy - b.test_accuracy),
    }
    if a.weights is not None and b.weights is not None:
        figures["final_weights_max_abs"] = max(max_abs_diff(a.weights[k], b.weights[k]) for k in a.weights)
    return figures


def judge_pair(ledger: Ledger, arch: str, pair: str, figures: dict[str, Any], tol: Any, dp: bool = False) -> None:
    """The strict checks of one pair's figures (FIGURES), each against its tolerance in `tol`: those of the
    lockstep, for a pair of frameworks and a pair with a data-parallel run alike (the end-of-training figures are
    judged by judge_end)."""
    for figure in FIGURES:
        check = figure.dp_check if dp else figure.check
        if check is None or figure.tolerance is None or figure.end_of_training:
            continue
        detail = ""
        if figure.key == "lockstep_loss_max_rel":
            detail = f"steps 1-{figures['lockstep_steps']}; the runs part at step {figures['parting_step']}"
        ledger.add(arch, pair, check, figures[figure.key], getattr(tol, figure.tolerance), detail=detail)


# Each end-of-training figure of a pair of frameworks: its key in the pair's figures and its distance between any
# two runs (the run itself or a replicate: replicates.null_group), for the null.
END_OF_TRAINING: dict[str, Callable[[dict[str, Any], dict[str, Any]], float]] = {
    "test_loss_rel": lambda x, y: float(relative_diff(x["test_loss"], y["test_loss"])),
    "test_accuracy_diff_points": lambda x, y: 100 * abs(x["test_accuracy"] - y["test_accuracy"]),
    "prediction_disagreement": disagreement,
}


def training_parity(spec: Spec, ledger: Ledger, arch: str, runs: dict[str, dict[str, Any]], data: Any,
                    config: ModelConfig) -> tuple[list[dict[str, Any]], dict[str, Weights]]:
    """Pairwise training figures and checks: strict in the lockstep window, end-of-training figures by
    replicates.end_of_training; also returns each framework's trained canonical weights (read here once, for
    running_statistics)."""
    tol = spec.tolerances
    train_plan = plan(spec, arch, len(data.train_labels))
    logs, weights = {}, {}
    for fw in runs:
        try:
            logs[fw] = read_step_losses(paths.train_log(arch, fw), train_plan.num_steps)
            runs[fw]["step_losses"] = logs[fw]  # its replicates' parting steps, for the null
            weights[fw] = load_weights(paths.trained_weights(arch, fw), config)
        except RosettaError as error:
            ledger.add(arch, fw, names.TRAINING_RECORD_READABLE, None, None, False, str(error))
    figures = []
    nulls = shared_nulls(arch, {fw: runs[fw] for fw in logs}, tol.lockstep_loss_rel)
    for a, b in itertools.combinations(logs, 2):
        sides = [Side(logs[fw], runs[fw]["test_loss"], runs[fw]["test_accuracy"], weights[fw]) for fw in (a, b)]
        pair = f"{a}|{b}"
        fig = {"model": arch, "frameworks": pair, "optimizer": spec.train.optimizer,
               **pair_figures(*sides, train_plan.steps_per_epoch, tol),
               "prediction_disagreement": disagreement(runs[a], runs[b])}
        figures.append(fig)
        judge_pair(ledger, arch, pair, fig, tol)
        judge_end(ledger, arch, pair, fig, tol, nulls)
    return figures, weights


def shared_nulls(arch: str, runs: dict[str, dict[str, Any]], tolerance: float, pair: str = ""
                 ) -> Callable[[str], NullOf]:
    """Per end-of-training figure, its null over `runs` (each side's run and its parted replicates,
    replicates.null_group): one pooled test that every pair of those runs shares, computed the first time a pair
    needs it (None where a side has no replicates), marked `look` "interim" where every run holds only the
    replicates of the interim look (its "interim" key). `pair` names the test of a pair that is judged alone (a
    data-parallel run and another run)."""
    done: dict[str, dict[str, Any] | None] = {}

    def null_of(key: str, distance: Callable[[Any, Any], float] | None = None) -> NullOf:
        def null() -> dict[str, Any] | None:
            if key not in done:
                if any(run["replicates"] is None for run in runs.values()):
                    done[key] = None
                else:
                    groups = {fw: null_group(run, tolerance) for fw, run in runs.items()}
                    done[key] = pooled_null(groups, distance or END_OF_TRAINING[key],
                                            f"{arch} {key} {pair or '|'.join(runs)}")
                    if all(run.get("interim") for run in runs.values()):  # the interim look's samples only
                        done[key]["look"] = "interim"
            return done[key]
        return null

    return null_of


def judge_end(ledger: Ledger, arch: str, pair: str, fig: dict[str, Any], tol: TolerancesSpec,
              nulls: Callable[[str], NullOf], dp: bool = False) -> None:
    """The end-of-training checks of one pair (two frameworks' runs, or a data-parallel run and another run):
    each figure within its float32 bound passes; beyond it, runs still in lockstep fail and runs that parted are
    judged against the figure's null (`nulls`, shared_nulls: the pooled test over every framework's run and
    its replicates, or over the pair's two)."""
    parting = fig["parting_step"]
    for figure in FIGURES:
        check = figure.dp_check if dp else figure.check
        if not figure.end_of_training or check is None:
            continue
        if figure.tolerance is None and parting is None:
            continue  # no float32 bound but none at all: runs in lockstep to the end are judged by the others
        bound = getattr(tol, figure.tolerance) if figure.tolerance is not None else 0.0
        end_of_training(ledger, arch, pair, check, fig[figure.key], bound, parting, nulls(figure.key))


def statistic_rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the tensor's largest magnitude: a running mean near 0 in one channel does not blow the
    figure up, and a variance of 40 is judged at its own scale."""
    scale = max(float(np.abs(a).max()), float(np.abs(b).max()))
    return max_abs_diff(a, b) / scale if scale > 0 else 0.0


def statistics_by_layer(a: Weights, b: Weights) -> dict[str, dict[str, float]]:
    """statistic_rel of every BatchNorm running statistic, by layer: {layer: {"running_mean": ..., ...}}."""
    layers: dict[str, dict[str, float]] = {}
    for name in (n for n in a if is_statistic(n)):
        layer, statistic = name.rsplit(".", 1)
        layers.setdefault(layer, {})[statistic] = statistic_rel(a[name], b[name])
    return layers


def worst_layer(layers: dict[str, dict[str, float]], statistic: str) -> tuple[float, str]:
    worst = max(layers, key=lambda layer: layers[layer].get(statistic, -1.0))
    return layers[worst][statistic], worst


def running_statistics(spec: Spec, ledger: Ledger, arch: str, weights: dict[str, Weights],
                       runs: dict[str, dict[str, Any]], parting: dict[str, int | None]) -> list[dict[str, Any]]:
    """BatchNorm running mean and variance after training, pairwise, from each framework's trained canonical file
    (rosetta_common.weights.is_statistic names them): one figure per pair with each layer's, and a check per
    statistic (its worst layer), judged as every end-of-training figure is (replicates.end_of_training: the
    float32 bound, or after parting the replicates' null). Nothing for a model without BatchNorm."""
    tol = spec.tolerances.running_stats_rel
    figures = []
    # Each statistic's null over every framework's trained state and its parted replicates' (their statistics).
    states = {fw: {**runs[fw], "statistics": weights[fw]} for fw in weights}
    nulls = shared_nulls(arch, states, spec.tolerances.lockstep_loss_rel)
    for a, b in itertools.combinations(weights, 2):
        layers = statistics_by_layer(weights[a], weights[b])
        if not layers:
            break
        pair = f"{a}|{b}"
        fig: dict[str, Any] = {"model": arch, "frameworks": pair}
        for statistic in names.RUNNING_STATISTICS:
            value, worst = worst_layer(layers, statistic)
            fig[f"{statistic}_max_rel"] = value
            null = nulls(names.statistic_check(statistic),
                         lambda x, y, s=statistic: worst_layer(statistics_by_layer(x["statistics"],
                                                                                   y["statistics"]), s)[0])
            end_of_training(ledger, arch, pair, names.statistic_check(statistic), value, tol, parting.get(pair),
                            null)
            last = ledger.checks[-1]
            ledger.checks[-1] = replace(last, detail=f"worst layer {worst}; {last.detail}")
        figures.append({**fig, "layers": layers})
    return figures
