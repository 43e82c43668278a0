"""The NNX <-> canonical mapping leaves no variable out (one left out would silently not be trained from the
shared init nor exported), the recurrent cells hold the canonical tensors where weights.py says, and each of its
conventions, planted wrong, is caught against the float64 reference even though the round trip alone cannot see
it (the same wrong map applied both ways is its own inverse). Round trips and the forward itself are the
conformance suite's."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

import rosetta_jax
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, asymmetric_weights, small_config
from rosetta_common.weights import is_statistic
from rosetta_jax import weights
from rosetta_jax.weights import native_name

FORWARD_ABS = Spec().tolerances.forward_parity_abs
NON_SQUARE = (6, 10)
FAR = 100  # "by far": a planted mistake must miss by this many tolerances


@pytest.mark.parametrize("arch", ARCHS)
def test_every_variable_is_canonical(arch: str) -> None:
    """Every NNX variable of a built model is a canonical tensor under its native path: the parameters (nnx.Param)
    the trainable and frozen ones, the BatchNorm running statistics (nnx.BatchStat) the statistics, nothing else
    (no RNG stream, no cache), and no path holds two canonical names."""
    config = small_config(arch)
    w = asymmetric_weights(config, 0)
    model = rosetta_jax.build(config, w)
    paths: dict[type, set[str]] = {}
    for path, variable in nnx.to_flat_state(nnx.state(model)):
        paths.setdefault(type(variable), set()).add(".".join(str(p) for p in path))
    native = [native_name(name) for name in w]
    assert len(set(native)) == len(native)
    assert paths.pop(nnx.Param) == {native_name(name) for name in w if not is_statistic(name)}
    statistics = {native_name(name) for name in w if is_statistic(name)}
    assert paths.pop(nnx.BatchStat, set()) == statistics
    assert paths == {}
    assert bool(statistics) == (arch == "resnet")


def test_canonical_names_read_as_nnx_paths() -> None:
    assert native_name("block.attn.query.kernel") == "block.attn.query.kernel"
    assert native_name("pos_embedding") == "pos_embedding"
    assert native_name("block.bn1.scale") == "block.bn1.scale"
    assert native_name("block.shortcut.bn.running_mean") == "block.shortcut.bn.mean"
    assert native_name("block.shortcut.bn.running_var") == "block.shortcut.bn.var"
    assert native_name("lstm.bias") == "lstm.cell.dense_h.bias"
    assert native_name("gru.recurrent_bias") == "gru.cell.dense_h.bias"


def test_lstm_layout_is_the_canonical_one() -> None:
    """nnx.OptimizedLSTMCell keeps i, f, g, o and one bias on the hidden side: the canonical tensors, unpermuted."""
    config = small_config("lstm", NON_SQUARE)
    w = asymmetric_weights(config, 2)
    cell = rosetta_jax.build(config, w).lstm.cell
    for name, native in (("kernel", cell.dense_i.kernel), ("recurrent_kernel", cell.dense_h.kernel),
                         ("bias", cell.dense_h.bias)):
        np.testing.assert_array_equal(np.asarray(native[...]), w[f"lstm.{name}"], err_msg=name)
    assert cell.dense_i.bias is None


def test_gru_biases_keep_their_sides() -> None:
    """GRUCell's input Linear holds b_ir b_iz b_in, its recurrent Linear b_hr b_hz b_hn, gates r, z, n as
    canonical."""
    config = small_config("gru", NON_SQUARE)
    w = asymmetric_weights(config, 8)
    cell = rosetta_jax.build(config, w).gru.cell
    for name, native in (("kernel", cell.dense_i.kernel), ("input_bias", cell.dense_i.bias),
                         ("recurrent_kernel", cell.dense_h.kernel), ("recurrent_bias", cell.dense_h.bias)):
        np.testing.assert_array_equal(np.asarray(native[...]), w[f"gru.{name}"], err_msg=name)


def _logits_error(arch: str, seed: int = 7) -> float:
    """max |native - reference| of the inference forward of a freshly built model."""
    config = small_config(arch, NON_SQUARE)
    w = asymmetric_weights(config, seed)
    images = np.random.default_rng(seed).random((5, *NON_SQUARE), dtype=np.float32)
    return max_abs_diff(rosetta_jax.predict(rosetta_jax.build(config, w), images), forward(config, w, images))


@pytest.mark.parametrize(("arch", "wrong_order"), [("lstm", ("f", "i", "g", "o")), ("lstm", ("i", "f", "o", "g")),
                                                   ("gru", ("z", "r", "n"))],
                         ids=["lstm-i_f", "lstm-g_o", "gru-keras_z_r"])
def test_a_wrong_gate_order_is_caught(monkeypatch: pytest.MonkeyPatch, arch: str, wrong_order: tuple[str, ...]) -> None:
    assert _logits_error(arch) <= FORWARD_ABS
    monkeypatch.setitem(weights.FLAX_GATES, arch, wrong_order)
    assert _logits_error(arch) > FAR * FORWARD_ABS


def test_gru_biases_on_the_wrong_side_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _logits_error("gru") <= FORWARD_ABS
    monkeypatch.setitem(weights.RENAMED, "gru.input_bias", "gru.cell.dense_h.bias")
    monkeypatch.setitem(weights.RENAMED, "gru.recurrent_bias", "gru.cell.dense_i.bias")
    assert _logits_error("gru") > FAR * FORWARD_ABS
