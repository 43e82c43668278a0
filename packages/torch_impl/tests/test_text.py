"""torch's side of the text Transformer: the conventions torch's built-in layers do not share with the spec (and the
other frameworks), each pinned, and each planted wrong to show that the reference comparison catches it:
nn.MultiheadAttention's key_padding_mask (True = IGNORE, where Keras, Flax and F.scaled_dot_product_attention mean
attend), nn.Embedding's padding_idx row (never a gradient), the masked mean pool, the fused in_proj's q, k, v
blocks; the attention fast path left out of predict (model.pt2's ops, bit for bit); int64 token input with a
dynamic batch and length in every export; one-line InputErrors wherever the model is called."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rosetta_torch
from rosetta_common.errors import InputError
from rosetta_common.inputs import PAD_ID, random_tokens
from rosetta_common.metrics import max_abs_diff
from rosetta_common.onnx_conventions import BATCH_DIM, LENGTH_DIM, OUTPUT_NAME, TOKENS_NAME, violations
from rosetta_common.reference import forward, forward_with_taps, text_transformer
from rosetta_common.spec import Spec
from rosetta_common.testing import (
    MAX_LENGTH,
    VOCAB_SIZE,
    assert_localized,
    asymmetric_weights,
    learnable_data,
    planted_case,
    small_config,
    small_spec,
)
from rosetta_common.training import plan
from rosetta_torch import models as torch_models
from rosetta_torch import weights as torch_weights
from rosetta_torch.export import PROGRAM_FILE, STATE_FILE
from rosetta_torch.weights import IN_PROJ, torch_name

ARCH = "text_transformer"
TOLERANCES = Spec().tolerances
FORWARD_ABS = TOLERANCES.forward_parity_abs
PLANTED_FACTOR = 100  # a planted mistake must miss the reference by this many tolerances at least
LENGTHS = (1, 2, 5, MAX_LENGTH)


def padded_tokens(seed: int, batch: int = 6, length: int = MAX_LENGTH) -> np.ndarray:
    """Random ids with at least one token and at least one padded position in every row (the last one), so that an
    inverted mask still leaves every row a key to attend (no NaN to hide the difference)."""
    ids = random_tokens(np.random.default_rng(seed), batch, length - 1, VOCAB_SIZE)
    return np.concatenate([ids, np.full((batch, 1), PAD_ID, np.int64)], axis=1)


def _setup(seed: int) -> tuple[torch.nn.Module, dict[str, np.ndarray], np.ndarray]:
    config = small_config(ARCH)
    weights = asymmetric_weights(config, seed)
    return rosetta_torch.build(config, weights), weights, padded_tokens(seed)


def _logits_error(model: torch.nn.Module, weights: dict[str, np.ndarray], tokens: np.ndarray) -> float:
    return max_abs_diff(rosetta_torch.predict(model, tokens), forward(model.config, weights, tokens))


# --- the layers: torch's own, as the design names them ------------------------------------------------------------

def test_the_model_is_built_from_torchs_own_layers() -> None:
    model, _, _ = _setup(0)
    assert isinstance(model.embed, nn.Embedding) and model.embed.padding_idx == PAD_ID == 0
    attn = model.block.attn
    assert isinstance(attn, nn.MultiheadAttention) and attn.batch_first and attn.num_heads == 4
    assert attn.in_proj_bias is not None and attn.out_proj.bias is not None and attn.dropout == 0.0
    assert not any(isinstance(m, nn.TransformerEncoderLayer) for m in model.modules())
    assert model.block.norm1.eps == small_config(ARCH).settings.layer_norm_eps


# --- key_padding_mask: True means ignore ---------------------------------------------------------------------------

def test_key_padding_mask_is_true_at_padding() -> None:
    """What reaches nn.MultiheadAttention: True exactly where the id is PAD_ID (torch's "ignore")."""
    model, _, tokens = _setup(1)
    seen = {}

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen["mask"] = kwargs["key_padding_mask"].cpu().numpy()

    handle = model.block.attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        rosetta_torch.predict(model, tokens)
    finally:
        handle.remove()
    assert seen["mask"].dtype == np.bool_
    np.testing.assert_array_equal(seen["mask"], tokens == PAD_ID)


def test_an_uninverted_mask_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The "attend" mask passed as key_padding_mask as it is (Keras' / Flax's polarity read as torch's): every query
    attends the padding alone. Far beyond the tolerance, which the right model meets."""
    model, weights, tokens = _setup(2)
    assert _logits_error(model, weights, tokens) <= FORWARD_ABS
    monkeypatch.setattr(torch_models, "attention_mask", lambda mask: mask)
    wrong = rosetta_torch.predict(model, tokens)
    assert np.isfinite(wrong).all()
    assert max_abs_diff(wrong, forward(model.config, weights, tokens)) > PLANTED_FACTOR * FORWARD_ABS
    # ... and it is the reference with its key mask inverted
    planted = text_transformer(model.config, {k: v.astype(np.float64) for k, v in weights.items()}, tokens,
                               key_mask=tokens == PAD_ID, pool_mask=tokens != PAD_ID)["logits"]
    assert max_abs_diff(wrong, planted) <= FORWARD_ABS


def test_an_uninverted_mask_enters_at_the_attention_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    model, weights, tokens = _setup(3)
    monkeypatch.setattr(torch_models, "attention_mask", lambda mask: mask)
    assert_localized(rosetta_torch.forward_with_taps(model, tokens),
                     forward_with_taps(model.config, weights, tokens), "block.attn.weights", FORWARD_ABS)


def test_padded_keys_get_exactly_zero_weight() -> None:
    model, _, tokens = _setup(4)
    weights = rosetta_torch.forward_with_taps(model, tokens)["block.attn.weights"]  # (B, heads, query, key)
    padded = np.broadcast_to((tokens == PAD_ID)[:, None, None, :], weights.shape)
    assert np.all(weights[padded] == 0.0)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-6)


def test_padding_changes_nothing() -> None:
    """More padding at the end of every row (a longer batch) leaves the logits as they were: padded positions are
    no key and are not pooled."""
    model, _, tokens = _setup(5)
    short = tokens[:, :-1]  # every row had one padded position at the end
    np.testing.assert_allclose(rosetta_torch.predict(model, short), rosetta_torch.predict(model, tokens), atol=1e-6)


# --- the pool: the mean over real tokens ---------------------------------------------------------------------------

def test_pooling_padded_positions_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    model, weights, tokens = _setup(6)
    monkeypatch.setattr(torch_models, "masked_mean", lambda x, mask: x.mean(dim=1))
    assert _logits_error(model, weights, tokens) > PLANTED_FACTOR * FORWARD_ABS
    assert_localized(rosetta_torch.forward_with_taps(model, tokens),
                     forward_with_taps(model.config, weights, tokens), "pool", FORWARD_ABS)


# --- nn.Embedding's padding_idx -----------------------------------------------------------------------------------

def test_the_pad_row_is_loaded_as_given() -> None:
    """padding_idx zeroes row 0 only when torch initializes it: canonical weights with another row 0 keep it, both
    ways (the canonical init has it zero; asymmetric weights do not)."""
    model, weights, _ = _setup(7)
    assert np.any(weights["embed.embedding"][PAD_ID] != 0)
    np.testing.assert_array_equal(model.embed.weight[PAD_ID].detach().cpu().numpy(), weights["embed.embedding"][0])
    np.testing.assert_array_equal(rosetta_torch.to_canonical(model)["embed.embedding"], weights["embed.embedding"])


def _row_gradients(model: torch.nn.Module, tokens: np.ndarray) -> np.ndarray:
    model.zero_grad(set_to_none=True)
    model.train()
    try:
        x = torch.as_tensor(tokens, device=torch_models.model_device(model))
        F.cross_entropy(model(x), torch.zeros(len(tokens), dtype=torch.long, device=x.device)).backward()
    finally:
        model.eval()
    return model.embed.weight.grad.cpu().numpy()


def test_the_pad_row_gets_no_gradient_even_where_padding_reaches_the_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """With padding pooled (planted), the pad row's embedding reaches the loss; nn.Embedding's padding_idx still
    gives its row no gradient, where an Embedding without one gives it one. Real tokens' rows get theirs."""
    model, _, tokens = _setup(8)
    monkeypatch.setattr(torch_models, "masked_mean", lambda x, mask: x.mean(dim=1))
    grad = _row_gradients(model, tokens)
    assert not grad[PAD_ID].any()
    assert all(grad[i].any() for i in np.unique(tokens[tokens != PAD_ID]))
    model.embed.padding_idx = None  # torch's Embedding without padding_idx: the pad row is an ordinary row
    assert _row_gradients(model, tokens)[PAD_ID].any()


def test_training_leaves_the_pad_row_as_it_was() -> None:
    """Adam on a row whose gradient is always zero: the row stays bit for bit what the canonical weights loaded."""
    config = small_config(ARCH)
    data = learnable_data(n_train=32, tokens=True)
    start = asymmetric_weights(config, 9)
    model = rosetta_torch.build(config, start)
    rosetta_torch.train(model, plan(small_spec(epochs=2, batch_size=16), ARCH, 32), data)
    after = rosetta_torch.to_canonical(model)["embed.embedding"]
    np.testing.assert_array_equal(after[PAD_ID], start["embed.embedding"][PAD_ID])
    assert not np.array_equal(after[1:], start["embed.embedding"][1:])


# --- the weights: nn.MultiheadAttention's fused in_proj ----------------------------------------------------------

def test_in_proj_holds_q_k_v_transposed_in_that_order() -> None:
    model, weights, _ = _setup(10)
    e = small_config(ARCH).settings.embed_dim
    attn = model.block.attn
    in_proj = attn.in_proj_weight.detach().cpu().numpy()
    bias = attn.in_proj_bias.detach().cpu().numpy()
    for j, p in enumerate(("query", "key", "value")):
        assert in_proj[j * e + 3, 5] == weights[f"block.attn.{p}.kernel"][5, 3]  # one element by hand
        np.testing.assert_array_equal(in_proj[j * e:(j + 1) * e], weights[f"block.attn.{p}.kernel"].T)
        np.testing.assert_array_equal(bias[j * e:(j + 1) * e], weights[f"block.attn.{p}.bias"])
    np.testing.assert_array_equal(attn.out_proj.weight.detach().cpu().numpy(), weights["block.attn.out.kernel"].T)
    assert torch_name("block.attn.key.kernel", ARCH) == IN_PROJ["kernel"] == "block.attn.in_proj_weight"
    assert torch_name("block.attn.out.bias", ARCH) == "block.attn.out_proj.bias"
    assert torch_name("embed.embedding", ARCH) == "embed.weight"
    assert torch_name("block.attn.key.kernel") == "block.attn.key.weight"  # the image attention model: its own


def test_a_wrong_in_proj_order_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Query and key blocks exchanged: canonical round trips stay exact (both ways planted), the forward does not."""
    model, weights, tokens = _setup(11)
    monkeypatch.setattr(torch_weights, "IN_PROJ_ORDER", ("key", "query", "value"))
    planted = rosetta_torch.build(model.config, weights)
    back = rosetta_torch.to_canonical(planted)
    assert all(np.array_equal(back[k], v) for k, v in weights.items())
    assert _logits_error(planted, weights, tokens) > PLANTED_FACTOR * FORWARD_ABS


# --- predict, the fast path and the exports -------------------------------------------------------------------------

def test_predict_matches_the_reference_at_every_length() -> None:
    config = small_config(ARCH)
    weights = asymmetric_weights(config, 12)
    model = rosetta_torch.build(config, weights)
    for length in LENGTHS:
        for batch in (1, 5):
            tokens = random_tokens(np.random.default_rng(length * 10 + batch), batch, length, VOCAB_SIZE)
            assert max_abs_diff(rosetta_torch.predict(model, tokens), forward(config, weights, tokens)) <= FORWARD_ABS


def test_predict_leaves_the_attention_fast_path_setting_alone() -> None:
    model, _, tokens = _setup(13)
    assert torch.backends.mha.get_fastpath_enabled()
    rosetta_torch.predict(model, tokens)
    assert torch.backends.mha.get_fastpath_enabled()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, dict[str, np.ndarray], Path]:
    """Exported from a single one-token example: torch.export specialises size-1 dimensions, and neither the
    batch nor the length may be."""
    config = small_config(ARCH)
    weights = asymmetric_weights(config, 14)
    model = rosetta_torch.build(config, weights)
    out = tmp_path_factory.mktemp("text")
    example = np.array([[7]], np.int64)
    rosetta_torch.export_native(model, out / "native", example)
    rosetta_torch.export_onnx(model, out / "model.onnx", example)
    return model, weights, out


def test_onnx_takes_int64_tokens_with_a_dynamic_batch_and_length(exported: tuple) -> None:
    model, weights, out = exported
    proto = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    assert violations(proto, "torch") == []
    (tokens,) = proto.graph.input
    assert tokens.name == TOKENS_NAME and tokens.type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert [d.dim_param for d in tokens.type.tensor_type.shape.dim] == [BATCH_DIM, LENGTH_DIM]
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 7, 64):
        for length in LENGTHS:
            x = random_tokens(np.random.default_rng(batch + length), batch, length, VOCAB_SIZE)
            native = rosetta_torch.predict(model, x)
            (logits,) = session.run([OUTPUT_NAME], {TOKENS_NAME: x})
            bound = TOLERANCES.onnx_vs_native_abs + TOLERANCES.onnx_vs_native_rel * float(np.abs(native).max())
            assert max_abs_diff(logits, native) <= bound, (batch, length)
            assert max_abs_diff(logits, forward(model.config, weights, x)) <= FORWARD_ABS, (batch, length)


def test_the_program_takes_every_batch_and_length_and_is_predict_bit_for_bit(exported: tuple) -> None:
    """model.pt2 runs F.multi_head_attention_forward's ops, as predict does with the fast path off: the same bits."""
    model, _, out = exported
    reloaded = rosetta_torch.load_native(out / "native")
    for batch in (1, 2, 9):
        for length in LENGTHS:
            x = random_tokens(np.random.default_rng(batch * length), batch, length, VOCAB_SIZE)
            expected = rosetta_torch.predict(model, x)
            for name, run in reloaded.items():
                np.testing.assert_array_equal(run(x), expected, err_msg=f"{name} {batch} x {length}")


def test_the_program_specialised_no_dimension(exported: tuple) -> None:
    _, _, out = exported
    program = torch.export.load(str(out / "native" / PROGRAM_FILE))
    (tokens,) = [node for node in program.graph.nodes if node.op == "placeholder" and node.name == TOKENS_NAME]
    batch, length = tokens.meta["val"].shape
    assert isinstance(batch, torch.SymInt) and isinstance(length, torch.SymInt)
    assert tokens.meta["val"].dtype == torch.int64
    assert (out / "native" / STATE_FILE).is_file()


@pytest.mark.parametrize(("case", "tokens", "needle"), [
    ("float ids", np.ones((2, 4), np.float32), "dtype float32"),
    ("int32 ids", np.ones((2, 4), np.int32), "dtype int32"),
    ("out of vocabulary", np.full((2, 4), VOCAB_SIZE, np.int64), f"token id {VOCAB_SIZE}"),
    ("negative id", np.full((2, 4), -1, np.int64), "token id -1"),
    ("too long", np.ones((2, MAX_LENGTH + 1), np.int64), f"sequence length {MAX_LENGTH + 1}"),
    ("all padding", np.array([[3, 0], [0, 0]], np.int64), "row 1 is all padding"),
    ("one axis", np.ones(4, np.int64), "shape (4,)"),
])
def test_bad_tokens_are_one_line_wherever_the_model_is_called(exported: tuple, case: str, tokens: np.ndarray,
                                                               needle: str) -> None:
    model, _, out = exported
    calls = {"predict": lambda x: rosetta_torch.predict(model, x),
             "forward_train": lambda x: rosetta_torch.forward_train(model, x, None),
             "forward_with_taps": lambda x: rosetta_torch.forward_with_taps(model, x),
             **rosetta_torch.load_native(out / "native")}
    for name, call in calls.items():
        with pytest.raises(InputError) as raised:
            call(tokens)
        message = str(raised.value)
        assert needle in message and "\n" not in message, (case, name, message)


def test_training_refuses_bad_token_data() -> None:
    config = small_config(ARCH)
    data = learnable_data(n_train=32, tokens=True)
    data.train_inputs[3] = PAD_ID  # a row with no token: NaN in the pool and in torch's attention
    with pytest.raises(InputError, match="row 3 is all padding"):
        rosetta_torch.train(rosetta_torch.build(config, asymmetric_weights(config, 0)),
                            plan(small_spec(epochs=1), ARCH, 32), data)


def test_a_planted_tanh_gelu_enters_at_the_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text block reuses the image block's FeedForward: its exact GELU is the same function."""
    config, weights, tokens = planted_case(ARCH, 44)
    exact = torch_models.F.gelu
    monkeypatch.setattr(torch_models.F, "gelu", lambda x, approximate="none": exact(x, approximate="tanh"))
    taps = rosetta_torch.forward_with_taps(rosetta_torch.build(config, weights), tokens)
    assert_localized(taps, forward_with_taps(config, weights, tokens), "block.mlp.gelu", FORWARD_ABS)
