"""The data-parallel checks (train_dp@<framework>; off when data_parallel.workers is 1).

Each framework's N-worker run against the same framework's single-process run (the claim: the engine's
data-parallel training is the same training), and the N-worker runs of the frameworks against each other, by the
rules two frameworks' runs are judged by (pipelines/checks/parity.py): strict while in lockstep (step-1 loss,
every step of the lockstep window; the step where the runs part is a figure); at the end of training, test loss
and accuracy within their float32 bounds, or, once the runs part, against the null of both sides' replicates
(a data-parallel run of a model artifacts/null_plan.json names trains its own, on every worker): one pooled test
per pair and figure, Holm over the whole validate run. No weaker bound for any model. The final weight difference
is a figure. Test figures are computed here from each run's trained canonical weights with the float64 reference
forward, the same way for both sides of every pair: nothing is taken from the stage that trained them (the
replicates' own, as for two frameworks, are their stage's).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Ledger
from pipelines.checks.parity import Side, judge_end, judge_pair, pair_figures, shared_nulls
from pipelines.checks.replicates import all_replicates, read_replicates
from pipelines.checks.train_logs import read_step_losses
from rosetta_common.data import Dataset, load_for
from rosetta_common.errors import RosettaError
from rosetta_common.metrics import accuracy, softmax_cross_entropy
from rosetta_common.reference import forward
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.training import TrainPlan, plan
from rosetta_common.weights import load_weights


def read_run(log_path: Any, weights_path: Any, config: ModelConfig, train_plan: TrainPlan, data: Dataset,
             workers: int) -> tuple[Side, np.ndarray]:
    """One trained run as the validator reads it: step losses, canonical weights, test figures computed here;
    and its test predictions."""
    losses = read_step_losses(log_path, train_plan.num_steps, workers)
    weights = load_weights(weights_path, config)
    logits = forward(config, weights, data.test_inputs)
    side = Side(losses, softmax_cross_entropy(logits, data.test_labels), accuracy(logits, data.test_labels), weights)
    return side, np.argmax(logits, axis=1)


def end_record(side: Side, predictions: np.ndarray, reps: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A run as judge_end reads one: its test figures, predictions and step losses, and its replicates."""
    return {"test_loss": side.test_loss, "test_accuracy": side.test_accuracy, "test_predictions": predictions,
            "step_losses": side.losses, "replicates": reps}


def data_parallel_parity(spec: Spec, ledger: Ledger, cache: dict[str, Dataset],
                         intact: set[tuple[str, str]], planned: list[str], more: list[str]) -> list[dict[str, Any]]:
    """Figures per (model, pair) and checks into `ledger`; nothing when data-parallel training is off. A
    single-process run not in `intact` (it failed artifacts_intact) is compared with nothing, as in validate;
    `planned`: the models with end-of-training replicates (artifacts/null_plan.json), `more`: those with more after
    the interim look (artifacts/null_interim.json)."""
    dp = spec.data_parallel
    if dp.workers == 1:
        return []
    figures = []
    tol = spec.tolerances
    for arch in dp.models:
        data = load_for(arch, paths.PREPARED, cache)  # `cache`: validate's prepared data, each kind read once
        config = data.model_config(spec, arch)
        train_plan = plan(spec, arch, len(data.train_labels))
        single, parallel = {}, {}
        for fw in spec.frameworks:
            try:
                if (arch, fw) in intact:
                    side, predicted = read_run(paths.train_log(arch, fw), paths.trained_weights(arch, fw), config,
                                               train_plan, data, 1)
                    reps = (all_replicates(ledger, arch, fw, side.losses, arch in more, spec.replicates.at_most)
                            if arch in planned else None)
                    single[fw] = (side, end_record(side, predicted, reps))
                run = paths.data_parallel_run(arch, fw)
                side, predicted = read_run(run / "train_log.json", run / "trained.safetensors", config, train_plan,
                                           data, dp.workers)
                reps = read_replicates(ledger, arch, f"{fw}-dp", run, side.losses) if arch in planned else None
                parallel[fw] = (side, end_record(side, predicted, reps))
            except (RosettaError, OSError, ValueError) as error:
                ledger.add(arch, f"{fw}-dp", names.DP_RUN_READABLE, None, None, False, str(error))
        pairs = [(f"{fw}-dp", parallel[fw], fw, single[fw]) for fw in parallel if fw in single]
        pairs += [(f"{a}-dp", parallel[a], f"{b}-dp", parallel[b]) for a, b in itertools.combinations(parallel, 2)]
        for name_a, (run_a, end_a), name_b, (run_b, end_b) in pairs:
            pair = f"{name_a}|{name_b}"
            fig = {"model": arch, "runs": pair, "workers": dp.workers,
                   **pair_figures(run_a, run_b, train_plan.steps_per_epoch, tol)}
            judge_pair(ledger, arch, pair, fig, tol, dp=True)
            nulls = shared_nulls(arch, {name_a: end_a, name_b: end_b}, tol.lockstep_loss_rel, pair)
            judge_end(ledger, arch, pair, fig, tol, nulls, dp=True)
            figures.append(fig)
        for fw, (run, _) in parallel.items():
            figures.append({"model": arch, "runs": f"{fw}-dp", "workers": dp.workers,
                            "test_loss": run.test_loss, "test_accuracy": run.test_accuracy})
    return figures
