"""JAX's idiomatic loop: optax.adam and one jax.jit train step over a Flax NNX module split into a graph
definition and its states (nnx.split outside, nnx.merge inside the jitted function), as Flax's performance
guide and examples write it; each epoch a numpy permutation, the last partial batch dropped (as Flax's MNIST
example does: one batch shape, one compilation).

The model is the very module our build() returns, switched to NNX's train mode (model.train(): Dropout not
deterministic, BatchNorm on batch statistics) for the loop and back to eval mode after it. The gradient is taken
with respect to the nnx.Param state only; the rest (BatchNorm's running statistics; the dropout RNG stream's key
and count) goes through the step as state the forward updates, and comes back out of it. Dropout (resnet) draws
from its own RNG stream, which a Flax user passes to nnx.Dropout(rngs=...): build() makes the layer without one
(it never draws there), so the loop gives it nnx.Rngs(dropout=seed)'s stream.
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
from rosetta_common.training import TrainPlan, dropout_masks

TRICKS = {
    "donate": "jax.jit(donate_argnums=(0, 1, 2)): parameters, other state and optimizer state updated in place "
              "(numerically neutral, so parity allows it; not in Flax's basic examples; our train() leaves it out: "
              "faster for the digits mlp, 0.84x for the lstm, measured)",
}
PARITY = {
    "torch_adam": "rosetta_jax's torch_adam instead of optax.adam (torch's bias corrections, computed in float64 on "
                  "the host and looked up per step; optax.adam computes 1 - b2**t in float32, ~1e-5 off)",
    "shared_masks": "resnet: the step's dropout mask drawn in common (rosetta_common.training.dropout_masks; "
                    "as our train() does, its numpy row passed to the step with the batch) multiplied into the "
                    "pooled features instead of nnx.Dropout drawing from its RNG stream",
}
ONLY_FOR = {"shared_masks": ("resnet",)}
# JAX's second idiomatic style, run beside this one where it has the model (benchmarks/idiomatic/__init__.py):
# flax.linen modules + optax.adam + flax.training.train_state.TrainState, the style of most JAX code in the wild.
PEERS = {"idiomatic_linen": "benchmarks.idiomatic.jax_linen"}


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
    masks = None
    if variant == "shared_masks":  # as our train() does: every step's mask, its numpy row moved with the batch
        plan = TrainPlan(model.config.arch, optimizer, epochs, batch_size, seed, len(data.train_labels))
        masks = dropout_masks(plan, model.config)
    else:
        for _, module in nnx.iter_modules(model):
            if isinstance(module, nnx.Dropout):
                module.rngs = nnx.Rngs(dropout=seed).dropout
    model.train()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)  # rest: BatchStat, RNG key and count (or nothing)
    opt_state = tx.init(params)

    @partial(jax.jit, donate_argnums=(0, 1, 2) if variant == "donate" else ())
    def train_step(params: Any, rest: Any, opt_state: Any, images: jax.Array, labels: jax.Array,
                   mask: jax.Array | None) -> tuple[Any, Any, Any, jax.Array]:
        def loss_fn(params: Any) -> tuple[jax.Array, Any]:
            # copy=True: fresh variables at the gradient's trace level, which BatchNorm and the RNG stream update.
            module = nnx.merge(graphdef, params, rest, copy=True)
            logits = module(images) if mask is None else module(images, mask)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, nnx.split(module, nnx.Param, ...)[2]

        (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), rest, opt_state, loss

    rng = np.random.default_rng(seed)
    epoch_seconds, epoch_losses = [], []
    step = 0
    for _ in range(epochs):
        start = time.perf_counter()
        order = rng.permutation(len(data.train_labels))[: steps * batch_size].reshape(steps, batch_size)
        losses = []
        for idx in order:
            mask = None if masks is None else masks[step]
            params, rest, opt_state, loss = train_step(params, rest, opt_state, data.train_inputs[idx],
                                                       data.train_labels[idx], mask)
            losses.append(loss)
            step += 1
        epoch_losses.append(float(np.mean(jax.device_get(losses))))  # waits for the epoch's last step
        epoch_seconds.append(time.perf_counter() - start)
    nnx.update(model, params, rest)
    model.eval()
    return LoopRun(epoch_seconds, steps * batch_size, epoch_losses)
