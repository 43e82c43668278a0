"""Seeding/determinism and training with Keras' own compile + fit, on the common batches in common order.

Parity with the other frameworks needs three things Keras does not give by default:
- torch's Adam formula (Keras' Adam adds epsilon before the bias correction): TorchAdam below;
- exactly the common batches in exactly the common order: a tf.data pipeline over the concatenated
  per-epoch index orders of rosetta_common.data.epoch_batches, consumed by fit with steps_per_epoch;
- the exact float32 loss of every step: Keras' logs["loss"] is a running mean over the epoch, so the
  StepLoss metric keeps the last batch's loss, computed with the very loss object fit differentiates.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import ops
from tqdm.auto import tqdm

from rosetta_common.data import Dataset, epoch_batches
from rosetta_common.interface import TrainResult
from rosetta_common.seeding import seed_everything
from rosetta_common.spec import AdamSpec, SGDSpec, Spec
from rosetta_tf.models import PACKAGE


def configure(seed: int) -> None:
    """Seed Python, numpy, TF and Keras, and make every TF op deterministic (or raise if it cannot be)."""
    seed_everything(seed)
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    # Full fp32 matmuls and convolutions on GPUs: TF32 would differ from the other frameworks by ~1e-3.
    tf.config.experimental.enable_tensor_float_32_execution(False)


@keras.saving.register_keras_serializable(package=PACKAGE)
class TorchAdam(keras.optimizers.Optimizer):
    """Adam exactly as torch.optim.Adam (single-tensor path) and rosetta_common.optim.adam_step compute it.

    Differences from keras.optimizers.Adam: epsilon is added after the bias correction, and the bias
    corrections and step size are computed in float64 (as torch does in Python) before rounding to
    float32. The learning rate is kept as a Python float for the same reason (Keras' own learning-rate
    variable is float32), so schedules are not supported.
    """

    def __init__(self, learning_rate: float = 1e-3, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-8, name: str = "torch_adam", **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.lr64, self.beta_1, self.beta_2, self.epsilon = float(learning_rate), beta_1, beta_2, epsilon

    def build(self, var_list: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(var_list, ["momentum", "velocity"])

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        dtype = variable.dtype
        step = ops.cast(self.iterations + 1, "float64")  # iterations is incremented after the update
        bc1 = 1.0 - ops.power(ops.convert_to_tensor(self.beta_1, "float64"), step)
        bc2 = 1.0 - ops.power(ops.convert_to_tensor(self.beta_2, "float64"), step)
        step_size = ops.cast(self.lr64 / bc1, dtype)
        bc2_sqrt = ops.cast(ops.sqrt(bc2), dtype)
        g = ops.cast(gradient, dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        # torch: m.lerp_(g, 1 - b1), which for a weight < 0.5 is m + w * (g - m).
        self.assign(m, m + np.float32(1.0 - self.beta_1) * (g - m))
        # torch: v.mul_(b2).addcmul_(g, g, value=1 - b2), i.e. v*b2 + ((1-b2)*g)*g.
        self.assign(v, v * np.float32(self.beta_2) + np.float32(1.0 - self.beta_2) * g * g)
        denom = ops.sqrt(v) / bc2_sqrt + np.float32(self.epsilon)
        # torch: p.addcdiv_(m, denom, value=-step_size), i.e. p - (step_size*m)/denom.
        self.assign_sub(variable, step_size * m / denom)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "learning_rate": self.lr64, "beta_1": self.beta_1,
                "beta_2": self.beta_2, "epsilon": self.epsilon}


def make_optimizer(spec: Spec, arch: str) -> keras.optimizers.Optimizer:
    opt, lr = spec.optimizer, spec.learning_rate(arch)  # the rate may be given per architecture
    if isinstance(opt, AdamSpec):
        return TorchAdam(lr, opt.beta1, opt.beta2, opt.epsilon)
    if isinstance(opt, SGDSpec):
        # Keras' v = m*v - lr*g; p += v is torch's b = m*b + g; p -= lr*b for a constant learning rate
        # (tests/test_train.py checks it against rosetta_common.optim.sgd_step).
        return keras.optimizers.SGD(learning_rate=lr, momentum=opt.momentum)
    raise ValueError(f"optimizer {spec.train.optimizer!r} is unknown; allowed: adam, sgd")


def make_loss() -> keras.losses.Loss:
    """Mean softmax cross-entropy over the batch, from logits and integer labels."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@keras.saving.register_keras_serializable(package=PACKAGE)
class StepLoss(keras.metrics.Metric):
    """The loss of the latest batch (not a running mean), with the same loss object as compile's loss."""

    def __init__(self, name: str = "step_loss", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.loss_fn = make_loss()
        self.value = self.add_variable(shape=(), initializer="zeros", name="value")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        self.value.assign(self.loss_fn(y_true, y_pred))

    def result(self) -> Any:
        return self.value

    def reset_state(self) -> None:
        self.value.assign(0.0)


class _Record(keras.callbacks.Callback):
    """Collects every step's loss and drives one tqdm bar over all steps."""

    def __init__(self, total_steps: int, desc: str) -> None:
        super().__init__()
        self.step_losses: list[float] = []
        self.bar = tqdm(total=total_steps, desc=desc, unit="step", leave=False)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.step_losses.append(float(np.float32((logs or {})["step_loss"])))
        self.bar.update(1)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.bar.set_postfix(epoch=epoch + 1, loss=f"{self.step_losses[-1]:.4f}")

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.bar.close()


def common_batches(data: Dataset, spec: Spec) -> tuple[tf.data.Dataset, int]:
    """All epochs' batches, in the common order, as one tf.data stream; returns (dataset, steps per epoch).

    Indices come from rosetta_common.data.epoch_batches (what iterate_batches yields); the gather runs
    inside tf.data so fit never goes back to Python for data.
    """
    n, size = len(data.train_labels), spec.train.batch_size
    order = np.stack([idx for epoch in range(spec.train.epochs)
                      for idx in epoch_batches(n, size, spec.seed, epoch)])
    images, labels = tf.constant(data.train_images, tf.float32), tf.constant(data.train_labels, tf.int64)
    ds = tf.data.Dataset.from_tensor_slices(order.astype(np.int64))
    ds = ds.map(lambda idx: (tf.gather(images, idx), tf.gather(labels, idx))).prefetch(2)
    return ds, len(order) // spec.train.epochs


def train(model: keras.Model, arch: str, spec: Spec, data: Dataset) -> tuple[keras.Model, TrainResult]:
    dataset, steps = common_batches(data, spec)
    # jit_compile=False: XLA fuses differently from the other frameworks' kernels (and Keras would
    # switch it on when a GPU is present); steps_per_execution=1 so every step's loss is seen.
    model.compile(optimizer=make_optimizer(spec, arch), loss=make_loss(), metrics=[StepLoss()],
                  jit_compile=False, steps_per_execution=1)
    record = _Record(steps * spec.train.epochs, desc=f"tf {arch}")
    start = time.perf_counter()
    model.fit(dataset, epochs=spec.train.epochs, steps_per_epoch=steps, shuffle=False, verbose=0,
              callbacks=[record])
    seconds = time.perf_counter() - start
    losses = record.step_losses
    epoch_losses = [float(np.mean(losses[e * steps:(e + 1) * steps], dtype=np.float64))
                    for e in range(spec.train.epochs)]
    return model, TrainResult(step_losses=losses, epoch_losses=epoch_losses, train_seconds=seconds,
                              extra={"steps_per_epoch": steps, "optimizer": spec.train.optimizer})
