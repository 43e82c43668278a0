"""torch's side of the canonical layout: state-dict names, each transpose pinned on one element, the CNN
head's row permutation, the recurrent layers' gate blocks and biases, BatchNorm's extra counter, and proof
that the forward-vs-reference check catches each of them mapped wrong."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import rosetta_torch
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.testing import ARCHS, asymmetric_weights, small_config
from rosetta_common.weights import is_statistic
from rosetta_torch import weights as torch_weights
from rosetta_torch.weights import TRACKED, torch_name

FORWARD_ABS = Spec().tolerances.forward_parity_abs  # the bound the conformance suite applies
PLANTED_MIN_ERROR = 1e-2  # a wrong layout moves the logits by far more than float32 rounding
NON_SQUARE = (6, 10)  # pooled 3 x 5 for the CNN: a swapped height/width cannot pass


@pytest.mark.parametrize("arch", ARCHS)
def test_every_trainable_torch_parameter_is_canonical(arch: str) -> None:
    """No trainable torch parameter exists outside the canonical names (nothing silently left at its init);
    the one frozen parameter is the LSTM's bias_hh, held at zero (the text model's q, k and v share in_proj)."""
    config = small_config(arch)
    weights = asymmetric_weights(config, 6)
    model = rosetta_torch.build(config, weights)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {torch_name(k, arch) for k in weights if not is_statistic(k)}
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen == ({"lstm.bias_hh_l0"} if arch == "lstm" else set())
    assert {name for name, _ in model.named_buffers() if not name.endswith(TRACKED)} == {
        torch_name(k) for k in weights if is_statistic(k)}


def test_canonical_names_read_as_torch_names() -> None:
    assert torch_name("block.norm1.scale") == "block.norm1.weight"
    assert torch_name("block.attn.query.kernel") == "block.attn.query.weight"
    assert torch_name("pos_embedding") == "pos_embedding"
    assert torch_name("block.bn1.scale") == "block.bn1.weight"
    assert torch_name("block.shortcut.bn.running_var") == "block.shortcut.bn.running_var"
    assert torch_name("gru.recurrent_bias") == "gru.bias_hh_l0"


def test_dense_and_conv_layouts() -> None:
    """Linear.weight is the transposed kernel; Conv2d.weight is OIHW: kernel.transpose(3, 2, 0, 1)."""
    config = small_config("cnn")
    weights = asymmetric_weights(config, 4)
    conv = rosetta_torch.build(config, weights).conv2.weight.detach().cpu().numpy()
    np.testing.assert_array_equal(conv, weights["conv2.kernel"].transpose(3, 2, 0, 1))
    o, i, kh, kw = 5, 2, 0, 1  # one element by hand: out channel o, in channel i, row kh, column kw
    assert conv[o, i, kh, kw] == weights["conv2.kernel"][kh, kw, i, o]
    config = small_config("mlp")
    mlp = asymmetric_weights(config, 4)
    hidden = rosetta_torch.build(config, mlp).hidden.weight.detach().cpu().numpy()
    np.testing.assert_array_equal(hidden, mlp["hidden.kernel"].T)


def test_cnn_head_rows_follow_the_nhwc_flatten() -> None:
    """Canonical head row (h, w, c) is torch's input column (c, h, w) of the NCHW flatten."""
    config = small_config("cnn", NON_SQUARE)
    weights = asymmetric_weights(config, 5)
    head = rosetta_torch.build(config, weights).head.weight.detach().cpu().numpy()
    h2, w2, c2 = 3, 5, config.settings.conv2_filters
    for h, w, c in [(0, 0, 1), (2, 4, 7), (1, 3, 0)]:
        assert head[:, c * h2 * w2 + h * w2 + w].tolist() == weights["head.kernel"][(h * w2 + w) * c2 + c].tolist()


Layout = Callable[[ModelConfig, str, np.ndarray], np.ndarray]
_ORIGINAL: Layout = torch_weights.to_torch_layout


