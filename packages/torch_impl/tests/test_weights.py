"""Canonical <-> torch weights: exact round trip, each layout rule pinned on its own, wrong weights refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rosetta_torch
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, asymmetric_weights
from rosetta_torch.weights import torch_name


@pytest.mark.parametrize("shape", [IMAGE_SHAPE, (6, 10)])
@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_is_exact(arch: str, shape: tuple[int, int], spec: Spec) -> None:
    weights = asymmetric_weights(arch, spec, 3, shape)
    back = rosetta_torch.canonical_weights(rosetta_torch.build(arch, spec, weights, image_shape=shape))
    assert list(back) == list(weights)  # same names, canonical order
    for name, value in weights.items():
        assert back[name].dtype == np.float32 and back[name].flags.c_contiguous
        assert np.array_equal(back[name], value), name


def test_every_torch_parameter_is_canonical(spec: Spec) -> None:
    """No torch parameter exists outside the canonical names (nothing silently left at its init)."""
    weights = asymmetric_weights("attention", spec, 6)
    model = rosetta_torch.build("attention", spec, weights)
    assert {name for name, _ in model.named_parameters()} == {torch_name(k) for k in weights}


def test_dense_and_conv_layouts(spec: Spec) -> None:
    """Linear.weight is the transposed kernel; Conv2d.weight is OIHW: kernel.transpose(3, 2, 0, 1)."""
    weights = asymmetric_weights("cnn", spec, 4)
    model = rosetta_torch.build("cnn", spec, weights)
    conv = model.conv2.weight.detach().numpy()
    assert np.array_equal(conv, weights["conv2.kernel"].transpose(3, 2, 0, 1))
    o, i, kh, kw = 5, 2, 0, 1  # one element by hand: out channel o, in channel i, row kh, column kw
    assert conv[o, i, kh, kw] == weights["conv2.kernel"][kh, kw, i, o]
    mlp = asymmetric_weights("mlp", spec, 4)
    assert np.array_equal(rosetta_torch.build("mlp", spec, mlp).hidden.weight.detach().numpy(), mlp["hidden.kernel"].T)


def test_cnn_head_rows_follow_the_nhwc_flatten(spec: Spec) -> None:
    """Canonical head row (h, w, c) is torch's input column (c, h, w) of the NCHW flatten."""
    shape = (6, 10)  # pooled 3 x 5: non-square
    weights = asymmetric_weights("cnn", spec, 5, shape)
    head = rosetta_torch.build("cnn", spec, weights, image_shape=shape).head.weight.detach().numpy()
    h2, w2, c2 = 3, 5, spec.architecture.cnn.conv2_filters
    for h, w, c in [(0, 0, 1), (2, 4, 7), (1, 3, 0)]:
        assert np.array_equal(head[:, c * h2 * w2 + h * w2 + w], weights["head.kernel"][(h * w2 + w) * c2 + c])


def test_build_copies_the_callers_arrays(spec: Spec) -> None:
    weights = asymmetric_weights("mlp", spec, 5)
    model = rosetta_torch.build("mlp", spec, weights)
    weights["head.bias"][:] = 0.0
    assert not np.array_equal(rosetta_torch.canonical_weights(model)["head.bias"], weights["head.bias"])


def test_model_is_on_the_default_device_in_eval_mode(spec: Spec) -> None:
    model = rosetta_torch.build("mlp", spec, asymmetric_weights("mlp", spec, 5))
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert all(p.device.type == expected for p in model.parameters())
    assert not model.training


def test_wrong_names_or_shapes_are_refused(spec: Spec) -> None:
    weights = asymmetric_weights("mlp", spec, 7)
    renamed = {("dense." + k if k.startswith("hidden") else k): v for k, v in weights.items()}
    with pytest.raises(ValueError, match="names differ"):
        rosetta_torch.build("mlp", spec, renamed)
    with pytest.raises(ValueError, match="shape"):
        rosetta_torch.build("mlp", spec, {**weights, "hidden.bias": np.zeros(31, np.float32)})
    attention = asymmetric_weights("attention", spec, 7)
    with pytest.raises(ValueError, match="names differ"):
        rosetta_torch.build("attention", spec, {k: v for k, v in attention.items() if k != "block.attn.key.kernel"})


def test_non_square_cnn_needs_the_image_shape(spec: Spec) -> None:
    weights = asymmetric_weights("cnn", spec, 8, (6, 10))
    with pytest.raises(ValueError, match="pass image_shape"):
        rosetta_torch.build("cnn", spec, weights)
