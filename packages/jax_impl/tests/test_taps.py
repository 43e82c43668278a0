"""Porting mistakes in the Flax model code, planted, are localized by the taps to the layer where they enter
(the conformance suite plants the weight-mapping ones in every framework)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import rosetta_jax
from rosetta_common.reference import forward_with_taps
from rosetta_common.spec import Spec
from rosetta_common.testing import assert_localized, planted_case
from rosetta_jax import models

TAP_ABS = Spec().tolerances.forward_parity_abs  # the conformance suite's bound for every tap


def test_symmetric_padding_enters_at_the_stride_two_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's padding=1 instead of "SAME": the stem (stride 1) and the 1x1 shortcut pad alike, the stride-2 3x3
    conv does not."""
    config, weights, images = planted_case("resnet", 60)

    def torch_padding(in_channels: int, out_channels: int, kernel: int, stride: int, *, rngs: nnx.Rngs) -> nnx.Conv:
        pad = (kernel - 1) // 2
        return nnx.Conv(in_channels, out_channels, kernel_size=(kernel, kernel), strides=stride,
                        padding=((pad, pad), (pad, pad)), use_bias=False, rngs=rngs)

    monkeypatch.setattr(models, "conv", torch_padding)
    taps = rosetta_jax.forward_with_taps(rosetta_jax.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.conv1", TAP_ABS)


def test_batchnorm_epsilon_enters_at_its_batchnorm() -> None:
    """Keras' default epsilon (1e-3) where the spec says 1e-5, on the second conv's BatchNorm only."""
    config, weights, images = planted_case("resnet", 61)
    weights = {k: (v * 0.1 if k.endswith("running_var") else v) for k, v in weights.items()}  # eps matters more
    model = rosetta_jax.build(config, weights)
    model.block.bn2.epsilon = 1e-3
    taps = rosetta_jax.forward_with_taps(model, images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.bn2", TAP_ABS)


def test_tanh_gelu_enters_at_the_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """nnx.gelu's default, the tanh approximation, where the spec is exact (erf)."""
    config, weights, images = planted_case("attention", 62)
    monkeypatch.setattr(models.nnx, "gelu", lambda x, approximate=True: jax.nn.gelu(x, approximate=True))
    taps = rosetta_jax.forward_with_taps(rosetta_jax.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.mlp.gelu", TAP_ABS)


def test_a_missing_attention_scale_enters_at_the_attention_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores not divided by sqrt(head_dim), planted in the method SelfAttention.__call__ computes its weights
    with: q, k and v still agree, the softmax does not (the tap is that method's output)."""
    config, weights, images = planted_case("attention", 63)

    def unscaled(self: models.SelfAttention, q: jax.Array, k: jax.Array) -> jax.Array:
        return jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)

    monkeypatch.setattr(models.SelfAttention, "attention_weights", unscaled)
    taps = rosetta_jax.forward_with_taps(rosetta_jax.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.attn.weights", TAP_ABS)
