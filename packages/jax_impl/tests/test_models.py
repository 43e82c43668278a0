"""Forward pass: shapes, and parity with rosetta_common.reference on deliberately asymmetric weights."""

from __future__ import annotations

import numpy as np
import pytest

import rosetta_jax
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES
from rosetta_common.weights import canonical_shapes, random_weights

FORWARD_PARITY_ABS = 1e-5


def _random(arch: str, spec: Spec, seed: int = 1) -> dict[str, np.ndarray]:
    return random_weights(canonical_shapes(arch, spec, IMAGE_SHAPE, NUM_CLASSES), seed)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 5])
def test_output_shape(arch: str, batch: int, spec: Spec, images: np.ndarray) -> None:
    logits = rosetta_jax.predict(rosetta_jax.build(arch, spec, _random(arch, spec)), images[:batch])
    assert logits.shape == (batch, NUM_CLASSES)
    assert logits.dtype == np.float32


@pytest.mark.parametrize("arch", ARCHS)
def test_matches_reference_forward(arch: str, spec: Spec, images: np.ndarray) -> None:
    weights = _random(arch, spec)
    logits = rosetta_jax.predict(rosetta_jax.build(arch, spec, weights), images)
    assert max_abs_diff(logits, forward(arch, spec, weights, images)) <= FORWARD_PARITY_ABS


def test_attention_default_size_matches_reference(images: np.ndarray) -> None:
    """The default embed 512 / 8 heads: head splitting at full size, not only in the small spec."""
    spec = Spec()
    weights = _random("attention", spec)
    logits = rosetta_jax.predict(rosetta_jax.build("attention", spec, weights), images)
    assert max_abs_diff(logits, forward("attention", spec, weights, images)) <= FORWARD_PARITY_ABS


def test_cnn_odd_image_size(spec: Spec) -> None:
    """Pooling floors odd sizes (7 -> 3), as the reference does; build() takes the shape when not square."""
    shape = (7, 9)
    weights = random_weights(canonical_shapes("cnn", spec, shape, NUM_CLASSES), 2)
    x = np.random.default_rng(3).random((3, *shape), dtype=np.float32)
    logits = rosetta_jax.predict(rosetta_jax.build("cnn", spec, weights, image_shape=shape), x)
    assert max_abs_diff(logits, forward("cnn", spec, weights, x)) <= FORWARD_PARITY_ABS
