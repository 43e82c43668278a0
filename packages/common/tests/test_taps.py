"""rosetta_common.taps: the reference returns every canonical tap, in order and shape, in both modes; and
first_divergent names the first tap over the tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from rosetta_common.reference import forward, forward_train, forward_with_taps
from rosetta_common.taps import first_divergent, tap_diffs, taps
from rosetta_common.testing import ARCHS, asymmetric_weights, random_inputs, small_config
from rosetta_common.training import dropout_features


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_the_reference_returns_every_tap_in_order_and_shape(arch: str, training: bool) -> None:
    config = small_config(arch, (6, 10))
    weights = asymmetric_weights(config, 1)
    images = random_inputs(config, 3, 2) if config.input.kind == "tokens" else \
        np.random.default_rng(2).random((3, 6, 10), dtype=np.float32)
    features = dropout_features(config)
    mask = None if features is None or not training else np.full((3, features), 1.25)
    got = forward_with_taps(config, weights, images, training=training, dropout_mask=mask)
    expected = taps(config, 3)
    assert [(name, value.shape) for name, value in got.items()] == [(t.name, t.shape) for t in expected]
    logits = forward_train(config, weights, images, mask)[0] if training else forward(config, weights, images)
    np.testing.assert_array_equal(got["logits"], logits)  # one forward: the same numbers, not close ones


def test_first_divergent_names_the_first_tap_over_the_tolerance() -> None:
    reference = {"a": np.array([1.0, -2.0]), "b": np.array([4.0]), "c": np.array([0.0, 0.0])}
    same = {name: value.copy() for name, value in reference.items()}
    assert first_divergent(same, reference, 1e-6)[0] is None
    moved = {**same, "b": np.array([4.5]), "c": np.array([0.0, 1.0])}
    first, figures = first_divergent(moved, reference, 0.1)
    assert first == "b"
    assert figures["a"].max_abs == 0.0 and figures["b"].max_abs == 0.5
    assert figures["b"].scale == 4.0 and figures["b"].rel == 0.125
    assert figures["c"].rel == np.inf  # a difference where the reference is all zeros
    assert first_divergent(moved, reference, 1.0)[0] is None  # the tolerance is inclusive
    assert first_divergent({**same, "a": np.array([np.nan, 0.0])}, reference, 1.0)[0] == "a"


def test_tap_diffs_refuses_other_names_order_or_shapes() -> None:
    reference = {"a": np.zeros(2), "b": np.zeros(3)}
    with pytest.raises(ValueError, match="tap names differ"):
        tap_diffs({"b": np.zeros(3), "a": np.zeros(2)}, reference)
    with pytest.raises(ValueError, match="tap b: shape"):
        tap_diffs({"a": np.zeros(2), "b": np.zeros(4)}, reference)