def _without_head_permutation(config: ModelConfig, name: str, value: np.ndarray) -> np.ndarray:
    return value.T if name == "head.kernel" else _ORIGINAL(config, name, value)


def _conv_kernel_as_hwoi(config: ModelConfig, name: str, value: np.ndarray) -> np.ndarray:
    if name == "conv2.kernel":  # (kh, kw, in, out) -> (out, in, kw, kh): height and width swapped
        return value.transpose(3, 2, 1, 0)
    return _ORIGINAL(config, name, value)


@pytest.mark.parametrize("planted", [_without_head_permutation, _conv_kernel_as_hwoi],
                         ids=["cnn_head_unpermuted", "conv_kernel_transposed"])
def test_forward_vs_reference_catches_a_planted_layout_bug(planted: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    """The conformance suite's forward check is what guards weights.py: with a wrong mapping planted, the
    same comparison, which passes without it, must fail by orders of magnitude."""
    config = small_config("cnn", NON_SQUARE)
    weights = asymmetric_weights(config, 6)
    images = np.random.default_rng(8).random((5, *NON_SQUARE), dtype=np.float32)
    expected = forward(config, weights, images)
    assert max_abs_diff(rosetta_torch.predict(rosetta_torch.build(config, weights), images), expected) <= FORWARD_ABS
    monkeypatch.setattr(torch_weights, "to_torch_layout", planted)
    wrong = rosetta_torch.predict(rosetta_torch.build(config, weights), images)
    assert max_abs_diff(wrong, expected) >= PLANTED_MIN_ERROR


def test_model_is_on_the_default_device_in_eval_mode() -> None:
    config = small_config("mlp")
    model = rosetta_torch.build(config, asymmetric_weights(config, 5))
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert all(p.device.type == expected for p in model.parameters())
    assert not model.training


def test_predict_leaves_no_autograd_state(images: np.ndarray) -> None:
    config = small_config("mlp")
    model = rosetta_torch.build(config, asymmetric_weights(config, 0))
    model.train()
    rosetta_torch.predict(model, images)
    assert all(p.grad is None for p in model.parameters())
    assert not model.training


def test_recurrent_names_and_layouts() -> None:
    """weight_ih_l0 is the transposed kernel with the gate blocks in the same order (i, f, g, o / r, z, n): gate
    block j of torch's rows is canonical column block j."""
    for arch, gates in (("lstm", 4), ("gru", 3)):
        config = small_config(arch, NON_SQUARE)
        weights = asymmetric_weights(config, 7)
        rnn = getattr(rosetta_torch.build(config, weights), arch)
        hidden = config.settings.hidden
        for canonical, native in (("kernel", rnn.weight_ih_l0), ("recurrent_kernel", rnn.weight_hh_l0)):
            native = native.detach().cpu().numpy()
            assert native.shape == weights[f"{arch}.{canonical}"].shape[::-1]
            for gate in range(gates):  # one element per gate block, by hand
                assert native[gate * hidden + 1, 2] == weights[f"{arch}.{canonical}"][2, gate * hidden + 1]
        assert torch_name(f"{arch}.kernel") == f"{arch}.weight_ih_l0"


def test_lstm_bias_goes_to_bias_ih_with_a_frozen_zero_bias_hh() -> None:
    config = small_config("lstm")
    weights = asymmetric_weights(config, 8)
    lstm = rosetta_torch.build(config, weights).lstm
    np.testing.assert_array_equal(lstm.bias_ih_l0.detach().cpu().numpy(), weights["lstm.bias"])
    assert not lstm.bias_hh_l0.detach().any() and not lstm.bias_hh_l0.requires_grad
    assert lstm.bias_ih_l0.requires_grad and lstm.weight_ih_l0.requires_grad


def test_gru_biases_keep_their_sides() -> None:
    config = small_config("gru")
    weights = asymmetric_weights(config, 8)
    gru = rosetta_torch.build(config, weights).gru
    np.testing.assert_array_equal(gru.bias_ih_l0.detach().cpu().numpy(), weights["gru.input_bias"])
    np.testing.assert_array_equal(gru.bias_hh_l0.detach().cpu().numpy(), weights["gru.recurrent_bias"])


def test_batchnorm_counters_are_not_canonical_and_loading_stays_strict() -> None:
    """num_batches_tracked is torch's own: absent from the canonical weights, a forward_train counts in it as
    torch does, without it leaking out, and loading (strict) sets it to zero, as a fresh build holds it: a model
    trained before and loaded is the model a build from the same weights makes, counters and all."""
    config = small_config("resnet")
    weights = asymmetric_weights(config, 9)
    model = rosetta_torch.build(config, weights)
    counters = [name for name in model.state_dict() if name.endswith(TRACKED)]
    assert len(counters) == 4 and not any(name.endswith(TRACKED) for name in weights)
    rosetta_torch.forward_train(model, np.zeros((3, *config.image_shape), np.float32), None)
    assert all(int(model.state_dict()[name]) == 1 for name in counters)
    back = rosetta_torch.to_canonical(model)
    assert list(back) == list(weights)
    rosetta_torch.from_canonical(model, weights)  # strict load_state_dict with the counters filled in
    fresh = rosetta_torch.build(config, weights).state_dict()
    assert all(int(model.state_dict()[name]) == 0 for name in counters)
    assert all(torch.equal(value, fresh[name]) for name, value in model.state_dict().items())


_ORIGINAL_GATES = dict(torch_weights.GATE_ORDER)


def _plant_gate_order(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """Gates 0 and 1 exchanged (LSTM i <-> f; GRU r <-> z, as Keras' z, r, h order read as torch's would)."""
    order = list(_ORIGINAL_GATES[arch])
    order[0], order[1] = order[1], order[0]
    monkeypatch.setitem(torch_weights.GATE_ORDER, arch, tuple(order))


def _plant_lstm_bias_twice(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """The canonical bias given to both bias_ih and bias_hh: torch adds them, so the model sees it twice."""
    del arch
    monkeypatch.setattr(torch_weights, "split_lstm_bias", lambda bias: (bias, bias))


def _plant_gru_bias_sides_swapped(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """input_bias and recurrent_bias exchanged: b_hn is inside r * (...), b_in outside, so the sides matter."""
    del arch
    names = torch_weights._RECURRENT_NAMES
    monkeypatch.setitem(names, "gru.input_bias", "gru.bias_hh_l0")
    monkeypatch.setitem(names, "gru.recurrent_bias", "gru.bias_ih_l0")


Plant = Callable[[pytest.MonkeyPatch, str], None]


@pytest.mark.parametrize(("arch", "plant"), [("lstm", _plant_gate_order), ("gru", _plant_gate_order),
                                             ("lstm", _plant_lstm_bias_twice), ("gru", _plant_gru_bias_sides_swapped)],
                         ids=["lstm_gate_order", "gru_gate_order", "lstm_bias_counted_twice", "gru_bias_sides_swapped"])
def test_forward_vs_reference_catches_a_planted_recurrent_mapping(arch: str, plant: Plant,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    config = small_config(arch, NON_SQUARE)
    weights = asymmetric_weights(config, 6)
    images = np.random.default_rng(8).random((5, *NON_SQUARE), dtype=np.float32)
    expected = forward(config, weights, images)
    assert max_abs_diff(rosetta_torch.predict(rosetta_torch.build(config, weights), images), expected) <= FORWARD_ABS
    plant(monkeypatch, arch)
    wrong = rosetta_torch.predict(rosetta_torch.build(config, weights), images)
    assert max_abs_diff(wrong, expected) >= PLANTED_MIN_ERROR
