"""Training: the optimizers match rosetta_common.optim (torch's formulas), loss falls, runs are bitwise
reproducible across processes."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import rosetta_jax
from rosetta_common.data import Dataset, iterate_batches
from rosetta_common.metrics import relative_diff, softmax_cross_entropy
from rosetta_common.optim import adam_step, sgd_step
from rosetta_common.reference import forward
from rosetta_common.spec import AdamSpec, Spec
from rosetta_common.testing import ARCHS, learnable_data, small_spec
from rosetta_common.weights import init_weights
from rosetta_jax.train import loss_fn, make_optimizer, torch_adam

OPTIMIZER_REL = 1e-6
STEP1_LOSS_REL = 1e-6
Tree = dict[str, np.ndarray]


def _tree(seed: int) -> Tree:
    rng = np.random.default_rng(seed)
    return {"kernel": rng.normal(size=(5, 3)).astype(np.float32),
            "bias": rng.normal(size=(3,)).astype(np.float32)}


def _run_transform(tx: optax.GradientTransformation, params: Tree, grads: list[Tree]) -> Tree:
    update = jax.jit(tx.update)
    state = tx.init(params)
    for g in grads:
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    return jax.tree.map(np.asarray, params)


OTHER_ADAM = AdamSpec(learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-6)


@pytest.mark.parametrize("adam", [AdamSpec(learning_rate=1e-3), OTHER_ADAM], ids=["default", "other"])
def test_torch_adam_matches_numpy_reference(adam: AdamSpec) -> None:
    params, grads = _tree(0), [_tree(s) for s in (1, 2, 3, 4)]
    ours = _run_transform(torch_adam(adam, len(grads)), params, grads)
    for name, p in params.items():
        m = v = np.zeros_like(p)
        for t, g in enumerate(grads, start=1):
            p, m, v = adam_step(p, g[name], m, v, t, adam)
        assert relative_diff(ours[name], p).max() <= OPTIMIZER_REL, name


def test_sgd_matches_numpy_reference() -> None:
    spec = small_spec(optimizer="sgd")
    params, grads = _tree(0), [_tree(s) for s in (1, 2, 3)]
    ours = _run_transform(make_optimizer(spec, len(grads)), params, grads)
    for name, p in params.items():
        buf = np.zeros_like(p)
        for g in grads:
            p, buf = sgd_step(p, g[name], buf, spec.optimizers.sgd)
        assert relative_diff(ours[name], p).max() <= OPTIMIZER_REL, name


def _weights(arch: str, spec: Spec, data: Dataset) -> dict[str, np.ndarray]:
    return init_weights(arch, spec, data.image_shape, data.num_classes, spec.seed)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_train_matches_numpy_optimizer_on_framework_gradients(optimizer: str) -> None:
    """train() for 3 steps vs the numpy optimizer fed with JAX gradients of the same batches."""
    spec = small_spec(optimizer=optimizer, epochs=3, batch_size=32)
    data = learnable_data(n_train=32)  # one batch per epoch: 3 steps
    weights = _weights("attention", spec, data)
    model, result = rosetta_jax.train(rosetta_jax.build("attention", spec, weights), "attention", spec, data)

    ref = dict(weights)
    state = {k: np.zeros_like(v) for k, v in ref.items()}
    state2 = {k: np.zeros_like(v) for k, v in ref.items()}
    grad_fn = nnx.jit(nnx.value_and_grad(loss_fn))
    for epoch in range(spec.train.epochs):
        (images, labels), = iterate_batches(data, spec.train.batch_size, spec.seed, epoch)
        reference_model = rosetta_jax.build("attention", spec, ref)
        loss, grads = grad_fn(reference_model, images, labels)
        grads = rosetta_jax.weights.from_native_state(grads)
        assert relative_diff(result.step_losses[epoch], float(loss)) <= OPTIMIZER_REL
        for name in ref:
            g = np.asarray(grads[name])
            if optimizer == "adam":
                ref[name], state[name], state2[name] = adam_step(ref[name], g, state[name], state2[name],
                                                                 epoch + 1, spec.optimizers.adam)
            else:
                ref[name], state[name] = sgd_step(ref[name], g, state[name], spec.optimizers.sgd)
    trained = rosetta_jax.canonical_weights(model)
    for name in ref:
        scale = np.abs(ref[name]).max()
        assert np.abs(trained[name] - ref[name]).max() <= OPTIMIZER_REL * scale, name


def test_step1_loss_matches_float64_reference() -> None:
    """The first step's loss is a pure forward pass: it must match the float64 reference to 1e-6."""
    spec = small_spec(epochs=1)
    data = learnable_data()
    weights = _weights("mlp", spec, data)
    _, result = rosetta_jax.train(rosetta_jax.build("mlp", spec, weights), "mlp", spec, data)
    images, labels = next(iterate_batches(data, spec.train.batch_size, spec.seed, 0))
    expected = softmax_cross_entropy(forward("mlp", spec, weights, images), labels)
    assert relative_diff(result.step_losses[0], expected) <= STEP1_LOSS_REL


@pytest.mark.parametrize("arch", ARCHS)
def test_training_lowers_loss(arch: str) -> None:
    spec = small_spec(epochs=4, optimizer="sgd")  # lr 0.05, momentum 0.9: visible progress in 32 steps
    data = learnable_data()
    _, result = rosetta_jax.train(rosetta_jax.build(arch, spec, _weights(arch, spec, data)), arch, spec, data)
    steps_per_epoch = len(data.train_labels) // spec.train.batch_size
    assert len(result.step_losses) == spec.train.epochs * steps_per_epoch
    assert all(isinstance(v, float) for v in result.step_losses)
    assert result.epoch_losses[0] == pytest.approx(np.mean(result.step_losses[:steps_per_epoch]), rel=1e-12)
    # Every epoch's mean loss below the one before: a real descent, not one lucky batch.
    losses = result.epoch_losses
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
    assert result.train_seconds > 0


_CHILD = """
import sys, numpy as np, rosetta_jax
sys.path.insert(0, sys.argv[2])
from rosetta_common.testing import learnable_data, small_spec
from rosetta_common.weights import init_weights
rosetta_jax.configure(0)
spec, data = small_spec(), learnable_data()
model = rosetta_jax.build("attention", spec, init_weights("attention", spec, (8, 8), 10, 0))
model, result = rosetta_jax.train(model, "attention", spec, data)
np.savez(sys.argv[1], losses=np.array(result.step_losses), **rosetta_jax.canonical_weights(model))
"""


def test_training_is_bitwise_reproducible_across_processes(tmp_path: Path) -> None:
    spec, data = small_spec(), learnable_data()
    out = tmp_path / "child.npz"
    subprocess.run([sys.executable, "-c", _CHILD, str(out), str(Path(__file__).parent)], check=True,
                   capture_output=True)
    model = rosetta_jax.build("attention", spec, _weights("attention", spec, data))
    model, result = rosetta_jax.train(model, "attention", spec, data)
    child = np.load(out)
    assert np.array_equal(child["losses"], np.array(result.step_losses))
    for name, value in rosetta_jax.canonical_weights(model).items():
        assert np.array_equal(child[name], value), name
