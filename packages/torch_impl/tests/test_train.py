"""Training: torch.optim computes rosetta_common.optim's formulas, train() applies them to the right
gradients on common's batches, the loss falls, and runs are bitwise reproducible across processes."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rosetta_torch
from rosetta_common.data import Dataset, iterate_batches
from rosetta_common.metrics import relative_diff, softmax_cross_entropy
from rosetta_common.optim import adam_step, sgd_step
from rosetta_common.reference import forward
from rosetta_common.spec import AdamSpec, SGDSpec, Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES, learnable_data, small_spec
from rosetta_common.weights import init_weights
from rosetta_torch.train import make_optimizer
from rosetta_torch.weights import from_state_dict

OPTIMIZER_REL = 1e-6
STEP1_LOSS_REL = 1e-6


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Gradients over several orders of magnitude, so epsilon and the bias corrections both matter.
    scale = 10.0 ** rng.integers(-6, 1, size=(5, 3))
    return {"kernel": (rng.normal(size=(5, 3)) * scale).astype(np.float32),
            "bias": rng.normal(size=(3,)).astype(np.float32)}


def _run_torch(optimizer: AdamSpec | SGDSpec, params: dict[str, np.ndarray],
               grads: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    spec = small_spec(optimizer="adam" if isinstance(optimizer, AdamSpec) else "sgd")
    spec = spec.model_copy(update={"optimizers": spec.optimizers.model_copy(
        update={spec.train.optimizer: optimizer})})
    tensors = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    opt = make_optimizer(tensors.values(), spec)
    for g in grads:
        for name, t in tensors.items():
            t.grad = torch.from_numpy(g[name].copy())
        opt.step()
    return {k: t.detach().numpy() for k, t in tensors.items()}


OTHER_ADAM = AdamSpec(learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-6)


@pytest.mark.parametrize("adam", [AdamSpec(learning_rate=1e-3), OTHER_ADAM], ids=["default", "other"])
def test_torch_adam_matches_numpy_reference(adam: AdamSpec) -> None:
    params, grads = _tensors(0), [_tensors(s) for s in (1, 2, 3, 4)]
    ours = _run_torch(adam, params, grads)
    for name, p in params.items():
        m = v = np.zeros_like(p)
        for t, g in enumerate(grads, start=1):
            p, m, v = adam_step(p, g[name], m, v, t, adam)
        assert relative_diff(ours[name], p).max() <= OPTIMIZER_REL, name


def test_torch_sgd_matches_numpy_reference() -> None:
    sgd = SGDSpec(learning_rate=0.05, momentum=0.9)
    params, grads = _tensors(0), [_tensors(s) for s in (1, 2, 3)]
    ours = _run_torch(sgd, params, grads)
    for name, p in params.items():
        buf = np.zeros_like(p)
        for g in grads:
            p, buf = sgd_step(p, g[name], buf, sgd)
        assert relative_diff(ours[name], p).max() <= OPTIMIZER_REL, name


def _weights(arch: str, spec: Spec, data: Dataset) -> dict[str, np.ndarray]:
    return init_weights(arch, spec, data.image_shape, data.num_classes, spec.seed)


@pytest.mark.parametrize("arch", ["cnn", "attention"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_train_matches_numpy_optimizer_on_torch_gradients(arch: str, optimizer: str) -> None:
    """train() for 3 steps vs the numpy optimizer fed with torch's gradients (mapped to canonical layout,
    the cnn head's permutation included) of the same batches."""
    spec = small_spec(optimizer=optimizer, epochs=3, batch_size=32)
    data = learnable_data(n_train=32)  # one batch per epoch: 3 steps
    weights = _weights(arch, spec, data)
    model, result = rosetta_torch.train(rosetta_torch.build(arch, spec, weights), arch, spec, data)

    ref = dict(weights)
    state = {k: np.zeros_like(v) for k, v in ref.items()}
    state2 = {k: np.zeros_like(v) for k, v in ref.items()}
    for epoch in range(spec.train.epochs):
        (images, labels), = iterate_batches(data, spec.train.batch_size, spec.seed, epoch)
        reference_model = rosetta_torch.build(arch, spec, ref)
        loss = F.cross_entropy(reference_model(torch.from_numpy(images)), torch.from_numpy(labels))
        loss.backward()
        grads = from_state_dict(reference_model, {n: p.grad for n, p in reference_model.named_parameters()})
        assert relative_diff(result.step_losses[epoch], loss.item()) <= OPTIMIZER_REL
        for name in ref:
            if optimizer == "adam":
                ref[name], state[name], state2[name] = adam_step(ref[name], grads[name], state[name], state2[name],
                                                                 epoch + 1, spec.optimizers.adam)
            else:
                ref[name], state[name] = sgd_step(ref[name], grads[name], state[name], spec.optimizers.sgd)
    trained = rosetta_torch.canonical_weights(model)
    for name in ref:
        assert np.abs(trained[name] - ref[name]).max() <= OPTIMIZER_REL * np.abs(ref[name]).max(), name


