"""Canonical <-> native weights: exact round trip, and wrong weights are refused."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

import rosetta_jax
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES
from rosetta_common.weights import canonical_shapes, random_weights


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_is_exact(arch: str, spec: Spec) -> None:
    weights = random_weights(canonical_shapes(arch, spec, IMAGE_SHAPE, NUM_CLASSES), 3)
    back = rosetta_jax.canonical_weights(rosetta_jax.build(arch, spec, weights))
    assert list(back) == list(weights)  # same names, canonical order
    for name, value in weights.items():
        assert back[name].dtype == np.float32
        assert np.array_equal(back[name], value), name


def test_conv_kernel_is_hwio_without_transpose(spec: Spec) -> None:
    """Flax keeps conv kernels HWIO like the canonical layout: the native tensor is the canonical one."""
    weights = random_weights(canonical_shapes("cnn", spec, IMAGE_SHAPE, NUM_CLASSES), 4)
    model = rosetta_jax.build("cnn", spec, weights)
    assert np.array_equal(np.asarray(model.conv2.kernel[...]), weights["conv2.kernel"])


def test_build_does_not_alias_caller_arrays(spec: Spec) -> None:
    weights = random_weights(canonical_shapes("mlp", spec, IMAGE_SHAPE, NUM_CLASSES), 5)
    model = rosetta_jax.build("mlp", spec, weights)
    weights["head.bias"][:] = 0.0
    assert not np.array_equal(rosetta_jax.canonical_weights(model)["head.bias"], weights["head.bias"])


def test_every_parameter_is_canonical(spec: Spec) -> None:
    """No NNX parameter exists outside the canonical names (nothing is silently left at init)."""
    weights = random_weights(canonical_shapes("attention", spec, IMAGE_SHAPE, NUM_CLASSES), 6)
    model = rosetta_jax.build("attention", spec, weights)
    names = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model))}
    assert names == set(weights)


def test_wrong_names_or_shapes_are_refused(spec: Spec) -> None:
    weights = random_weights(canonical_shapes("mlp", spec, IMAGE_SHAPE, NUM_CLASSES), 7)
    renamed = {("dense." + k if k.startswith("hidden") else k): v for k, v in weights.items()}
    with pytest.raises(ValueError, match="names differ"):
        rosetta_jax.build("mlp", spec, renamed)
    with pytest.raises(ValueError, match="shape"):
        rosetta_jax.build("mlp", spec, {**weights, "hidden.bias": np.zeros(31, np.float32)})
