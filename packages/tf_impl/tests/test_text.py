"""What only the Keras text model needs: each convention of models.TextTransformer and weights.py, planted
wrong, misses the float64 reference by far more than its tolerance and is localized by the taps where it enters
(the attention_mask polarity, the query side masked too, Keras' default LayerNormalization epsilon, padding in the
pool, the per-head kernel split); the embedding's pad row never trains although Keras has no padding row; one graph
serves every batch size and length, natively and in the SavedModel; bad token input is one InputError line
wherever the model is called. The forward, taps, exports and training against the reference are the conformance
suite's (rosetta_common.conformance)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers, ops

import rosetta_tf
from rosetta_common.errors import InputError
from rosetta_common.inputs import PAD_ID, padding_mask
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward, forward_with_taps
from rosetta_common.registry import TextTransformerSpec
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.testing import (
    assert_localized,
    asymmetric_weights,
    learnable_data,
    random_inputs,
    small_config,
    small_spec,
)
from rosetta_common.training import plan
from rosetta_common.weights import FROZEN, Weights
from rosetta_tf import models
from rosetta_tf import weights as tf_weights
from rosetta_tf.export import SAVED_MODEL_DIR

ARCH = "text_transformer"
FORWARD_ABS = Spec().tolerances.forward_parity_abs
TAP_ABS = FORWARD_ABS  # the conformance suite's bound for every tap
FAR = 100 * FORWARD_ABS  # what a planted mistake must miss the reference by (the suite's bar)
train_module = sys.modules["rosetta_tf.train"]  # the package re-exports train(), which shadows the module's name


def _case(seed: int, batch: int = 6, length: int | None = None) -> tuple[ModelConfig, Weights, np.ndarray]:
    """The small text model, asymmetric weights and a padded batch in which some row is padded and some is not."""
    config = small_config(ARCH)
    tokens = random_inputs(config, batch, seed, length)
    tokens[0] = np.arange(1, tokens.shape[1] + 1)  # a row without padding
    tokens[1, 1:] = PAD_ID  # a row of one token
    return config, asymmetric_weights(config, seed), tokens


def test_the_model_is_keras_own_layers() -> None:
    config, weights, _ = _case(0)
    model = rosetta_tf.build(config, weights)
    embed, attn = model.get_layer("embed"), model.get_layer("block_attn")
    assert type(embed) is layers.Embedding and not embed.mask_zero  # the mask is explicit, not Keras' implicit one
    assert type(attn) is layers.MultiHeadAttention and attn.use_bias
    assert (attn.num_heads, attn.key_dim) == (config.settings.num_heads, config.settings.head_dim)
    norms = [layer for layer in model.layers if isinstance(layer, layers.LayerNormalization)]
    assert [n.name for n in norms] == ["block_norm1", "block_norm2", "final_norm"]
    assert {n.epsilon for n in norms} == {config.settings.layer_norm_eps}
    assert model.inputs[0].dtype == "int64" and tuple(model.inputs[0].shape) == (None, None)


def test_the_mask_has_keras_polarity() -> None:
    """True = a real token = attend, for Keras' attention_mask; the key axis is the last one."""
    tokens = np.array([[5, 7, PAD_ID], [3, PAD_ID, PAD_ID]], np.int64)
    mask = np.asarray(models.padding_mask(tf.constant(tokens)))
    np.testing.assert_array_equal(mask, padding_mask(tokens))
    assert np.asarray(models.attention_mask(mask)).shape == (2, 1, 3)


