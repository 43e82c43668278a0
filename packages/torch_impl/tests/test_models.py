"""torch's side of the ResNet conventions (models.py): BatchNorm's momentum and running variance, the epsilon,
TensorFlow's "same" padding, and dropout by the shared mask. Each reconciliation, planted wrong, must make the
comparison with the float64 reference fail by far more than its tolerance, on asymmetric weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rosetta_torch
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward, forward_train
from rosetta_common.spec import ModelConfig, Spec, parse_spec
from rosetta_common.testing import asymmetric_weights, small_config, small_spec
from rosetta_common.training import dropout_masks, plan
from rosetta_common.weights import Weights, is_statistic
from rosetta_torch import models as torch_models

FORWARD_ABS = Spec().tolerances.forward_parity_abs
STATISTICS_RTOL = 1e-5  # float32 running statistics vs the float64 reference (as the conformance suite)
PLANTED_FACTOR = 100  # a planted mistake must miss by this many tolerances at least
NON_SQUARE = (7, 10)  # odd height: the stride-2 "same" padding is (1, 1) there, (0, 1) across
BATCH = 4  # small, so that BatchNorm's n / (n - 1) is visible in the running variance


def _setup(seed: int = 3) -> tuple[ModelConfig, Weights, np.ndarray, np.ndarray]:
    config = small_config("resnet", NON_SQUARE)
    images = np.random.default_rng(seed).random((BATCH, *NON_SQUARE), dtype=np.float32)
    masks = dropout_masks(plan(small_spec(batch_size=BATCH), "resnet", 4 * BATCH), config)
    return config, asymmetric_weights(config, seed), images, masks[2]


def _statistics_error(config: ModelConfig, weights: Weights, images: np.ndarray, mask: np.ndarray) -> float:
    """Worst relative difference of the running statistics after one forward_train from the reference's."""
    model = rosetta_torch.build(config, weights)
    rosetta_torch.forward_train(model, images, mask)
    after = rosetta_torch.to_canonical(model)
    expected = forward_train(config, weights, images, mask)[1]
    assert expected and set(expected) == {name for name in after if is_statistic(name)}
    return max(_relative(after[name], expected[name]) for name in expected)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    """Relative difference with a floor of 1e-2 on the scale (as the conformance suite's): a running mean near 0
    would otherwise turn float32 rounding into a large relative figure."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-2)))


def _logits_error(config: ModelConfig, weights: Weights, images: np.ndarray) -> float:
    return max_abs_diff(rosetta_torch.predict(rosetta_torch.build(config, weights), images),
                        forward(config, weights, images))


def test_running_statistics_follow_the_spec() -> None:
    config, weights, images, mask = _setup()
    assert _statistics_error(config, weights, images, mask) <= STATISTICS_RTOL


def test_momentum_passed_unconverted_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's momentum is the new batch's weight: the spec's 0.9 passed as it is keeps 10% of the old average."""
    config, weights, images, mask = _setup()
    monkeypatch.setattr(torch_models, "batchnorm_momentum", lambda momentum: momentum)
    assert _statistics_error(config, weights, images, mask) > PLANTED_FACTOR * STATISTICS_RTOL


def test_missing_variance_correction_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's own update averages the unbiased batch variance: n / (n - 1) too large for the spec."""
    config, weights, images, mask = _setup()
    monkeypatch.setattr(torch_models, "corrected_running_var", lambda running_var, *_: running_var)
    assert _statistics_error(config, weights, images, mask) > PLANTED_FACTOR * STATISTICS_RTOL


def test_variance_correction_leaves_torch_normalizing_with_the_biased_variance() -> None:
    """The correction touches the running variance only: the training-mode logits are torch's own kernel's,
    which normalizes with the biased batch variance as the reference does, and running_mean is torch's."""
    config, weights, images, mask = _setup(4)
    model = rosetta_torch.build(config, weights)
    logits = rosetta_torch.forward_train(model, images, mask)
    expected_logits, statistics = forward_train(config, weights, images, mask)
    assert max_abs_diff(logits, expected_logits) <= FORWARD_ABS
    bn = model.block.bn1
    assert isinstance(bn, torch.nn.BatchNorm2d) and bn.momentum == pytest.approx(1 - config.settings.batchnorm_momentum)
    assert bn.eps == config.settings.batchnorm_epsilon
    np.testing.assert_allclose(bn.running_mean.cpu().numpy(), statistics["block.bn1.running_mean"],
                               rtol=STATISTICS_RTOL, atol=1e-7)


