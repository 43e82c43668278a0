"""The float64 reference of the layers that differ between frameworks: "same" padding, BatchNorm in both
modes, the recurrent cells, the shared dropout masks, and the inference-mode detector built on them."""

import numpy as np
import pytest

from rosetta_common.metrics import inference_mode_problems
from rosetta_common.reference import conv2d, forward, forward_train, gru_last_hidden, lstm_last_hidden, same_padding
from rosetta_common.spec import ModelConfig, parse_spec
from rosetta_common.training import dropout_masks, plan
from rosetta_common.weights import canonical_shapes, init_weights, is_statistic, random_weights, trainable_names

SPEC = parse_spec({"architecture": {"resnet": {"stem_filters": 3, "block_filters": 5, "dropout": 0.25},
                                    "lstm": {"hidden": 6}, "gru": {"hidden": 7}}})


def config(arch: str, shape: tuple[int, int] = (8, 8)) -> ModelConfig:
    return ModelConfig.of(SPEC, arch, shape, 10)


@pytest.mark.parametrize(("size", "kernel", "stride", "expected"),
                         [(8, 3, 2, (0, 1)), (28, 3, 2, (0, 1)), (7, 3, 2, (1, 1)), (8, 3, 1, (1, 1)),
                          (8, 1, 2, (0, 0))])
def test_same_padding_is_tensorflows(size, kernel, stride, expected):
    assert same_padding(size, kernel, stride) == expected


def test_stride_2_same_conv_pads_bottom_right_not_both_sides():
    x = np.arange(64, dtype=np.float64).reshape(1, 8, 8, 1)
    k = np.zeros((3, 3, 1, 1))
    k[0, 0, 0, 0] = 1.0  # picks the window's top-left pixel
    same, symmetric = conv2d(x, k, 2, "same")[0, :, :, 0], conv2d(x, k, 2, "symmetric")[0, :, :, 0]
    np.testing.assert_array_equal(same, x[0, ::2, ::2, 0])  # no padding before: window 0 starts at pixel 0
    assert symmetric[0, 0] == 0.0 and symmetric[1, 1] == x[0, 1, 1, 0]  # torch's padding=1: shifted by one


def test_batchnorm_training_forward_uses_batch_statistics_and_moves_running_ones():
    c = config("resnet")
    w = {k: v.astype(np.float64) for k, v in random_weights(canonical_shapes(c), 3).items()}
    images = np.random.default_rng(0).random((6, 8, 8))
    logits, stats = forward_train(c, w, images)
    assert sorted(stats) == sorted(n for n in w if is_statistic(n))
    m = c.settings.batchnorm_momentum
    x = images[..., None]
    stem = conv2d(x, w["stem.conv.kernel"].astype(np.float64))
    mean, var = stem.mean((0, 1, 2)), stem.var((0, 1, 2))  # numpy's var is the biased one
    np.testing.assert_allclose(stats["stem.bn.running_mean"], m * w["stem.bn.running_mean"] + (1 - m) * mean,
                               rtol=1e-12)
    np.testing.assert_allclose(stats["stem.bn.running_var"], m * w["stem.bn.running_var"] + (1 - m) * var, rtol=1e-12)
    # batch statistics: an image's training-mode logits depend on its batch; inference logits do not
    alone, _ = forward_train(c, w, images[:3])
    assert np.abs(alone - logits[:3]).max() > 1e-3
    np.testing.assert_allclose(forward(c, w, images[:3]), forward(c, w, images)[:3], rtol=0, atol=1e-12)


def test_lstm_and_gru_cells_follow_the_documented_equations_for_one_step():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 1, 8))
    lw = random_weights(canonical_shapes(config("lstm")), 4)
    i, _, g, o = np.split(x[:, 0] @ lw["lstm.kernel"] + lw["lstm.bias"], 4, axis=-1)  # h0 = c0 = 0
    sig = lambda t: 1 / (1 + np.exp(-t))  # noqa: E731
    np.testing.assert_allclose(lstm_last_hidden(x, lw), sig(o) * np.tanh(sig(i) * np.tanh(g)), rtol=1e-6)
    gw = random_weights(canonical_shapes(config("gru")), 5)
    xr, xz, xn = np.split(x[:, 0] @ gw["gru.kernel"] + gw["gru.input_bias"], 3, axis=-1)
    hr, hz, hn = np.split(np.broadcast_to(gw["gru.recurrent_bias"], (2, 21)), 3, axis=-1)  # h0 = 0: only biases
    n = np.tanh(xn + sig(xr + hr) * hn)  # torch's formula: the reset gate multiplies the recurrent bias too
    np.testing.assert_allclose(gru_last_hidden(x, gw), (1 - sig(xz + hz)) * n, rtol=1e-6)


def test_new_models_initialise_statistics_and_exclude_them_from_training():
    c = config("resnet")
    w = init_weights(c, 0)
    assert all(np.all(w[n] == (1.0 if n.endswith("var") else 0.0)) for n in w if is_statistic(n))
    assert not any(is_statistic(n) for n in trainable_names(c))
    assert len(trainable_names(c)) == len(w) - 8  # 4 BatchNorms x (mean, var)
    assert list(canonical_shapes(config("gru"))) == ["gru.kernel", "gru.recurrent_kernel", "gru.input_bias",
                                                      "gru.recurrent_bias", "head.kernel", "head.bias"]


def test_dropout_masks_are_seeded_scaled_and_per_step():
    c = config("resnet")
    p = plan(SPEC, "resnet", 320)
    masks = dropout_masks(p, c)
    assert masks.shape == (p.num_steps, p.batch_size, 5) and masks.dtype == np.float32
    assert set(np.unique(masks)) == {0.0, np.float32(1 / 0.75)}
    assert abs(float((masks == 0).mean()) - 0.25) < 0.03
    np.testing.assert_array_equal(masks, dropout_masks(p, c))
    other = dropout_masks(plan(SPEC.model_copy(update={"seed": 1}), "resnet", 320), c)
    assert not np.array_equal(masks, other)
    assert not np.array_equal(masks[0], masks[1])
    assert dropout_masks(p.__class__(**{**p.__dict__, "arch": "lstm"}), config("lstm")) is None
    # A replicate's batches hold their rows in another order: each sample keeps its mask.
    r = p.replicate(3)
    moved = dropout_masks(r, c)
    for s, (idx, idx_r) in enumerate(zip(p.all_batches(), r.all_batches(), strict=True)):
        where = {int(sample): j for j, sample in enumerate(idx)}
        np.testing.assert_array_equal(moved[s], masks[s][[where[int(sample)] for sample in idx_r]])
    assert not np.array_equal(moved, masks)


def test_inference_mode_detector_catches_dropout_and_batch_statistics():
    c = config("resnet")
    w = random_weights(canonical_shapes(c), 6)
    images = np.random.default_rng(2).random((8, 8, 8))
    rng = np.random.default_rng(3)

    def with_dropout(x):
        mask = (rng.random((len(x), 5)) >= 0.25) / 0.75
        return forward_train(c, w, x, mask)[0]

    def batch_statistics(x):
        return forward_train(c, w, x)[0]

    assert inference_mode_problems(lambda x: forward(c, w, x), images, 1e-6) == []
    assert any("dropout" in p for p in inference_mode_problems(with_dropout, images, 1e-6))
    assert any("batch statistics" in p for p in inference_mode_problems(batch_statistics, images, 1e-6))
