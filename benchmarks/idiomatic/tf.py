"""Keras' idiomatic loop: model.compile(keras.optimizers.Adam, SparseCategoricalCrossentropy) and
model.fit(x, y, batch_size, shuffle=True) on numpy arrays, every other argument at its default.

The defaults are what the Keras guides use: jit_compile="auto" (on a CPU-only machine Keras resolves it to
False; with a GPU, to XLA) and steps_per_execution=1. verbose=0 so that a progress bar's printing is not
timed; a callback with epoch hooks only reads the clock (no per-step hook, so no per-step sync).
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np

from benchmarks.idiomatic import LoopRun
from rosetta_common.data import Dataset
from rosetta_common.spec import AdamSpec, SGDSpec

STEPS_PER_EXECUTION = 16
TRICKS = {
    "xla": "compile(jit_compile=True): XLA fuses the step (our train() keeps False: fusion changes the last bits, "
           "and Keras switches it on whenever a GPU is present)",
    "steps_per_execution": f"compile(steps_per_execution={STEPS_PER_EXECUTION}): {STEPS_PER_EXECUTION} steps per "
                           "tf.function call (our train() keeps 1: every step's loss must be seen)",
}
PARITY = {
    "torch_adam": "rosetta_tf's TorchAdam instead of keras.optimizers.Adam (torch's formula: epsilon after the "
                  "bias corrections, computed in float64)",
}


class _EpochClock(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.epoch_seconds: list[float] = []
        self.epoch_losses: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch_seconds.append(time.perf_counter() - self._start)
        self.epoch_losses.append(float((logs or {}).get("loss", np.nan)))


def train(model: keras.Model, data: Dataset, batch_size: int, optimizer: AdamSpec | SGDSpec, epochs: int, seed: int,
          variant: str | None = None) -> LoopRun:
    if variant is not None and variant not in {**TRICKS, **PARITY}:
        raise ValueError(f"variant = {variant!r}: unknown; allowed: {', '.join({**TRICKS, **PARITY})}")
    del seed  # Keras shuffles with its own seeded generator (keras.utils.set_random_seed, done by configure())
    if variant == "torch_adam":
        from rosetta_tf.train import TorchAdam

        opt = TorchAdam(optimizer.learning_rate, optimizer.beta1, optimizer.beta2, optimizer.epsilon)
    elif isinstance(optimizer, AdamSpec):
        opt = keras.optimizers.Adam(learning_rate=optimizer.learning_rate, beta_1=optimizer.beta1,
                                    beta_2=optimizer.beta2, epsilon=optimizer.epsilon)
    else:
        opt = keras.optimizers.SGD(learning_rate=optimizer.learning_rate, momentum=optimizer.momentum)
    options: dict[str, Any] = {}
    if variant == "xla":
        options["jit_compile"] = True
    elif variant == "steps_per_execution":
        options["steps_per_execution"] = STEPS_PER_EXECUTION
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **options)
    clock = _EpochClock()
    model.fit(data.train_images, data.train_labels, batch_size=batch_size, epochs=epochs, shuffle=True, verbose=0,
              callbacks=[clock])
    return LoopRun(clock.epoch_seconds, len(data.train_labels), clock.epoch_losses)
