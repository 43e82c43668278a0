"""Each architecture's torch forward against rosetta_common.reference.forward on asymmetric weights."""

from __future__ import annotations

import numpy as np
import pytest

import rosetta_torch
from rosetta_common.interface import check_backend
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES, asymmetric_weights

FORWARD_ABS = 1e-5  # fp32 forward vs the float64 reference


def _images(batch: int, shape: tuple[int, int] = IMAGE_SHAPE, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, *shape), dtype=np.float32)


def test_package_implements_the_backend_interface() -> None:
    check_backend(rosetta_torch)
    assert rosetta_torch.FRAMEWORK == "torch"


@pytest.mark.parametrize("arch", ARCHS)
def test_output_shapes(arch: str, spec: Spec) -> None:
    model = rosetta_torch.build(arch, spec, asymmetric_weights(arch, spec, 0))
    for batch in (1, 5):
        logits = rosetta_torch.predict(model, _images(batch))
        assert logits.shape == (batch, NUM_CLASSES)
        assert logits.dtype == np.float32


# (6, 10): non-square, so a swapped height/width or a wrong flatten order cannot pass.
@pytest.mark.parametrize("shape", [IMAGE_SHAPE, (6, 10)])
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_reference(arch: str, shape: tuple[int, int], spec: Spec) -> None:
    weights = asymmetric_weights(arch, spec, 7, shape)
    model = rosetta_torch.build(arch, spec, weights, image_shape=shape)
    images = _images(5, shape)
    assert max_abs_diff(rosetta_torch.predict(model, images), forward(arch, spec, weights, images)) <= FORWARD_ABS


def test_forward_matches_reference_at_full_size() -> None:
    """params.yaml's own sizes (embed 512, 8 heads): the shipped attention, not only the small one."""
    spec = Spec()
    weights = asymmetric_weights("attention", spec, 2)
    images = _images(3)
    logits = rosetta_torch.predict(rosetta_torch.build("attention", spec, weights), images)
    assert max_abs_diff(logits, forward("attention", spec, weights, images)) <= FORWARD_ABS


def test_predict_leaves_no_autograd_state(spec: Spec) -> None:
    model = rosetta_torch.build("mlp", spec, asymmetric_weights("mlp", spec, 0))
    rosetta_torch.predict(model, _images(2))
    assert all(p.grad is None for p in model.parameters())
    assert not model.training


def test_unknown_architecture_is_refused(spec: Spec) -> None:
    with pytest.raises(ValueError, match="unknown"):
        rosetta_torch.build("resnet", spec, asymmetric_weights("mlp", spec, 0))
