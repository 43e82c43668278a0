"""Canonical weights go into the Keras model and come back out unchanged, in canonical order."""

from __future__ import annotations

import numpy as np
import pytest

import rosetta_tf
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES
from rosetta_common.weights import canonical_shapes, random_weights
from rosetta_tf.weights import infer_shapes


@pytest.mark.parametrize("arch", ARCHS)
def test_canonical_round_trip_is_exact(arch: str, spec: Spec) -> None:
    weights = random_weights(canonical_shapes(arch, spec, IMAGE_SHAPE, NUM_CLASSES), 3)
    back = rosetta_tf.canonical_weights(rosetta_tf.build(arch, spec, weights))
    assert list(back) == list(weights)  # same names, same (canonical) order
    for name, value in weights.items():
        assert back[name].dtype == np.float32
        assert np.array_equal(back[name], value), name


@pytest.mark.parametrize("arch", ARCHS)
def test_shapes_are_inferred_from_weights(arch: str, spec: Spec) -> None:
    weights = random_weights(canonical_shapes(arch, spec, (28, 28), 7), 0)
    assert infer_shapes(arch, weights) == ((28, 28), 7)


def test_missing_and_misshaped_weights_are_refused(spec: Spec) -> None:
    weights = random_weights(canonical_shapes("cnn", spec, IMAGE_SHAPE, NUM_CLASSES), 0)
    with pytest.raises(ValueError, match="missing"):
        rosetta_tf.build("cnn", spec, {k: v for k, v in weights.items() if k != "conv2.bias"})
    bad = dict(weights, **{"conv1.kernel": np.zeros((3, 3, 2, 4), np.float32)})
    with pytest.raises(ValueError, match=r"conv1\.kernel"):
        rosetta_tf.build("cnn", spec, bad)
