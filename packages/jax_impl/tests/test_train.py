"""JAX/Optax specifics of training: why torch_adam exists, one compilation per train(), configure()'s flags, and
the first step (BatchNorm in training mode, the shared dropout mask) against the float64 reference."""

from __future__ import annotations

import importlib
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import rosetta_jax
from rosetta_common.metrics import softmax_cross_entropy
from rosetta_common.reference import forward_train
from rosetta_common.spec import AdamSpec
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import dropout_masks, plan

# The module, not the contract's train() function that the package re-exports under the same name.
jax_train = importlib.import_module("rosetta_jax.train")

STEPS = 10
OURS_REL = 1e-6  # torch_adam: float64 bias corrections rounded once, measured <= 3e-7 over these steps
OPTAX_REL = 3e-6  # optax.adam's float32 1 - b2**t: measured 4e-6 to 1e-5 at every step of these


def _updates(tx: optax.GradientTransformation, grad: np.ndarray) -> list[np.ndarray]:
    params = jnp.zeros_like(grad)
    state, update, out = tx.init(params), jax.jit(tx.update), []
    for _ in range(STEPS):
        step, state = update(jnp.asarray(grad), state, params)
        out.append(np.asarray(step, np.float64))
    return out


def test_torch_adam_bias_corrections_are_float64_where_optax_adam_is_float32() -> None:
    """A constant gradient keeps m and v free of cancellation, so what remains of the update's error is the
    bias corrections: torch_adam's float64 table is ~1e-7 off the float64 update, optax.adam's ~1e-5 (the
    parity table in docs/conventions.md; if optax ever computes them in float64, torch_adam can go)."""
    spec = AdamSpec(learning_rate=1e-3)
    grad = np.random.default_rng(0).uniform(0.5, 2.0, size=256).astype(np.float32)
    ours = _updates(jax_train.torch_adam(spec, STEPS), grad)
    theirs = _updates(optax.adam(spec.learning_rate, b1=spec.beta1, b2=spec.beta2, eps=spec.epsilon), grad)
    g, m, v = grad.astype(np.float64), 0.0, 0.0
    for t in range(1, STEPS + 1):
        m, v = spec.beta1 * m + (1 - spec.beta1) * g, spec.beta2 * v + (1 - spec.beta2) * g * g
        exact = -spec.learning_rate * (m / (1 - spec.beta1**t)) / (np.sqrt(v / (1 - spec.beta2**t)) + spec.epsilon)
        assert np.abs(ours[t - 1] / exact - 1).max() <= OURS_REL, t
        assert np.abs(theirs[t - 1] / exact - 1).max() >= OPTAX_REL, t


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_train_compiles_its_step_once(monkeypatch: pytest.MonkeyPatch, optimizer: str) -> None:
    """Dropping the last partial batch keeps one batch shape, so the whole run is one XLA compilation."""
    steps: list[Any] = []

    def spy(*args: Any) -> Any:
        steps.append(make(*args))
        return steps[-1]

    make = jax_train.make_flat_train_step
    monkeypatch.setattr(jax_train, "make_flat_train_step", spy)
    config, data = small_config("cnn"), learnable_data(n_train=72)  # 72 / 16: 4 steps an epoch, 8 left over
    train_plan = plan(small_spec(optimizer=optimizer), "cnn", len(data.train_labels))
    result = rosetta_jax.train(rosetta_jax.build(config, asymmetric_weights(config, 5)), train_plan, data)
    assert len(result.step_losses) == train_plan.num_steps == 8
    assert len(steps) == 1 and steps[0]._cache_size() == 1


def test_configure_sets_deterministic_full_precision() -> None:
    assert jax.config.jax_default_matmul_precision == "highest"  # no TF32 on GPUs
    assert "--xla_gpu_deterministic_ops=true" in os.environ["XLA_FLAGS"]


@pytest.mark.parametrize("arch", ["resnet", "lstm", "gru"])
def test_the_first_step_is_the_float64_references(arch: str) -> None:
    """train()'s first step, as the pipeline's cross-framework parity sees it: its loss is the reference's
    training-mode forward on the plan's first batch with the plan's first dropout mask (within the step-1
    parity bound), and the running statistics it leaves are the reference's update."""
    config, data = small_config(arch, (6, 10)), learnable_data(n_train=16, image_shape=(6, 10))  # one step
    start = asymmetric_weights(config, 9)
    spec = small_spec(epochs=1)
    train_plan = plan(spec, arch, len(data.train_labels))
    assert train_plan.num_steps == 1
    model = rosetta_jax.build(config, start)
    result = rosetta_jax.train(model, train_plan, data)
    batch = train_plan.batches(0)[0]
    masks = dropout_masks(train_plan, config)
    logits, statistics = forward_train(config, start, data.train_inputs[batch], None if masks is None else masks[0])
    expected = softmax_cross_entropy(logits, data.train_labels[batch])
    assert abs(result.step_losses[0] - expected) <= spec.tolerances.step1_loss_rel * expected
    after = rosetta_jax.to_canonical(model)
    assert (masks is not None) == (arch == "resnet") == bool(statistics)
    for name, value in statistics.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
