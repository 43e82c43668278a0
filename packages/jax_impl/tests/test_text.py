"""Flax specifics of the text model (text_transformer): nnx.MultiHeadAttention's mask polarity and shape (True =
attend, keys only), nnx.Embed without a padding row, the per-head kernel layout, the int64 ids JAX holds as
int32, and the exports' symbolic length and int64 ONNX input. The conformance suite compares the model with the
reference; these tests plant what only Flax gets wrong."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import rosetta_jax
from rosetta_common.data import Dataset
from rosetta_common.errors import InputError
from rosetta_common.inputs import PAD_ID
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward, forward_with_taps
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.testing import (
    MAX_LENGTH,
    VOCAB_SIZE,
    assert_localized,
    asymmetric_weights,
    learnable_data,
    random_inputs,
    small_config,
    small_spec,
)
from rosetta_common.training import plan
from rosetta_common.weights import is_frozen
from rosetta_jax import models, weights
from rosetta_jax.export import EXPORT_FILE

ARCH = "text_transformer"
TOLERANCES = Spec().tolerances
FORWARD_ABS = TOLERANCES.forward_parity_abs
NATIVE_ABS = TOLERANCES.native_roundtrip_abs
FAR = 100  # a planted mistake must miss the reference by this many tolerances


@pytest.fixture(scope="module")
def case() -> tuple[object, dict[str, np.ndarray], np.ndarray]:
    config = small_config(ARCH)
    w = asymmetric_weights(config, 11)
    tokens = random_inputs(config, 6, 12)
    tokens[0] = np.arange(1, config.max_length + 1)  # one row with no padding at all, one with a single token
    tokens[1, 1:] = PAD_ID
    return config, w, tokens


def _logits_error(config: object, w: dict[str, np.ndarray], tokens: np.ndarray) -> float:
    return max_abs_diff(rosetta_jax.predict(rosetta_jax.build(config, w), tokens), forward(config, w, tokens))


def test_the_model_is_flaxs_own_layers_and_holds_parameters_only(case: tuple) -> None:
    config, w, _ = case
    model = rosetta_jax.build(config, w)
    assert isinstance(model.embed, nnx.Embed) and isinstance(model.block.attn, nnx.MultiHeadAttention)
    # no dropout RNG stream, no decoding cache: the graphdef and the parameters are the whole model
    assert {type(v) for _, v in nnx.to_flat_state(nnx.state(model))} == {nnx.Param}
    assert model.block.attn.dropout_rate == 0.0 and model.block.attn.decode is False


def test_per_head_kernels_are_the_canonical_columns(case: tuple) -> None:
    """Head h of Flax's (embed, heads, head_dim) kernels is columns h*head_dim:(h+1)*head_dim of the canonical
    (embed, embed) one; the out kernel (heads, head_dim, embed) is the canonical one's rows."""
    config, w, _ = case
    model = rosetta_jax.build(config, w)
    attn, heads, hd = model.block.attn, config.settings.num_heads, config.settings.head_dim
    for h in range(heads):
        columns = slice(h * hd, (h + 1) * hd)
        for p in ("query", "key", "value"):
            kernel = w[f"block.attn.{p}.kernel"]
            np.testing.assert_array_equal(getattr(attn, p).kernel[...][:, h, :], kernel[:, columns])
            np.testing.assert_array_equal(getattr(attn, p).bias[...][h], w[f"block.attn.{p}.bias"][columns])
        np.testing.assert_array_equal(attn.out.kernel[...][h], w["block.attn.out.kernel"][columns])
    assert attn.out.bias[...].shape == (config.settings.embed_dim,)
    back = rosetta_jax.to_canonical(model)
    assert list(back) == list(w) and all(np.array_equal(back[k], w[k]) for k in w)


