"""NNX specifics: the ModelConfig is static graph data, so predict() compiles once per config and batch size;
and every convention Flax's layers have a choice in (BatchNorm momentum and variance, the stride-2 padding, the
GRU cell's recurrent bias), planted wrongly, is caught against the float64 reference (the weight map's gate order
and bias sides: test_weights.py)."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

import rosetta_jax
from rosetta_common.metrics import max_abs_diff, relative_diff
from rosetta_common.reference import forward, forward_train
from rosetta_common.spec import Spec
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_jax import models
from rosetta_jax.models import _forward

SAME_ABS = 0.0  # one compiled function, different weights in: predict must equal a fresh model's bit for bit


def test_config_is_static_and_predict_reuses_the_compilation() -> None:
    config = small_config("attention", (6, 10))
    first = rosetta_jax.build(config, asymmetric_weights(config, 1))
    second = rosetta_jax.build(config, asymmetric_weights(config, 2))
    # The pydantic config lives in the graphdef (hashable, compared by value), never in the state.
    assert nnx.graphdef(first) == nnx.graphdef(second)
    assert hash(nnx.graphdef(first)) == hash(nnx.graphdef(second))
    assert {type(v) for _, v in nnx.to_flat_state(nnx.state(first))} == {nnx.Param}

    images = np.random.default_rng(3).random((4, 6, 10), dtype=np.float32)
    rosetta_jax.predict(first, images)
    compiled = _forward._cache_size()
    logits = rosetta_jax.predict(second, images)
    assert _forward._cache_size() == compiled  # same config and batch size: no retrace
    again = rosetta_jax.predict(rosetta_jax.build(config, asymmetric_weights(config, 2)), images)
    assert np.abs(logits - again).max() <= SAME_ABS


# The conventions Flax differs on, each planted wrongly in this package's own configuration or weight map: the
# float64 reference (rosetta_common.reference) must then disagree by far more than the tolerance it is checked
# with, and agree again with the package as it is.
NON_SQUARE = (6, 10)  # stride 2 pads one row and one column: a wrong side of the padding shows
FORWARD_ABS = Spec().tolerances.forward_parity_abs
STATISTICS_RTOL = 1e-5  # float32 running statistics against float64, as the conformance suite checks them
FAR = 100  # "by far": a planted mistake must miss by this many tolerances


def _logits_error(arch: str, seed: int = 7) -> float:
    """max |native - reference| of the inference forward of a freshly built model."""
    config = small_config(arch, NON_SQUARE)
    weights = asymmetric_weights(config, seed)
    images = np.random.default_rng(seed).random((5, *NON_SQUARE), dtype=np.float32)
    return max_abs_diff(rosetta_jax.predict(rosetta_jax.build(config, weights), images),
                        forward(config, weights, images))


def _statistics_error(seed: int = 7) -> float:
    """Largest relative error of the running statistics after one training-mode forward (a batch of 4, so
    that a variance convention shows), against the reference's update."""
    config = small_config("resnet", NON_SQUARE)
    weights = asymmetric_weights(config, seed)
    images = np.random.default_rng(seed).random((4, *NON_SQUARE), dtype=np.float32)
    model = rosetta_jax.build(config, weights)
    rosetta_jax.forward_train(model, images, None)
    after, (_, expected) = rosetta_jax.to_canonical(model), forward_train(config, weights, images, None)
    return max(float(np.max(relative_diff(after[name], expected[name]))) for name in expected)


def test_batchnorm_momentum_passed_with_torchs_meaning_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _statistics_error() <= STATISTICS_RTOL
    monkeypatch.setattr(models, "batchnorm_momentum", lambda momentum: 1.0 - momentum)
    assert _statistics_error() > FAR * STATISTICS_RTOL


def test_torchs_symmetric_padding_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _logits_error("resnet") <= FORWARD_ABS
    def torch_padding(in_channels: int, out_channels: int, kernel: int, stride: int, *, rngs: nnx.Rngs) -> nnx.Conv:
        pad = (kernel - 1) // 2  # torch's padding=1 for a 3x3 kernel, 0 for the 1x1 shortcut: both sides
        return nnx.Conv(in_channels, out_channels, kernel_size=(kernel, kernel), strides=stride,
                        padding=((pad, pad), (pad, pad)), use_bias=False, rngs=rngs)

    monkeypatch.setattr(models, "conv", torch_padding)
    assert _logits_error("resnet") > FAR * FORWARD_ABS
    # ... and it is exactly the mistake the reference's "symmetric" padding describes
    config = small_config("resnet", NON_SQUARE)
    weights = asymmetric_weights(config, 7)
    images = np.random.default_rng(7).random((5, *NON_SQUARE), dtype=np.float32)
    planted = rosetta_jax.predict(rosetta_jax.build(config, weights), images)
    assert max_abs_diff(planted, forward(config, weights, images, padding="symmetric")) <= FORWARD_ABS


def test_stock_flax_gru_cell_cannot_hold_the_recurrent_new_gate_bias() -> None:
    """Why models.GRUCell exists: nnx.GRUCell has no recurrent bias. The best it can do, folding b_hr and b_hz
    into the input bias (they are only ever added to it), still loses b_hn, which r multiplies: far off the
    reference. The subclass, the same __call__ with a biased dense_h, matches it."""
    config = small_config("gru", NON_SQUARE)
    w = asymmetric_weights(config, 7)
    images = np.random.default_rng(7).random((5, *NON_SQUARE), dtype=np.float32)
    hidden = config.settings.hidden
    stock = nnx.GRUCell(NON_SQUARE[1], hidden, rngs=nnx.Rngs(0))
    folded = w["gru.input_bias"] + np.concatenate([w["gru.recurrent_bias"][:2 * hidden], np.zeros(hidden, np.float32)])
    stock.dense_i.kernel[...], stock.dense_i.bias[...] = w["gru.kernel"], folded
    stock.dense_h.kernel[...] = w["gru.recurrent_kernel"]
    last, _ = nnx.RNN(stock, return_carry=True, rngs=False)(images, initial_carry=np.zeros((5, hidden), np.float32))
    logits = np.asarray(last) @ w["head.kernel"] + w["head.bias"]
    assert max_abs_diff(logits, forward(config, w, images)) > FAR * FORWARD_ABS
    assert _logits_error("gru") <= FORWARD_ABS


