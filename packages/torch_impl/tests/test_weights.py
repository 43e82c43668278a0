"""torch's side of the canonical layout: state-dict names, each transpose pinned on one element, the CNN
head's row permutation, and proof that the forward-vs-reference check catches a wrong one."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import rosetta_torch
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_torch import weights as torch_weights
from rosetta_torch.weights import torch_name

FORWARD_ABS = Spec().tolerances.forward_parity_abs  # the bound the conformance suite applies
PLANTED_MIN_ERROR = 1e-2  # a wrong layout moves the logits by far more than float32 rounding
NON_SQUARE = (6, 10)  # pooled 3 x 5 for the CNN: a swapped height/width cannot pass


def test_every_torch_parameter_is_canonical() -> None:
    """No torch parameter exists outside the canonical names (nothing silently left at its init)."""
    config = small_config("attention")
    weights = asymmetric_weights(config, 6)
    model = rosetta_torch.build(config, weights)
    assert {name for name, _ in model.named_parameters()} == {torch_name(k) for k in weights}
    assert torch_name("block.norm1.scale") == "block.norm1.weight"
    assert torch_name("block.attn.query.kernel") == "block.attn.query.weight"
    assert torch_name("pos_embedding") == "pos_embedding"


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
