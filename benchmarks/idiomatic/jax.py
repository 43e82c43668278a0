"""JAX's idiomatic loop: optax.adam and one jax.jit train step over a Flax NNX module split into a graph
definition and its parameters (nnx.split outside, nnx.merge inside the jitted function), as Flax's
performance guide and examples write it; each epoch a numpy permutation, the last partial batch dropped
(as Flax's MNIST example does: one batch shape, one compilation).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from benchmarks.idiomatic import LoopRun
from rosetta_common.data import Dataset
from rosetta_common.spec import AdamSpec, SGDSpec

TRICKS = {
    "donate": "jax.jit(donate_argnums=(0, 1)): parameters and optimizer state updated in place "
              "(numerically neutral, so parity allows it; not in Flax's basic examples)",
}
PARITY = {
    "torch_adam": "rosetta_jax's torch_adam instead of optax.adam (torch's bias corrections, computed in float64 on "
                  "the host and looked up per step; optax.adam computes 1 - b2**t in float32, ~1e-5 off)",
}


def train(model: nnx.Module, data: Dataset, batch_size: int, optimizer: AdamSpec | SGDSpec, epochs: int, seed: int,
          variant: str | None = None) -> LoopRun:
    if variant is not None and variant not in {**TRICKS, **PARITY}:
        raise ValueError(f"variant = {variant!r}: unknown; allowed: {', '.join({**TRICKS, **PARITY})}")
    steps = len(data.train_labels) // batch_size
    if variant == "torch_adam":
        from rosetta_jax.train import optax_transform

        tx = optax_transform(optimizer, epochs * steps)
    elif isinstance(optimizer, AdamSpec):
        tx = optax.adam(optimizer.learning_rate, b1=optimizer.beta1, b2=optimizer.beta2, eps=optimizer.epsilon)
    else:
        tx = optax.sgd(optimizer.learning_rate, momentum=optimizer.momentum)
    graphdef, params = nnx.split(model)
    opt_state = tx.init(params)

    @partial(jax.jit, donate_argnums=(0, 1) if variant == "donate" else ())
    def train_step(params: Any, opt_state: Any, images: jax.Array, labels: jax.Array) -> tuple[Any, Any, jax.Array]:
        def loss_fn(params: Any) -> jax.Array:
            logits = nnx.merge(graphdef, params)(images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(seed)
    epoch_seconds, epoch_losses = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        order = rng.permutation(len(data.train_labels))[: steps * batch_size].reshape(steps, batch_size)
        losses = []
        for idx in order:
            params, opt_state, loss = train_step(params, opt_state, data.train_images[idx], data.train_labels[idx])
            losses.append(loss)
        epoch_losses.append(float(np.mean(jax.device_get(losses))))  # waits for the epoch's last step
        epoch_seconds.append(time.perf_counter() - start)
    nnx.update(model, params)
    return LoopRun(epoch_seconds, steps * batch_size, epoch_losses)