def test_the_spec_epsilon_is_used() -> None:
    """Keras' default epsilon is 1e-3, torch's 1e-5: a spec that sets 1e-3 must reach BatchNorm2d, and the
    difference must show against the reference (running variances far from 1 make it visible)."""
    spec = small_spec().model_dump(mode="json")
    spec["architecture"]["resnet"]["batchnorm_epsilon"] = 1e-3
    config = small_config("resnet", NON_SQUARE, parse_spec(spec))
    _, weights, images, _ = _setup()
    weights = {k: (v * 0.1 if k.endswith("running_var") else v) for k, v in weights.items()}  # eps matters more
    assert _logits_error(config, weights, images) <= FORWARD_ABS
    default = config.model_copy(update={"settings": config.settings.model_copy(update={"batchnorm_epsilon": 1e-5})})
    planted = forward(default, weights, images)  # what torch's default epsilon would compute
    assert max_abs_diff(forward(config, weights, images), planted) > PLANTED_FACTOR * FORWARD_ABS


def _symmetric_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    del size, stride
    return (kernel - 1) // 2, (kernel - 1) // 2  # torch's padding=1 for a 3x3 kernel, on both sides


@pytest.mark.parametrize("image_shape", [(8, 8), NON_SQUARE], ids=["square", "non_square"])
def test_symmetric_padding_is_caught(image_shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's padding=1 on the stride-2 conv pads top and left too: another window, other logits."""
    config = small_config("resnet", image_shape)
    weights = asymmetric_weights(config, 5)
    images = np.random.default_rng(5).random((5, *image_shape), dtype=np.float32)
    assert _logits_error(config, weights, images) <= FORWARD_ABS
    monkeypatch.setattr(torch_models, "same_padding", _symmetric_padding)
    assert _logits_error(config, weights, images) > PLANTED_FACTOR * FORWARD_ABS


def test_stride_two_padding_goes_bottom_right() -> None:
    """The block's stride-2 pad on an 8 x 10 input: one row at the bottom, one column at the right, none before."""
    config = small_config("resnet", (8, 10))
    model = rosetta_torch.build(config, asymmetric_weights(config, 1))
    assert model.block.pad1.padding == (0, 1, 0, 1)  # (left, right, top, bottom)
    assert model.block.pad2.padding == (1, 1, 1, 1)  # stride 1: symmetric, as torch's padding=1
    assert model.block.shortcut.pad.padding == (0, 0, 0, 0)  # 1x1 stride 2 needs none


def test_training_uses_the_shared_mask_not_torchs_dropout() -> None:
    """With the mask, the training logits are the reference's; without one (the contract's None), no unit is
    dropped; torch's own nn.Dropout in train() mode draws another mask, which no other framework can repeat."""
    config, weights, images, mask = _setup(6)
    model = rosetta_torch.build(config, weights)
    assert max_abs_diff(rosetta_torch.forward_train(model, images, mask),
                        forward_train(config, weights, images, mask)[0]) <= FORWARD_ABS
    assert not model.training  # back in eval mode: the dropout layer is the identity again
    no_dropout = forward_train(config, weights, images, None)[0]
    assert max_abs_diff(rosetta_torch.forward_train(model, images, None), no_dropout) <= FORWARD_ABS
    model.train()
    torch.manual_seed(1)  # a fixed draw of torch's generator (this one drops units), whatever ran before
    with torch.no_grad():
        own = model(torch.from_numpy(images).to(torch_models.model_device(model))).cpu().numpy()  # nn.Dropout's
    model.eval()
    assert max_abs_diff(own, no_dropout) > PLANTED_FACTOR * FORWARD_ABS


@pytest.mark.parametrize(("arch", "shape", "allowed"), [("resnet", (4, 5), "(batch, features)"),
                                                         ("lstm", (4, 6), "allowed: None")])
def test_a_mask_that_does_not_fit_is_one_line(arch: str, shape: tuple[int, int], allowed: str) -> None:
    config = small_config(arch)
    model = rosetta_torch.build(config, asymmetric_weights(config, 0))
    images = np.zeros((4, *config.image_shape), np.float32)
    with pytest.raises(ValueError, match="dropout_mask") as raised:
        rosetta_torch.forward_train(model, images, np.ones(shape, np.float32))
    assert "\n" not in str(raised.value) and str(shape) in str(raised.value) and allowed in str(raised.value)