def test_inverted_attention_mask_misses_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's polarity (key_padding_mask: True = ignore) handed to Keras' attention_mask (True = attend): each
    query attends only padding (a row without padding: every key masked, a uniform softmax). The attention weights
    are the first tap to differ, and the logits miss by far more than the tolerance."""
    config, weights, tokens = _case(1)
    expected = forward_with_taps(config, weights, tokens)
    right = rosetta_tf.predict(rosetta_tf.build(config, weights), tokens)
    assert max_abs_diff(right, expected["logits"]) <= FORWARD_ABS

    def inverted(mask: Any) -> Any:
        return ops.expand_dims(ops.logical_not(mask), 1)

    monkeypatch.setattr(models, "attention_mask", inverted)
    model = rosetta_tf.build(config, weights)
    assert max_abs_diff(rosetta_tf.predict(model, tokens), expected["logits"]) > FAR
    assert_localized(rosetta_tf.forward_with_taps(model, tokens), expected, "block.attn.weights", TAP_ABS)


def test_masking_the_queries_too_changes_the_padded_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """mask & mask^T, the (B, T, T) mask Keras builds from Embedding(mask_zero=True) (its query mask and value mask
    together): a padded query is left with no key at all. Keras itself then disagrees with itself: the fused
    dot_product_attention predict runs spreads such a row uniformly over every key (a large negative, not -inf),
    the Softmax layer of return_attention_scores zeroes it. The logits see neither (padded positions are never keys
    and never pooled); the taps at the padded positions do. The spec computes every position as a query."""
    config, weights, tokens = _case(2)
    expected = forward_with_taps(config, weights, tokens)

    def both_sides(mask: Any) -> Any:
        return ops.logical_and(ops.expand_dims(mask, 2), ops.expand_dims(mask, 1))

    monkeypatch.setattr(models, "attention_mask", both_sides)
    model = rosetta_tf.build(config, weights)
    planted = rosetta_tf.forward_with_taps(model, tokens)
    assert max_abs_diff(rosetta_tf.predict(model, tokens), expected["logits"]) <= FORWARD_ABS
    assert_localized(planted, expected, "block.attn.weights", TAP_ABS)
    by_query = planted["block.attn.weights"].transpose(0, 2, 1, 3)  # (B, query, heads, key)
    padded = ~padding_mask(tokens)
    assert np.all(by_query[padded] == 0.0)
    np.testing.assert_allclose(by_query[~padded].sum(axis=-1), 1.0, rtol=1e-6)


def test_keras_default_layer_norm_epsilon_enters_at_the_first_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' LayerNormalization defaults to epsilon 1e-3 (the spec's is 1e-5): left at the default, block.norm1 is
    the first tap to miss, and the logits miss too. Small embeddings (the canonical init draws N(0, 0.02)) give the
    small variances where epsilon matters."""
    config, weights, tokens = _case(3)
    weights = {k: v * 0.05 if k in ("embed.embedding", "pos_embedding") else v for k, v in weights.items()}
    expected = forward_with_taps(config, weights, tokens)

    def keras_default(settings: TextTransformerSpec, name: str) -> layers.LayerNormalization:
        return layers.LayerNormalization(name=name)

    monkeypatch.setattr(models, "text_layer_norm", keras_default)
    model = rosetta_tf.build(config, weights)
    assert model.get_layer("block_norm1").epsilon == 1e-3
    assert_localized(rosetta_tf.forward_with_taps(model, tokens), expected, "block.norm1", TAP_ABS)
    assert max_abs_diff(rosetta_tf.predict(model, tokens), expected["logits"]) > FAR


def test_pooling_the_padding_enters_at_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' GlobalAveragePooling1D without a mask (the image attention model's pooling): the mean over every
    position, padding included."""
    config, weights, tokens = _case(4)
    expected = forward_with_taps(config, weights, tokens)

    def plain_mean(x: Any, mask: Any) -> Any:
        return ops.mean(x, axis=1)

    monkeypatch.setattr(models, "masked_mean", plain_mean)
    model = rosetta_tf.build(config, weights)
    assert_localized(rosetta_tf.forward_with_taps(model, tokens), expected, "pool", TAP_ABS)
    assert max_abs_diff(rosetta_tf.predict(model, tokens), expected["logits"]) > FAR


def test_per_head_kernels_are_the_canonical_columns() -> None:
    """Keras' query/key/value kernel (embed, heads, head_dim) holds canonical columns h*head_dim:(h+1)*head_dim at
    [:, h, :], its bias (heads, head_dim) likewise; the output kernel (heads, head_dim, embed) holds canonical rows
    h*head_dim:(h+1)*head_dim at [h]; the output bias is the canonical one."""
    config, weights, _ = _case(5)
    attn = rosetta_tf.build(config, weights).get_layer("block_attn")
    heads, hd, e = config.settings.num_heads, config.settings.head_dim, config.settings.embed_dim
    for part, dense in (("query", attn.query_dense), ("key", attn.key_dense), ("value", attn.value_dense)):
        kernel, bias = np.asarray(dense.kernel), np.asarray(dense.bias)
        assert kernel.shape == (e, heads, hd) and bias.shape == (heads, hd)
        for h in range(heads):
            np.testing.assert_array_equal(kernel[:, h, :], weights[f"block.attn.{part}.kernel"][:, h * hd:(h + 1) * hd])
            np.testing.assert_array_equal(bias[h], weights[f"block.attn.{part}.bias"][h * hd:(h + 1) * hd])
    out = np.asarray(attn.output_dense.kernel)
    assert out.shape == (heads, hd, e)
    for h in range(heads):
        np.testing.assert_array_equal(out[h], weights["block.attn.out.kernel"][h * hd:(h + 1) * hd])
    np.testing.assert_array_equal(np.asarray(attn.output_dense.bias), weights["block.attn.out.bias"])


def test_a_head_interleaved_split_fails_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-head kernels reshaped column-major (canonical column h + heads * j at [h, j]: heads interleaved, not
    blocks): the round trip cannot see it (the same reshape both ways), the reference can."""
    config, weights, tokens = _case(6)
    monkeypatch.setattr(tf_weights, "HEAD_SPLIT", "F")
    model = rosetta_tf.build(config, weights)
    back = rosetta_tf.to_canonical(model)
    assert all(np.array_equal(back[k], weights[k]) for k in weights)
    expected = forward_with_taps(config, weights, tokens)
    assert_localized(rosetta_tf.forward_with_taps(model, tokens), expected, "block.attn.weights", TAP_ABS)
    assert max_abs_diff(rosetta_tf.predict(model, tokens), expected["logits"]) > FAR


