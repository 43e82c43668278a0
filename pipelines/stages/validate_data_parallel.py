"""The validate stage's data-parallel checks (train_dp@<framework>; off when data_parallel.workers is 1).

Each framework's N-worker run against the same framework's single-process run (the claim: the engine's
data-parallel training is the same training), and the N-worker runs of the frameworks against each other, with
the trained-run bounds of params.yaml's tolerances (a model's tolerances.models and data_parallel.bounds
applied): step-1 loss, every step of the lockstep window (tolerances.lockstep_steps; the step where the runs part
is a figure), test loss, test accuracy, plus the final weight difference as a figure. Test figures are computed
here from each run's trained canonical weights with the float64 reference forward, the same way for both sides of
every pair: nothing is taken from the stage that trained them.
"""

from __future__ import annotations

import itertools
from typing import Any

from pipelines import paths
from pipelines.stages.train_logs import lockstep_figures, read_step_losses
from rosetta_common.data import Dataset
from rosetta_common.errors import RosettaError
from rosetta_common.metrics import accuracy, max_abs_diff, relative_diff, softmax_cross_entropy
from rosetta_common.reference import forward
from rosetta_common.spec import ModelConfig, Spec, TolerancesSpec
from rosetta_common.training import TrainPlan, plan
from rosetta_common.weights import Weights, load_weights


class Run:
    """One trained run as the validator reads it: step losses, canonical weights, test figures computed here."""

    def __init__(self, log_path: Any, weights_path: Any, config: ModelConfig, train_plan: TrainPlan,
                 data: Dataset, workers: int) -> None:
        self.losses = read_step_losses(log_path, train_plan.num_steps, workers)
        self.weights: Weights = load_weights(weights_path, config)
        logits = forward(config, self.weights, data.test_images)
        self.test_loss = softmax_cross_entropy(logits, data.test_labels)
        self.test_accuracy = accuracy(logits, data.test_labels)


def compare(a: Run, b: Run, steps_per_epoch: int, tol: TolerancesSpec) -> dict[str, Any]:
    return {
        **lockstep_figures(a.losses, b.losses, steps_per_epoch, tol),
        "test_loss_rel": float(relative_diff(a.test_loss, b.test_loss)),
        "test_accuracy_diff_points": 100 * abs(a.test_accuracy - b.test_accuracy),
        "final_weights_max_abs": max(max_abs_diff(a.weights[k], b.weights[k]) for k in a.weights),
    }


CHECKS = (("dp_step1_loss_rel", "step1_loss_rel", "step1_loss_rel"),
          ("dp_lockstep_loss_rel", "lockstep_loss_max_rel", "lockstep_loss_rel"),
          ("dp_test_loss_rel", "test_loss_rel", "test_loss_rel"),
          ("dp_test_accuracy_points", "test_accuracy_diff_points", "test_accuracy_points"))


def data_parallel_parity(spec: Spec, checks: Any, data: Dataset, intact: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """Figures per (model, pair) and checks into `checks`; nothing when data-parallel training is off. A
    single-process run not in `intact` (it failed artifacts_intact) is compared with nothing, as in validate."""
    dp = spec.data_parallel
    if dp.workers == 1:
        return []
    figures = []
    for arch in dp.models:
        tol = dp.tolerances(spec.tolerances, arch)  # tolerances.models and data_parallel.bounds applied
        config = ModelConfig.of(spec, arch, data.image_shape, data.num_classes)
        train_plan = plan(spec, arch, len(data.train_labels))
        single, parallel = {}, {}
        for fw in spec.frameworks:
            try:
                if (arch, fw) in intact:
                    single[fw] = Run(paths.train_log(arch, fw), paths.trained_weights(arch, fw), config,
                                     train_plan, data, 1)
                run = paths.data_parallel_run(arch, fw)
                parallel[fw] = Run(run / "train_log.json", run / "trained.safetensors", config, train_plan, data,
                                   dp.workers)
            except (RosettaError, OSError, ValueError) as error:
                checks.add(arch, f"{fw}-dp", "dp_run_readable", None, None, False, str(error))
        pairs = [(f"{fw}-dp", parallel[fw], fw, single[fw]) for fw in parallel if fw in single]
        pairs += [(f"{a}-dp", parallel[a], f"{b}-dp", parallel[b]) for a, b in itertools.combinations(parallel, 2)]
        for name_a, run_a, name_b, run_b in pairs:
            fig = {"model": arch, "runs": f"{name_a}|{name_b}", "workers": dp.workers,
                   **compare(run_a, run_b, train_plan.steps_per_epoch, tol)}
            for check, figure, bound in CHECKS:
                checks.add(arch, f"{name_a}|{name_b}", check, fig[figure], getattr(tol, bound))
            figures.append(fig)
        for fw, run in parallel.items():
            figures.append({"model": arch, "runs": f"{fw}-dp", "workers": dp.workers,
                            "test_loss": run.test_loss, "test_accuracy": run.test_accuracy})
    return figures