def test_a_dropout_mask_for_a_model_without_dropout_is_a_one_line_error() -> None:
    config = small_config("lstm")
    model = rosetta_jax.build(config, asymmetric_weights(config, 1))
    images = np.zeros((4, *config.image_shape), np.float32)
    with pytest.raises(ValueError) as raised:
        rosetta_jax.forward_train(model, images, np.ones((4, 6), np.float32))
    assert "\n" not in str(raised.value) and "dropout_mask" in str(raised.value)


# The closed-form LayerNorm gradient (models.layer_norm) against float64: a row of n = 64 features sums n products
# twice, so float32 rounding leaves about n * 2**-24 ~ 4e-6 of the largest gradient; 1e-5 of it is the bound, stated
# before the run. A backward missing one of its terms (the mean of g, or x_hat's) is off by O(1) of it.
LAYER_NORM_GRAD_REL = 1e-5


def _layer_norm_case() -> tuple[models.LayerNorm, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    norm = models.LayerNorm(64, epsilon=1e-5, rngs=nnx.Rngs(0))
    norm.scale[...] = rng.standard_normal(64).astype(np.float32)
    norm.bias[...] = rng.standard_normal(64).astype(np.float32)
    x = (rng.standard_normal((4, 7, 64)) * 3 + 1).astype(np.float32)
    return norm, x, rng.standard_normal((4, 7, 64)).astype(np.float32)


@pytest.mark.parametrize(("shape", "epsilon", "seed"), [((4, 7, 64), 1e-5, 0), ((3, 16), 1e-6, 1),
                                                       ((2, 5, 33), 1e-3, 2), ((1, 1, 8), 1e-5, 3)])
def test_layer_norm_forward_is_flax_layer_norm_bit_for_bit(shape: tuple[int, ...], epsilon: float, seed: int) -> None:
    """models.layer_norm's forward, written with public jax ops, against Flax's public nnx.LayerNorm with the
    spec's two-pass variance: the same bits called eagerly (op by op) and under jax.jit (where XLA fuses both alike;
    Flax's own eager and jitted results may differ from each other), on rows centred at 0, 3 and 100 (where a
    one-pass variance or another order of the ops would round otherwise)."""
    import jax

    rng = np.random.default_rng(seed)
    features = shape[-1]
    flax_norm = nnx.LayerNorm(features, epsilon=epsilon, use_fast_variance=False, rngs=nnx.Rngs(0))
    flax_norm.scale[...] = rng.standard_normal(features).astype(np.float32)
    flax_norm.bias[...] = rng.standard_normal(features).astype(np.float32)
    scale, bias = flax_norm.scale[...], flax_norm.bias[...]
    for offset in (0.0, 3.0, 100.0):
        x = (rng.standard_normal(shape) * 2 + offset).astype(np.float32)
        want_eager = np.asarray(flax_norm(x))
        want_jit = np.asarray(nnx.jit(lambda norm, inputs: norm(inputs))(flax_norm, x))
        assert np.array_equal(np.asarray(models.layer_norm(x, scale, bias, epsilon)), want_eager), offset
        jitted = jax.jit(models.layer_norm, static_argnums=3)
        assert np.array_equal(np.asarray(jitted(x, scale, bias, epsilon)), want_jit), offset

def test_layer_norm_trains_on_flax_forward_bits_with_the_float64_gradient() -> None:
    import jax

    norm, x, upstream = _layer_norm_case()
    trained = models.training_view(norm)  # what a training step runs
    assert type(trained) is models.LayerNorm and trained.closed_form_grad and not norm.closed_form_grad

    def grads(module: models.LayerNorm) -> tuple[np.ndarray, ...]:
        graphdef, params = nnx.split(module)

        def loss(p: nnx.State, inputs: jax.Array) -> tuple[jax.Array, jax.Array]:
            y = nnx.merge(graphdef, p)(inputs)
            return (y * upstream).sum(), y

        (_, y), (dp, dx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
        return tuple(np.asarray(a, np.float64) for a in (y, dx, dp["scale"][...], dp["bias"][...]))

    flax_y, *_ = grads(norm)
    y, dx, dscale, dbias = grads(trained)
    assert np.array_equal(y, flax_y), "the training forward must be Flax's nnx.LayerNorm, bit for bit"

    x64, g = x.astype(np.float64), upstream.astype(np.float64)
    scale = np.asarray(norm.scale[...], np.float64)
    centered = x64 - x64.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5)
    x_hat, gs = centered * rstd, g * scale
    want_dx = rstd * (gs - gs.mean(-1, keepdims=True) - x_hat * (gs * x_hat).mean(-1, keepdims=True))
    for name, got, want in (("x", dx, want_dx), ("scale", dscale, (g * x_hat).sum((0, 1))),
                            ("bias", dbias, g.sum((0, 1)))):
        assert max_abs_diff(got, want) <= LAYER_NORM_GRAD_REL * np.abs(want).max(), name