def test_padding_changes_nothing() -> None:
    """More padding columns (up to max_length), or a row batched with longer ones, move no logit beyond the
    tolerance: padded keys get weight exactly 0 and the pool leaves them out."""
    config, weights, tokens = _case(7, length=7)
    model = rosetta_tf.build(config, weights)
    logits = rosetta_tf.predict(model, tokens)
    padded = np.pad(tokens, ((0, 0), (0, config.max_length - tokens.shape[1])), constant_values=PAD_ID)
    assert max_abs_diff(rosetta_tf.predict(model, padded), logits) <= FORWARD_ABS
    for row in range(len(tokens)):
        alone = tokens[row:row + 1, : int(padding_mask(tokens[row]).nonzero()[0].max()) + 1]
        assert max_abs_diff(rosetta_tf.predict(model, alone), logits[row:row + 1]) <= FORWARD_ABS
    weights_tap = rosetta_tf.forward_with_taps(model, tokens)["block.attn.weights"]
    by_key = weights_tap.transpose(0, 3, 1, 2)  # (B, key, heads, query)
    assert np.all(by_key[~padding_mask(tokens)] == 0.0) and np.all(by_key[padding_mask(tokens)] > 0.0)


def test_one_graph_serves_every_batch_size_and_length(tmp_path: Path) -> None:
    """predict's tf.function and the SavedModel's serve signature are int64 (None, None): no retrace per shape."""
    config, weights, _ = _case(8)
    model = rosetta_tf.build(config, weights)
    native = tmp_path / "native"
    rosetta_tf.export_native(model, native, random_inputs(config, 2, 0))
    served = tf.saved_model.load(str(native / SAVED_MODEL_DIR))
    spec = served.signatures["serving_default"].structured_input_signature[1]
    assert {name: (s.dtype, s.shape.as_list()) for name, s in spec.items()} == {"tokens": (tf.int64, [None, None])}
    reloaded = rosetta_tf.load_native(native)
    for batch, length in ((1, 1), (3, 5), (17, config.max_length), (2, 2)):
        tokens = random_inputs(config, batch, batch + length, length)
        logits = rosetta_tf.predict(model, tokens)
        assert logits.shape == (batch, config.num_classes)
        assert max_abs_diff(logits, forward(config, weights, tokens)) <= FORWARD_ABS
        for name, run in reloaded.items():
            assert np.array_equal(run(tokens), logits), name
    assert models._forward(model).experimental_get_tracing_count() == 1


def _bad_tokens(config: ModelConfig) -> dict[str, tuple[np.ndarray, str]]:
    good = random_inputs(config, 3, 0)
    out_of_vocabulary, empty = good.copy(), good.copy()
    out_of_vocabulary[1, 0] = config.vocab_size
    empty[2] = PAD_ID
    too_long = np.ones((2, config.max_length + 1), np.int64)
    return {"int32": (good.astype(np.int32), "int32"), "float": (good.astype(np.float32), "float32"),
            "out_of_vocabulary": (out_of_vocabulary, str(config.vocab_size)),
            "too_long": (too_long, str(config.max_length + 1)), "all_padding": (empty, "row 2"),
            "one_dimensional": (good[0], "shape")}


def _callers(tmp_path: Path, config: ModelConfig) -> dict[str, Callable[[np.ndarray], Any]]:
    model = rosetta_tf.build(config, asymmetric_weights(config, 9))
    rosetta_tf.export_native(model, tmp_path / "native", random_inputs(config, 2, 0))
    native = rosetta_tf.load_native(tmp_path / "native")
    return {"predict": lambda x: rosetta_tf.predict(model, x),
            "forward_train": lambda x: rosetta_tf.forward_train(model, x, None),
            "forward_with_taps": lambda x: rosetta_tf.forward_with_taps(model, x),
            **{f"native_{name}": run for name, run in native.items()}}


def test_bad_tokens_are_one_line_input_errors_wherever_the_model_is_called(tmp_path: Path) -> None:
    config = small_config(ARCH)
    callers = _callers(tmp_path, config)
    for case, (tokens, named) in _bad_tokens(config).items():
        for caller, run in callers.items():
            with pytest.raises(InputError) as raised:
                run(tokens)
            message = str(raised.value)
            assert "\n" not in message and named in message, (case, caller, message)


