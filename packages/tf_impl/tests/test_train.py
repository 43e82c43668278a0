"""The optimizers against rosetta_common.optim, and fit's batches/losses against a plain training loop."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import rosetta_tf
from rosetta_common.data import Dataset, iterate_batches
from rosetta_common.metrics import relative_diff
from rosetta_common.optim import adam_bias_corrections, adam_step, sgd_step
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES, small_spec
from rosetta_common.weights import canonical_shapes, init_weights
from rosetta_tf.train import make_loss, make_optimizer

OPTIMIZER_REL = 1e-6  # after 3 updates, framework vs numpy reference, elementwise relative


def _params_and_grads(seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    params = rng.normal(0.0, 0.5, (4, 25)).astype(np.float32)
    # Gradients across five orders of magnitude, so epsilon and the bias corrections both matter.
    scales = np.logspace(-4, 0, 25, dtype=np.float32)
    return params, [(rng.normal(0.0, 1.0, (4, 25)) * scales).astype(np.float32) for _ in range(3)]


def _apply(spec: Spec, params: np.ndarray, grads: list[np.ndarray]) -> np.ndarray:
    variable = keras.Variable(params)
    optimizer = make_optimizer(spec, "mlp")
    for grad in grads:
        optimizer.apply_gradients([(tf.constant(grad), variable)])
    return variable.numpy()


def test_adam_matches_reference() -> None:
    spec = small_spec(optimizer="adam")
    params, grads = _params_and_grads()
    expected, m, v = params, np.zeros_like(params), np.zeros_like(params)
    for step, grad in enumerate(grads, start=1):
        expected, m, v = adam_step(expected, grad, m, v, step, spec.for_model("mlp").optimizers.adam)
    assert relative_diff(_apply(spec, params, grads), expected).max() <= OPTIMIZER_REL


def test_sgd_momentum_matches_reference() -> None:
    spec = small_spec(optimizer="sgd")
    params, grads = _params_and_grads(1)
    expected, buf = params, np.zeros_like(params)
    for grad in grads:
        expected, buf = sgd_step(expected, grad, buf, spec.for_model("mlp").optimizers.sgd)
    assert relative_diff(_apply(spec, params, grads), expected).max() <= OPTIMIZER_REL


def test_adam_bias_corrections_round_like_torch() -> None:
    """float64 pow in the graph, then float32: equal to Python's float64 arithmetic for 20k steps."""
    spec = small_spec(optimizer="adam").for_model("attention").optimizers.adam
    steps = np.arange(1, 20001)
    t = tf.constant(steps, tf.float64)
    bc1 = 1.0 - tf.pow(tf.constant(spec.beta1, tf.float64), t)
    bc2 = 1.0 - tf.pow(tf.constant(spec.beta2, tf.float64), t)
    ours = np.stack([tf.cast(spec.learning_rate / bc1, tf.float32), tf.cast(tf.sqrt(bc2), tf.float32)])
    pairs = [adam_bias_corrections(int(s), spec.beta1, spec.beta2) for s in steps]
    ref = np.array([(spec.learning_rate / a, b) for a, b in pairs], np.float32).T
    assert np.array_equal(ours, ref)


def _fresh(arch: str, spec: Spec) -> keras.Model:
    return rosetta_tf.build(arch, spec, init_weights(arch, spec, IMAGE_SHAPE, NUM_CLASSES, spec.seed))


def _plain_loop(model: keras.Model, arch: str, spec: Spec, data: Dataset) -> list[float]:
    """The same training as a GradientTape loop over rosetta_common.data.iterate_batches."""
    optimizer, loss_fn = make_optimizer(spec, arch), make_loss()

    @tf.function
    def step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    return [float(step(images, labels)) for epoch in range(spec.train.epochs)
            for images, labels in iterate_batches(data, spec.train.batch_size, spec.seed, epoch)]


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_fit_equals_plain_loop_on_common_batches(optimizer: str, data: Dataset) -> None:
    """fit sees exactly the common batches in the common order, and StepLoss is each step's exact loss."""
    spec = small_spec(optimizer=optimizer)
    trained, result = rosetta_tf.train(_fresh("mlp", spec), "mlp", spec, data)
    reference = _fresh("mlp", spec)
    expected = _plain_loop(reference, "mlp", spec, data)
    assert result.step_losses == expected  # bitwise
    ours, theirs = rosetta_tf.canonical_weights(trained), rosetta_tf.canonical_weights(reference)
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("arch", ARCHS)
def test_training_lowers_the_loss(arch: str, spec: Spec, data: Dataset) -> None:
    _, result = rosetta_tf.train(_fresh(arch, spec), arch, spec, data)
    steps = (len(data.train_labels) // spec.train.batch_size) * spec.train.epochs
    assert len(result.step_losses) == steps and all(isinstance(x, float) for x in result.step_losses)
    assert result.epoch_losses == pytest.approx([np.mean(result.step_losses[:steps // 2]),
                                                 np.mean(result.step_losses[steps // 2:])], rel=1e-12)
    assert result.epoch_losses[-1] < result.epoch_losses[0]
    assert result.step_losses[-1] < result.step_losses[0]
    assert result.train_seconds > 0


def test_training_twice_is_bitwise_identical(spec: Spec, data: Dataset) -> None:
    runs = []
    for _ in range(2):
        rosetta_tf.configure(0)
        model, result = rosetta_tf.train(_fresh("attention", spec), "attention", spec, data)
        runs.append((result.step_losses, rosetta_tf.canonical_weights(model)))
    (losses_a, weights_a), (losses_b, weights_b) = runs
    assert losses_a == losses_b
    assert all(np.array_equal(weights_a[k], weights_b[k]) for k in weights_a)


def test_canonical_shapes_cover_the_model(spec: Spec) -> None:
    """No trainable variable is left out of the canonical mapping (it would silently not be exported)."""
    for arch in ARCHS:
        model = _fresh(arch, spec)
        count = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        shapes = canonical_shapes(arch, spec, IMAGE_SHAPE, NUM_CLASSES)
        assert count == sum(int(np.prod(s)) for s in shapes.values())
