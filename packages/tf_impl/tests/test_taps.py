"""Porting mistakes in the Keras model code, planted, are localized by the taps to the layer where they enter
(the conformance suite plants the weight-mapping ones in every framework)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from keras import layers, ops

import rosetta_tf
from rosetta_common.reference import forward_with_taps
from rosetta_common.registry import ResNetSpec
from rosetta_common.spec import Spec
from rosetta_common.testing import assert_localized, planted_case
from rosetta_tf import models

TAP_ABS = Spec().tolerances.forward_parity_abs  # the conformance suite's bound for every tap


def test_keras_default_epsilon_enters_at_the_first_batchnorm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' BatchNormalization left at its default epsilon (1e-3; the spec's is 1e-5): the stem's conv agrees,
    its BatchNorm does not."""
    config, weights, images = planted_case("resnet", 50)
    weights = {k: (v * 0.1 if k.endswith("running_var") else v) for k, v in weights.items()}  # eps matters more

    def keras_default(settings: ResNetSpec, name: str) -> layers.BatchNormalization:
        return layers.BatchNormalization(momentum=settings.batchnorm_momentum, name=name)

    monkeypatch.setattr(models, "batchnorm", keras_default)
    taps = rosetta_tf.forward_with_taps(rosetta_tf.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "stem.bn", TAP_ABS)


def test_tanh_gelu_enters_at_the_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """keras.ops.gelu's default, the tanh approximation, where the spec is exact (erf)."""
    config, weights, images = planted_case("attention", 51)

    def tanh_gelu(x: Any) -> Any:
        return 0.5 * x * (1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    monkeypatch.setattr(models, "gelu_exact", tanh_gelu)
    taps = rosetta_tf.forward_with_taps(rosetta_tf.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.mlp.gelu", TAP_ABS)


def test_a_missing_attention_scale_enters_at_the_attention_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores not divided by sqrt(head_dim), planted in the method SelfAttention.call computes its weights with:
    q, k and v still agree, the softmax does not (the tap is that method's output, not a copy of the formula)."""
    config, weights, images = planted_case("attention", 52)

    def unscaled(self: models.SelfAttention, q: Any, k: Any) -> Any:
        return ops.softmax(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), axis=-1)

    monkeypatch.setattr(models.SelfAttention, "attention_weights", unscaled)
    taps = rosetta_tf.forward_with_taps(rosetta_tf.build(config, weights), images)
    assert_localized(taps, forward_with_taps(config, weights, images), "block.attn.weights", TAP_ABS)