def test_the_pad_row_and_the_frozen_key_bias_never_train() -> None:
    """Keras' Embedding has no padding row (torch's padding_idx): row PAD_ID is trained like any row, but it reaches
    the logits nowhere (a padded position is never a key and never pooled), so its gradient is exactly zero and Adam
    leaves it as it was, bit for bit, while every real token's row moves. The Embedding's gradient is
    IndexedSlices, densified for the optimizers (rosetta_tf.train.dense): Adam's and SGD's state decays on every
    row each step, as it does on torch's dense gradient. The key bias (rosetta_common.weights.FROZEN: its gradient
    is rounding noise, which Adam would turn into steps of up to the learning rate) is not trainable (models.freeze)
    and stays as loaded, while the query and value biases move."""
    config = small_config(ARCH)
    weights = asymmetric_weights(config, 10)  # a nonzero pad row: zero or not, it must not move
    data = learnable_data(n_train=32, n_test=8, tokens=True)
    for optimizer in ("adam", "sgd"):
        model = rosetta_tf.build(config, weights)
        rosetta_tf.train(model, plan(small_spec(optimizer=optimizer, epochs=1), ARCH, 32), data)
        after = rosetta_tf.to_canonical(model)
        table = after["embed.embedding"]
        np.testing.assert_array_equal(table[PAD_ID], weights["embed.embedding"][PAD_ID], err_msg=optimizer)
        for name in FROZEN:
            np.testing.assert_array_equal(after[name], weights[name], err_msg=f"{optimizer} {name}")
        for name in ("block.attn.query.bias", "block.attn.value.bias"):
            assert np.abs(after[name] - weights[name]).min() > 0, f"{optimizer} {name}"
        used = np.unique(data.train_inputs[data.train_inputs != PAD_ID])
        assert np.all(np.abs(table[used] - weights["embed.embedding"][used]).max(axis=1) > 0), optimizer


def test_a_mirrored_step_leaves_the_frozen_key_bias_as_loaded() -> None:
    """distributed.train_data_parallel builds the model inside its strategy's scope (mirrored variables) and steps
    the optimizer, built on training_view(model).trainable_variables, in the replica context. The same under a
    one-device MirroredStrategy (a real MultiWorkerMirroredStrategy needs its own processes: the conformance suite's
    two workers): freeze marks the mirrored key bias non-trainable too, so the step's gradients, all-reduce and Adam
    leave it as loaded, bit for bit, while the query and value biases move."""
    config = small_config(ARCH)
    weights = asymmetric_weights(config, 12)
    data = learnable_data(n_train=16, n_test=4, tokens=True)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = rosetta_tf.build(config, weights)
        trainer = models.training_view(model)
        optimizer = rosetta_tf.make_optimizer(model, plan(small_spec(optimizer="adam"), ARCH, 16).optimizer, 2)
        optimizer.build(trainer.trainable_variables)
        loss_fn = train_module.make_loss()
    frozen = {id(tf_weights.bindings(model)[name].variable) for name in FROZEN}
    assert frozen and not frozen & {id(v) for v in trainer.trainable_variables}

    def replica_step(tokens: Any, labels: Any) -> Any:  # distributed.train_data_parallel's step
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, trainer(tokens, training=True))
        grads = tape.gradient(loss, trainer.trainable_variables)
        optimizer.apply_gradients(zip(grads, trainer.trainable_variables, strict=True))
        return loss

    @tf.function
    def step(tokens: Any, labels: Any) -> Any:
        return strategy.run(replica_step, args=(tokens, labels))

    for _ in range(2):
        step(tf.constant(data.train_inputs), tf.constant(data.train_labels))
    after = rosetta_tf.to_canonical(model)
    for name in FROZEN:
        np.testing.assert_array_equal(after[name], weights[name], err_msg=name)
    for name in ("block.attn.query.bias", "block.attn.value.bias"):
        assert np.abs(after[name] - weights[name]).min() > 0, name


def test_token_models_densify_only_their_sgd() -> None:
    """DenseSGD for a token model; an image model keeps keras.optimizers.SGD (its exports and bits unchanged)."""
    optimizer = plan(small_spec(optimizer="sgd"), ARCH, 32).optimizer
    text = rosetta_tf.build(small_config(ARCH), asymmetric_weights(small_config(ARCH), 11))
    image = rosetta_tf.build(small_config("mlp"), asymmetric_weights(small_config("mlp"), 11))
    assert type(rosetta_tf.make_optimizer(text, optimizer, 4)) is train_module.DenseSGD
    assert type(rosetta_tf.make_optimizer(image, optimizer, 4)) is keras.optimizers.SGD
    sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([1]), tf.constant([3, 2]))
    np.testing.assert_array_equal(np.asarray(train_module.dense(sparse)), [[0, 0], [1, 2], [0, 0]])

