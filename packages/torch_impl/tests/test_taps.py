"""Porting mistakes in torch's model code, planted, are localized by the taps to the layer where they enter
(the conformance suite plants the weight-mapping ones in every framework)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

import rosetta_torch
from rosetta_common.reference import forward_with_taps
from rosetta_common.spec import Spec
from rosetta_common.testing import assert_localized, planted_case
from rosetta_torch import models as torch_models

TAP_ABS = Spec().tolerances.forward_parity_abs  # the conformance suite's bound for every tap


def _symmetric_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    del size, stride
    return (kernel - 1) // 2, (kernel - 1) // 2  # torch's padding=1 for a 3x3 kernel, on both sides


def test_symmetric_padding_enters_at_the_stride_two_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's padding=1 instead of TensorFlow's "same": the stem (stride 1) and the 1x1 shortcut pad alike, the
    stride-2 3x3 conv does not."""
    config, weights, images = planted_case("resnet", 40)
    monkeypatch.setattr(torch_models, "same_padding", _symmetric_padding)
    taps = rosetta_torch.forward_with_taps(rosetta_torch.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.conv1", TAP_ABS)


def test_batchnorm_epsilon_enters_at_its_batchnorm() -> None:
    """Keras' default epsilon (1e-3) where the spec says 1e-5, on one BatchNorm."""
    config, weights, images = planted_case("resnet", 41)
    weights = {k: (v * 0.1 if k.endswith("running_var") else v) for k, v in weights.items()}  # eps matters more
    model = rosetta_torch.build(config, weights)
    model.block.bn1.eps = 1e-3
    taps = rosetta_torch.forward_with_taps(model, images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.bn1", TAP_ABS)


def test_a_missing_attention_scale_enters_at_the_attention_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores not divided by sqrt(head_dim): q, k and v still agree, the softmax does not."""
    config, weights, images = planted_case("attention", 42)
    monkeypatch.setattr(torch_models, "math", SimpleNamespace(sqrt=lambda x: 1.0, prod=math.prod))
    taps = rosetta_torch.forward_with_taps(rosetta_torch.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.attn.weights", TAP_ABS)


def test_tanh_gelu_enters_at_the_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """nn.GELU(approximate="tanh") / F.gelu(approximate="tanh") where the spec is exact (erf)."""
    config, weights, images = planted_case("attention", 43)
    exact = torch_models.F.gelu
    monkeypatch.setattr(torch_models.F, "gelu", lambda x, approximate="none": exact(x, approximate="tanh"))
    taps = rosetta_torch.forward_with_taps(rosetta_torch.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.mlp.gelu", TAP_ABS)
