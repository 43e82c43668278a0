"""Keras' idiomatic loop: model.compile(keras.optimizers.Adam, SparseCategoricalCrossentropy) and
model.fit(x, y, batch_size, shuffle=True) on numpy arrays, every other argument at its default.

The defaults are what the Keras guides use: jit_compile="auto" (on a CPU-only machine Keras resolves it to
False; with a GPU, to XLA) and steps_per_execution=1 (our train() runs an epoch per call). verbose=0 so that a
progress bar's printing is not timed; a callback with epoch hooks only reads the clock (no per-step hook, so no
per-step sync).

The model fit trains is the inference model our build() returns (not rosetta_tf's training twin): fit runs it
with training=True, so its own Dropout (resnet) draws from Keras' seed generator and its BatchNormalization
normalizes with batch statistics and moves the running ones, as any Keras model trains. BatchNormalization's
running statistics already follow the spec and the LSTM/GRU layers are Keras' own, so nothing else differs;
the GRU is built unroll=True (for a byte-stable ONNX export), which both loops train alike.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np

from benchmarks.idiomatic import LoopRun
from rosetta_common.data import Dataset
from rosetta_common.onnx_conventions import INPUT_NAME
from rosetta_common.spec import AdamSpec, ModelConfig, SGDSpec
from rosetta_common.training import TrainPlan, dropout_masks

TRICKS: dict[str, str] = {}  # Keras' steps_per_execution, the one trick the guides name, our train() uses too
PARITY = {
    "torch_adam": "rosetta_tf's TorchAdam instead of keras.optimizers.Adam (torch's formula: epsilon after the "
                  "bias corrections, computed in float64)",
    "step_loss": "every step's loss: rosetta_tf's StepLoss metric (a row per step, not fit's running mean) over an "
                 "epoch per compiled call (steps_per_execution), read once an epoch by a callback",
    "shared_masks": "resnet: fit on rosetta_tf's training twin (training_view), the dropout mask drawn in common "
                    "(rosetta_common.training.dropout_masks) as its second input, multiplied into the pooled "
                    "features, instead of Keras' Dropout drawing its own (here one mask per sample, the same each "
                    "epoch: the cost is the second input and the multiply, not which units drop)",
}
ONLY_FOR = {"shared_masks": ("resnet",)}


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


class _StepLosses(keras.callbacks.Callback):
    """The step_loss variant: reads every step's loss from StepLoss's rows, once a compiled call, as rosetta_tf.train's
    callback does."""

    def __init__(self) -> None:
        super().__init__()
        self.step_losses: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.step_losses += np.asarray((logs or {})["step_loss"], np.float32).tolist()


def sample_masks(config: ModelConfig, samples: int, batch_size: int, optimizer: AdamSpec | SGDSpec, seed: int
                 ) -> np.ndarray:
    """One dropout mask per training sample, (samples, features), cut from common's masks for one epoch."""
    steps = -(-samples // batch_size)  # fit keeps the last partial batch
    plan = TrainPlan(config.arch, optimizer, 1, batch_size, seed, steps * batch_size)
    masks = dropout_masks(plan, config)
    if masks is None:
        raise ValueError(f"variant shared_masks: the {config.arch} model has no dropout")
    return masks.reshape(-1, masks.shape[-1])[:samples]


def train(model: keras.Model, data: Dataset, batch_size: int, optimizer: AdamSpec | SGDSpec, epochs: int, seed: int,
          variant: str | None = None) -> LoopRun:
    if variant is not None and variant not in {**TRICKS, **PARITY}:
        raise ValueError(f"variant = {variant!r}: unknown; allowed: {', '.join({**TRICKS, **PARITY})}")
    # Keras shuffles with its own seeded generator (keras.utils.set_random_seed, done by configure()); `seed` only
    # draws the shared_masks variant's masks.
    if variant == "torch_adam":
        from rosetta_tf.train import TorchAdam

        opt = TorchAdam(optimizer.learning_rate, optimizer.beta1, optimizer.beta2, optimizer.epsilon)
    elif isinstance(optimizer, AdamSpec):
        opt = keras.optimizers.Adam(learning_rate=optimizer.learning_rate, beta_1=optimizer.beta1,
                                    beta_2=optimizer.beta2, epsilon=optimizer.epsilon)
    else:
        opt = keras.optimizers.SGD(learning_rate=optimizer.learning_rate, momentum=optimizer.momentum)
    options: dict[str, Any] = {}
    clock = _EpochClock()
    callbacks: list[keras.callbacks.Callback] = [clock]
    if variant == "step_loss":
        from rosetta_tf.train import StepLoss

        steps = -(-len(data.train_labels) // batch_size)  # fit keeps the last partial batch
        options.update(metrics=[StepLoss(steps)], steps_per_execution=steps)
        callbacks.append(_StepLosses())
    trainer, inputs = model, data.train_inputs
    if variant == "shared_masks":
        from rosetta_tf.models import MASK_INPUT, model_config, training_view

        masks = sample_masks(model_config(model), len(data.train_labels), batch_size, optimizer, seed)
        trainer, inputs = training_view(model), {INPUT_NAME: data.train_inputs, MASK_INPUT: masks}
    trainer.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **options)
    trainer.fit(inputs, data.train_labels, batch_size=batch_size, epochs=epochs, shuffle=True, verbose=0,
                callbacks=callbacks)
    return LoopRun(clock.epoch_seconds, len(data.train_labels), clock.epoch_losses)