def test_heads_split_the_other_way_are_caught(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """(embed, head_dim, heads), Flax's shape read as if the heads were the inner axis: a plausible reshape
    that fits no other layout and misses the reference by far (the shapes pass as long as heads == head_dim)."""
    config, w, tokens = case
    assert _logits_error(config, w, tokens) <= FORWARD_ABS
    original = weights.to_native

    def heads_inner(config: object, canonical: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        native = original(config, canonical)
        for p in ("query", "key", "value"):
            name = f"block.attn.{p}.kernel"
            e, heads, hd = native[name].shape
            native[name] = canonical[name].reshape(e, hd, heads).transpose(0, 2, 1)
        return native

    monkeypatch.setattr(weights, "to_native", heads_inner)
    assert _logits_error(config, w, tokens) > FAR * FORWARD_ABS


def test_the_mask_inverted_is_caught(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's polarity (True = ignore) given to Flax's mask (True = attend)."""
    config, w, tokens = case
    assert _logits_error(config, w, tokens) <= FORWARD_ABS
    monkeypatch.setattr(models, "attention_mask", lambda real: ~real[:, None, None, :])
    assert _logits_error(config, w, tokens) > FAR * FORWARD_ABS


def test_padding_pooled_is_caught(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    config, w, tokens = case
    monkeypatch.setattr(models, "masked_mean", lambda x, real: x.mean(axis=1))
    assert _logits_error(config, w, tokens) > FAR * FORWARD_ABS


def test_masking_queries_too_is_caught_by_the_taps(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """nnx.make_attention_mask(real, real), Flax's usual padding mask, masks the padded QUERY rows in full: their
    softmax has no key left (uniform here, NaN in torch) where the spec computes every query. Nothing real reads
    those rows, so the logits still agree; the attention weights tap is where it shows."""
    config, w, tokens = case
    monkeypatch.setattr(models, "attention_mask", lambda real: nnx.make_attention_mask(real, real, dtype=bool))
    assert _logits_error(config, w, tokens) <= FORWARD_ABS
    taps = rosetta_jax.forward_with_taps(rosetta_jax.build(config, w), tokens)
    assert_localized(taps, forward_with_taps(config, w, tokens), "block.attn.weights", FORWARD_ABS)


def test_padded_keys_get_exactly_zero_weight_and_every_query_is_computed(case: tuple) -> None:
    config, w, tokens = case
    attention = rosetta_jax.forward_with_taps(rosetta_jax.build(config, w), tokens)["block.attn.weights"]
    padded = tokens == PAD_ID
    assert padded.any()
    assert np.all(attention[np.broadcast_to(padded[:, None, None, :], attention.shape)] == 0.0)
    np.testing.assert_allclose(attention.sum(axis=-1), 1.0, atol=1e-6)  # padded query rows too: never all masked
    assert np.isfinite(attention).all()


def test_padding_changes_nothing(case: tuple) -> None:
    """Key-only masking and the masked mean make padding inert: more padding columns, or another pad row in the
    embedding (nnx.Embed has no padding_idx: row 0 is loaded like any row), give the real rows the same logits."""
    config, w, tokens = case
    model = rosetta_jax.build(config, w)
    short = tokens[:, :8].copy()
    short[(short != PAD_ID).sum(axis=1) == 0, 0] = 1  # keep every row valid after the cut
    logits = rosetta_jax.predict(model, short)
    longer = np.concatenate([short, np.full((len(short), 4), PAD_ID, np.int64)], axis=1)
    assert max_abs_diff(rosetta_jax.predict(model, longer), logits) <= FORWARD_ABS
    other_pad = {**w, "embed.embedding": w["embed.embedding"].copy()}
    other_pad["embed.embedding"][PAD_ID] = 3.0
    np.testing.assert_array_equal(rosetta_jax.predict(rosetta_jax.build(config, other_pad), short), logits)


@pytest.mark.parametrize(("bad", "message"), [
    (lambda t: t.astype(np.int32), "dtype int32"),
    (lambda t: t.astype(np.float32), "dtype float32"),
    (lambda t: np.where(t == t.max(), 50, t), "token id 50"),
    (lambda t: np.concatenate([t, t[:, :1]], axis=1), "sequence length 13"),
    (lambda t: np.zeros_like(t), "all padding"),
], ids=["int32", "float", "out_of_vocabulary", "too_long", "all_padding"])
def test_bad_token_input_is_one_input_error_line_everywhere(case: tuple, bad: object, message: str) -> None:
    config, w, tokens = case
    model = rosetta_jax.build(config, w)
    for call in (rosetta_jax.predict, rosetta_jax.forward_with_taps,
                 lambda m, t: rosetta_jax.forward_train(m, t, None)):
        with pytest.raises(InputError) as raised:
            call(model, bad(tokens))
        assert "\n" not in str(raised.value) and message in str(raised.value), str(raised.value)


def test_predict_compiles_once_per_batch_and_length(case: tuple) -> None:
    """The config is static graph data: a model of the same config with other weights reuses the compilation, a
    new length compiles once. A config of its own (3 classes) so that no other test has compiled its shapes."""
    _, _, tokens = case
    config = ModelConfig.of_tokens(small_spec(), ARCH, VOCAB_SIZE, MAX_LENGTH, 3)
    model = rosetta_jax.build(config, asymmetric_weights(config, 1))
    before = models._forward._cache_size()
    rosetta_jax.predict(model, tokens[:, :5])
    assert models._forward._cache_size() == before + 1
    rosetta_jax.predict(rosetta_jax.build(config, asymmetric_weights(config, 2)), tokens[:, :5])
    assert models._forward._cache_size() == before + 1
    rosetta_jax.predict(model, tokens[:, :6])
    assert models._forward._cache_size() == before + 2


def test_taps_leave_the_model_as_it_was(case: tuple) -> None:
    """nnx.capture's sown attention weights go with the call: same graphdef, same predictions after."""
    config, w, tokens = case
    model = rosetta_jax.build(config, w)
    graphdef, before = nnx.graphdef(model), rosetta_jax.predict(model, tokens)
    taps = rosetta_jax.forward_with_taps(model, tokens)
    assert nnx.graphdef(model) == graphdef
    np.testing.assert_array_equal(rosetta_jax.predict(model, tokens), before)
    assert max_abs_diff(taps["logits"], before) <= FORWARD_ABS


def test_training_reads_int64_token_data() -> None:
    """train() on a token Dataset (int64 ids, as data.py prepares them) learns, leaving the frozen key bias as it
    was; int32 ids are refused before any step, as predict refuses them."""
    config = small_config(ARCH)
    data = learnable_data(tokens=True)
    start = asymmetric_weights(config, 3)
    model = rosetta_jax.build(config, start)
    result = rosetta_jax.train(model, plan(small_spec(), ARCH, len(data.train_labels)), data)
    assert np.isfinite(result.step_losses).all() and result.epoch_losses[-1] < result.epoch_losses[0]
    after = rosetta_jax.to_canonical(model)
    # the key bias (rosetta_common.weights.FROZEN) exactly as loaded: optax.set_to_zero's updates, not Adam's
    # normalized rounding noise of its zero gradient; every other parameter moved
    for name in after:
        assert np.array_equal(after[name], start[name]) == is_frozen(name), name
    wrong = Dataset(data.train_inputs.astype(np.int32), data.train_labels, data.test_inputs, data.test_labels)
    with pytest.raises(InputError, match="train inputs: dtype int32"):
        rosetta_jax.train(model, plan(small_spec(), ARCH, len(data.train_labels)), wrong)


@pytest.fixture(scope="module")
def exported(case: tuple, tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    config, w, tokens = case
    model = rosetta_jax.build(config, w)
    out = tmp_path_factory.mktemp("text")
    rosetta_jax.export_native(model, out / "native", tokens)
    rosetta_jax.export_onnx(model, out / "model.onnx", tokens)
    return model, out


def test_jax_export_has_a_symbolic_batch_and_length(case: tuple, exported: tuple[object, Path]) -> None:
    config, w, _ = case
    model, out = exported
    module = jax.export.deserialize(bytearray((out / "native" / EXPORT_FILE).read_bytes()))
    (aval,) = module.in_avals
    assert aval.dtype == np.int32 and not any(isinstance(d, int) for d in aval.shape)  # JAX's int, x64 off
    loaded = rosetta_jax.load_native(out / "native")
    for batch, length in ((1, 1), (3, 7), (64, config.max_length)):
        tokens = random_inputs(config, batch, batch + length, length)
        expected = rosetta_jax.predict(model, tokens)
        for name, predict in loaded.items():
            assert max_abs_diff(predict(tokens), expected) <= NATIVE_ABS, name
        assert max_abs_diff(expected, forward(config, w, tokens)) <= FORWARD_ABS
    with pytest.raises(InputError):
        loaded["jax_export"](random_inputs(config, 2, 0).astype(np.int32))


def test_onnx_takes_int64_tokens_of_any_batch_and_length(case: tuple, exported: tuple[object, Path]) -> None:
    import onnx
    import onnxruntime as ort

    config, w, _ = case
    model, out = exported
    proto = onnx.load(str(out / "model.onnx"))
    (tokens_info,) = proto.graph.input
    assert tokens_info.name == "tokens" and tokens_info.type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert [d.dim_param for d in tokens_info.type.tensor_type.shape.dim] == ["batch", "length"]
    assert proto.graph.node[0].op_type == "Cast"  # jax2onnx's int32 graph behind one int64 -> int32 Cast
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in ((1, 1), (5, 4), (64, config.max_length)):
        tokens = random_inputs(config, batch, 7 * batch + length, length)
        got = session.run(None, {"tokens": tokens})[0]
        assert max_abs_diff(got, forward(config, w, tokens)) <= FORWARD_ABS
        assert max_abs_diff(got, rosetta_jax.predict(model, tokens)) <= TOLERANCES.onnx_vs_native_abs
