"""Each architecture's Keras forward against rosetta_common.reference.forward on asymmetric weights."""

from __future__ import annotations

import numpy as np
import pytest

import rosetta_tf
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES, asymmetric_weights

FORWARD_ABS = 1e-5  # fp32 forward vs the float64 reference


def _images(batch: int, shape: tuple[int, int] = IMAGE_SHAPE, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, *shape), dtype=np.float32)


@pytest.mark.parametrize("arch", ARCHS)
def test_output_shapes(arch: str, spec: Spec) -> None:
    model = rosetta_tf.build(arch, spec, asymmetric_weights(arch, spec, 0))
    for batch in (1, 5):
        logits = rosetta_tf.predict(model, _images(batch))
        assert logits.shape == (batch, NUM_CLASSES)
        assert logits.dtype == np.float32


# (6, 10): non-square, so a swapped height/width or a wrong flatten order cannot pass.
@pytest.mark.parametrize("shape", [IMAGE_SHAPE, (6, 10)])
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_reference(arch: str, shape: tuple[int, int], spec: Spec) -> None:
    weights = asymmetric_weights(arch, spec, 7, shape)
    model = rosetta_tf.build(arch, spec, weights, image_shape=shape)
    images = _images(5, shape)
    expected = forward(arch, spec, weights, images)
    assert max_abs_diff(rosetta_tf.predict(model, images), expected) <= FORWARD_ABS


def test_unknown_architecture_is_refused(spec: Spec) -> None:
    weights = asymmetric_weights("mlp", spec, 0)
    with pytest.raises(ValueError, match="unknown"):
        rosetta_tf.build("resnet", spec, weights)
