"""The Keras <-> canonical mapping leaves no variable out (one left out would silently not be trained from the
shared init nor exported), and each of its conventions, planted wrong, is caught against the float64 reference
even though the round trip alone cannot see it (the same wrong map applied both ways is its own inverse).
Round trips and the forward itself are the conformance suite's."""

from __future__ import annotations

import numpy as np
import pytest

import rosetta_tf
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, asymmetric_weights, small_config
from rosetta_common.weights import is_frozen, is_statistic
from rosetta_tf import weights as tf_weights
from rosetta_tf.weights import bindings

FORWARD_ABS = Spec().tolerances.forward_parity_abs
NON_SQUARE = (6, 10)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_variable_is_canonical(arch: str) -> None:
    config = small_config(arch)
    model = rosetta_tf.build(config, asymmetric_weights(config, 0))
    bound = bindings(model)
    places = [(id(b.variable), b.row) for b in bound.values()]
    assert len(set(places)) == len(places)  # no variable (or row of one) mapped twice
    trainable = {id(b.variable) for name, b in bound.items() if not is_statistic(name) and not is_frozen(name)}
    statistics = {id(b.variable) for name, b in bound.items() if is_statistic(name)}
    frozen = {id(b.variable) for name, b in bound.items() if is_frozen(name)}
    assert {id(v) for v in model.trainable_variables} == trainable
    # The non-trainable ones are BatchNorm's running statistics, the frozen parameters (the text model's key bias:
    # rosetta_common.weights.FROZEN), and the seed-generator state of the layers that can drop units (Dropout, the
    # LSTM and GRU cells; none draws here): no weight.
    seeds = {id(v) for v in model.non_trainable_variables if "seed_generator" in v.path}
    assert {id(v) for v in model.non_trainable_variables} == statistics | frozen | seeds
    assert len(frozen) == (1 if arch == "text_transformer" else 0)
    assert len(seeds) == (1 if arch in ("resnet", "lstm", "gru") else 0)


def test_gru_layout_is_keras_z_r_h_with_a_two_row_bias() -> None:
    """Where each canonical GRU block lands in Keras: gate blocks z, r, h (canonical r, z, n), the input bias in
    row 0 and the recurrent bias in row 1 of the (2, 3h) variable."""
    config = small_config("gru")
    weights = asymmetric_weights(config, 1)
    layer = rosetta_tf.build(config, weights).get_layer("gru")
    hidden = config.settings.hidden
    r, z, n = (slice(i * hidden, (i + 1) * hidden) for i in range(3))
    for name, keras_value in (("kernel", layer.cell.kernel), ("recurrent_kernel", layer.cell.recurrent_kernel)):
        expected = weights[f"gru.{name}"]
        np.testing.assert_array_equal(np.asarray(keras_value), np.concatenate(
            [expected[:, z], expected[:, r], expected[:, n]], axis=-1), err_msg=name)
    bias = np.asarray(layer.cell.bias)
    assert bias.shape == (2, 3 * hidden)
    for row, name in enumerate(("gru.input_bias", "gru.recurrent_bias")):
        expected = weights[name]
        np.testing.assert_array_equal(bias[row], np.concatenate([expected[z], expected[r], expected[n]]))


def test_lstm_layout_is_the_canonical_one() -> None:
    """Keras' LSTM keeps i, f, c, o and one bias: the canonical tensors, unpermuted."""
    config = small_config("lstm")
    weights = asymmetric_weights(config, 2)
    cell = rosetta_tf.build(config, weights).get_layer("lstm").cell
    for name in ("kernel", "recurrent_kernel", "bias"):
        np.testing.assert_array_equal(np.asarray(getattr(cell, name)), weights[f"lstm.{name}"], err_msg=name)


# (architecture, module attribute of rosetta_tf.weights, the planted value): each a mapping mistake a Keras
# port could make. LSTM: i and f exchanged; GRU: Keras' z, r, h taken for the canonical r, z, n (no
# permutation); GRU: the input and recurrent bias rows exchanged.
PLANTED_MAPS = [("lstm", "LSTM_GATES", (1, 0, 2, 3)), ("gru", "GRU_GATES", (0, 1, 2)),
                ("gru", "GRU_BIAS_ROWS", {"input_bias": 1, "recurrent_bias": 0})]


@pytest.mark.parametrize(("arch", "attribute", "planted"), PLANTED_MAPS, ids=[p[1] for p in PLANTED_MAPS])
def test_a_planted_mapping_mistake_fails_the_reference(arch: str, attribute: str, planted: object,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    config = small_config(arch, NON_SQUARE)
    weights = asymmetric_weights(config, 3)
    images = np.random.default_rng(4).random((5, *NON_SQUARE), dtype=np.float32)
    expected = forward(config, weights, images)
    assert max_abs_diff(rosetta_tf.predict(rosetta_tf.build(config, weights), images), expected) <= FORWARD_ABS
    monkeypatch.setattr(tf_weights, attribute, planted)
    model = rosetta_tf.build(config, weights)
    back = rosetta_tf.to_canonical(model)
    assert all(np.array_equal(back[k], weights[k]) for k in weights)  # the round trip cannot see it...
    assert max_abs_diff(rosetta_tf.predict(model, images), expected) > 100 * FORWARD_ABS  # ...the reference does

