"""What one model's training run is, decided once for every framework: the optimizer with its learning rate
resolved for that model, the epochs, and the exact batches in their exact order.

Each package's `train(model, plan, data)` consumes a TrainPlan; none of them reads params.yaml's optimizer
section or resolves a per-model learning rate on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rosetta_common.data import epoch_batches
from rosetta_common.spec import AdamSpec, SGDSpec, Spec

OptimizerSpec = AdamSpec | SGDSpec


@dataclass(frozen=True)
class TrainPlan:
    arch: str
    optimizer: OptimizerSpec  # learning_rate is one number here: this model's
    epochs: int
    batch_size: int
    seed: int
    num_samples: int

    @property
    def optimizer_name(self) -> str:
        return "adam" if isinstance(self.optimizer, AdamSpec) else "sgd"

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.learning_rate)  # type: ignore[arg-type]

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.batch_size

    @property
    def num_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def batches(self, epoch: int) -> list[np.ndarray]:
        """Index batches of one epoch (rosetta_common.data.epoch_batches): the same in every framework."""
        return epoch_batches(self.num_samples, self.batch_size, self.seed, epoch)

    def all_batches(self) -> np.ndarray:
        """Every epoch's index batches, in order: (num_steps, batch_size) int64."""
        return np.stack([idx for epoch in range(self.epochs) for idx in self.batches(epoch)]).astype(np.int64)

    def describe(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer_name, "learning_rate": self.learning_rate, "epochs": self.epochs,
                "batch_size": self.batch_size, "steps_per_epoch": self.steps_per_epoch}


def plan(spec: Spec, arch: str, num_samples: int) -> TrainPlan:
    """The one place a learning rate given per model ({mlp: 3e-3, ...}) is resolved to a number."""
    chosen = spec.optimizer
    optimizer = chosen.model_copy(update={"learning_rate": spec.learning_rate(arch)})
    epoch_batches(num_samples, spec.train.batch_size, spec.seed, 0)  # raises SpecError if the batch is too large
    return TrainPlan(arch=arch, optimizer=optimizer, epochs=spec.train.epochs, batch_size=spec.train.batch_size,
                     seed=spec.seed, num_samples=int(num_samples))
