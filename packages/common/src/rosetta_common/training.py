"""What one model's training run is, decided once for every framework: the optimizer with its learning rate
resolved for that model, the epochs, and the exact batches in their exact order.

Each package's `train(model, plan, data)` consumes a TrainPlan; none of them reads params.yaml's optimizer
section or resolves a per-model learning rate on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rosetta_common.data import epoch_batches
from rosetta_common.seeding import derive_seed
from rosetta_common.spec import AdamSpec, ModelConfig, SGDSpec, Spec, SpecError

OptimizerSpec = AdamSpec | SGDSpec


@dataclass(frozen=True)
class TrainPlan:
    arch: str
    optimizer: OptimizerSpec  # learning_rate is one number here: this model's
    epochs: int
    batch_size: int
    seed: int
    num_samples: int
    # Only the first `first_steps` steps of the first epoch (a lockstep checkpoint: the run's state after that
    # step, the same batches and dropout masks); None: the whole plan.
    first_steps: int | None = None
    # 0: each batch's rows in the plan's order. i >= 1 (replicate i of the measured null): every step's batch
    # holds the same samples with the same dropout masks, its rows in an order drawn from (seed, i): the same
    # arithmetic summed in other orders, so other roundings at every step, as another framework's kernels give.
    row_order: int = 0
    # A truncated plan's whole run, in steps (truncated() sets it; None: this plan is the whole run). A schedule
    # precomputed over the run (rosetta_jax's Adam table) is sized by it, so that a run stopped early takes the
    # very optimizer, and in JAX the very compiled step, of the run it is the start of.
    whole_steps: int | None = None

    @property
    def optimizer_name(self) -> str:
        return "adam" if isinstance(self.optimizer, AdamSpec) else "sgd"

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.learning_rate)  # type: ignore[arg-type]

    @property
    def steps_per_epoch(self) -> int:
        full = self.num_samples // self.batch_size
        return full if self.first_steps is None else min(full, self.first_steps)

    @property
    def num_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def schedule_steps(self) -> int:
        """The steps of the whole run this plan is, or is the start of (at least num_steps)."""
        return self.num_steps if self.whole_steps is None else self.whole_steps

    def batches(self, epoch: int) -> list[np.ndarray]:
        """Index batches of one epoch (rosetta_common.data.epoch_batches): the same in every framework; with a
        row_order, each batch's rows in that order (row_permutations)."""
        batches = epoch_batches(self.num_samples, self.batch_size, self.seed, epoch)[:self.steps_per_epoch]
        if not self.row_order:
            return batches
        first = epoch * self.steps_per_epoch
        orders = self.row_permutations()[first:first + len(batches)]
        return [idx[order] for idx, order in zip(batches, orders, strict=True)]

    def row_permutations(self) -> np.ndarray:
        """(num_steps, batch_size): step s's batch takes its rows in the order row_permutations()[s] (the identity
        for row_order 0). A truncated plan's are the first steps' of its whole plan's (one generator, drawn
        step after step), so a replicate's lockstep checkpoints are the states its whole run passes through."""
        if not self.row_order:
            return np.tile(np.arange(self.batch_size), (self.num_steps, 1))
        rng = np.random.default_rng(derive_seed(self.seed, "rows", str(self.row_order)))
        return np.argsort(rng.random((self.num_steps, self.batch_size)), axis=1, kind="stable")

    def replicate(self, replicate: int) -> TrainPlan:
        """This plan for replicate `replicate` of the measured null (1, 2, ...): its rows in their own order."""
        if replicate < 1:
            raise ValueError(f"replicate {replicate}: replicates are numbered from 1")
        return replace(self, row_order=replicate)

    def truncated(self, steps: int) -> TrainPlan:
        """This plan's first `steps` steps (all within the first epoch): every package's loop, run on it, ends in
        the state its whole run has after that step."""
        if not 1 <= steps <= self.num_samples // self.batch_size:
            raise SpecError(f"params.yaml: tolerances.lockstep_checkpoints: step {steps}: must be within the first "
                            f"epoch, 1..{self.num_samples // self.batch_size} steps here")
        return replace(self, epochs=1, first_steps=steps, whole_steps=self.schedule_steps)

    def all_batches(self) -> np.ndarray:
        """Every epoch's index batches, in order: (num_steps, batch_size) int64."""
        return np.stack([idx for epoch in range(self.epochs) for idx in self.batches(epoch)]).astype(np.int64)

    def describe(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer_name, "learning_rate": self.learning_rate, "epochs": self.epochs,
                "batch_size": self.batch_size, "steps_per_epoch": self.steps_per_epoch}


@dataclass(frozen=True)
class StepHook:
    """What train(model, plan, data, hook) calls during the run: `call(step, model)` right after each of `steps`
    (1-based, counted over all epochs), the model in inference mode holding the state after that step (what the
    same training on plan.truncated(step) ends in). `call` may only read the model (predict, to_canonical); the
    run goes on bit for bit as it would without the hook. It is how the lockstep checkpoints are taken from the
    run itself: stopping a fresh run at each step instead costs a build and, in TF and JAX, a compile per stop."""

    steps: Collection[int]
    call: Callable[[int, Any], None]

    def __call__(self, step: int, model: Any) -> None:
        if step in self.steps:
            self.call(step, model)


def plan(spec: Spec, arch: str, num_samples: int) -> TrainPlan:
    """The one place a learning rate or epochs given per model ({mlp: 3e-3, ...}) are resolved to numbers."""
    chosen = spec.optimizer
    optimizer = chosen.model_copy(update={"learning_rate": spec.learning_rate(arch)})
    epoch_batches(num_samples, spec.train.batch_size, spec.seed, 0)  # raises SpecError if the batch is too large
    return TrainPlan(arch=arch, optimizer=optimizer, epochs=spec.epochs(arch), batch_size=spec.train.batch_size,
                     seed=spec.seed, num_samples=int(num_samples))


def dropout_features(config: ModelConfig) -> int | None:
    """Width of the activations a model drops out during training (None: the model has no dropout)."""
    rate = getattr(config.settings, "dropout", 0.0)
    if not rate:
        return None
    if config.arch == "resnet":
        return config.settings.block_filters  # the pooled features before the head
    raise ValueError(f"architecture {config.arch!r} has a dropout rate but no dropout layer")


def dropout_masks(plan: TrainPlan, config: ModelConfig) -> np.ndarray | None:
    """Every step's dropout mask, (num_steps, batch_size, features) float32 holding 0 (dropped) or
    1 / (1 - rate) (kept, scaled as inverted dropout scales), or None for a model without dropout.

    Each framework's dropout op draws its mask from its own generator (torch's, TF's, JAX's threefry), so
    three frameworks can never drop the same units; drawn here from the seed, and multiplied in by each
    framework, they do, and training parity stays exact. Row s of the result is step s's mask; step s's
    batch sample j uses row [s, j] (data-parallel workers take their slice of it). A plan with a row_order
    reorders each step's rows as it reorders the batch's (TrainPlan.row_permutations): each sample keeps its mask."""
    features = dropout_features(config)
    if features is None:
        return None
    rate = float(config.settings.dropout)
    rng = np.random.default_rng(derive_seed(plan.seed, "dropout", plan.arch))
    keep = rng.random((plan.num_steps, plan.batch_size, features)) >= rate
    masks = np.where(keep, np.float32(1.0 / (1.0 - rate)), np.float32(0.0)).astype(np.float32)
    if plan.row_order:
        masks = np.take_along_axis(masks, plan.row_permutations()[:, :, None], axis=1)
    return masks