def test_step1_loss_matches_float64_reference() -> None:
    """The first step's loss is a pure forward pass: it must match the float64 reference to 1e-6."""
    spec = small_spec(epochs=1)
    data = learnable_data()
    for arch in ARCHS:
        weights = _weights(arch, spec, data)
        _, result = rosetta_torch.train(rosetta_torch.build(arch, spec, weights), arch, spec, data)
        images, labels = next(iterate_batches(data, spec.train.batch_size, spec.seed, 0))
        expected = softmax_cross_entropy(forward(arch, spec, weights, images), labels)
        assert relative_diff(result.step_losses[0], expected) <= STEP1_LOSS_REL, arch


@pytest.mark.parametrize("arch", ARCHS)
def test_training_lowers_loss(arch: str) -> None:
    spec = small_spec(epochs=4, optimizer="sgd")  # lr 0.05, momentum 0.9: visible progress in 32 steps
    data = learnable_data()
    model, result = rosetta_torch.train(rosetta_torch.build(arch, spec, _weights(arch, spec, data)), arch, spec, data)
    steps_per_epoch = len(data.train_labels) // spec.train.batch_size
    assert len(result.step_losses) == spec.train.epochs * steps_per_epoch
    assert all(isinstance(v, float) for v in result.step_losses)
    assert result.epoch_losses[0] == pytest.approx(np.mean(result.step_losses[:steps_per_epoch]), rel=1e-12)
    losses = result.epoch_losses  # every epoch's mean below the one before: a real descent
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
    assert result.train_seconds > 0 and not model.training


def test_per_model_learning_rate_is_resolved() -> None:
    """A learning rate given per model trains exactly as that model's rate given as one number."""
    data = learnable_data()
    spec = small_spec(optimizer="sgd")
    per_model = spec.model_copy(update={"optimizers": spec.optimizers.model_copy(update={
        "sgd": SGDSpec(learning_rate={"mlp": 0.05, "cnn": 7.0, "attention": 9.0})})})
    losses = []
    for s in (spec, per_model):
        _, result = rosetta_torch.train(rosetta_torch.build("mlp", s, _weights("mlp", s, data)), "mlp", s, data)
        losses.append(result.step_losses)
    assert losses[0] == losses[1]


def test_configure_switches_on_determinism() -> None:
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.benchmark


_CHILD = """
import sys, numpy as np, rosetta_torch
sys.path.insert(0, sys.argv[2])
from rosetta_common.testing import learnable_data, small_spec
from rosetta_common.weights import init_weights
rosetta_torch.configure(0)
spec, data = small_spec(), learnable_data()
model = rosetta_torch.build("attention", spec, init_weights("attention", spec, (8, 8), 10, 0))
model, result = rosetta_torch.train(model, "attention", spec, data)
np.savez(sys.argv[1], losses=np.array(result.step_losses), **rosetta_torch.canonical_weights(model))
"""


def test_training_is_bitwise_reproducible_across_processes(tmp_path: Path) -> None:
    spec, data = small_spec(), learnable_data()
    out = tmp_path / "child.npz"
    subprocess.run([sys.executable, "-c", _CHILD, str(out), str(Path(__file__).parent)], check=True,
                   capture_output=True)
    model = rosetta_torch.build("attention", spec, init_weights("attention", spec, IMAGE_SHAPE, NUM_CLASSES, 0))
    model, result = rosetta_torch.train(model, "attention", spec, data)
    child = np.load(out)
    assert np.array_equal(child["losses"], np.array(result.step_losses))
    for name, value in rosetta_torch.canonical_weights(model).items():
        assert np.array_equal(child[name], value), name
