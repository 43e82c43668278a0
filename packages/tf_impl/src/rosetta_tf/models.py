"""The seven architectures as Keras 3 functional models, and the contract's build(), predict(), model_config() and
forward_train().

Written with Keras' own layers where they map one to one (Conv2D, BatchNormalization, Dropout, LSTM, GRU, and the
text model's Embedding and MultiHeadAttention); the image attention block with keras.ops, since Keras'
MultiHeadAttention keeps per-head kernels and an all-or-nothing bias. Every layer is named after its canonical
prefix (dots become underscores: "block.shortcut.conv" is the layer "block_shortcut_conv"), so weights.py maps
names one to one. Where Keras does not follow the spec (BatchNormalization's reduction, GELU's approximation, the
text model's masks), the spec's convention is set where the layer is made. Each model carries the ModelConfig it
was built from (`model_config`), which export.py stores beside model.keras.

Each model is a function returning its functional model, named as rosetta_torch's and rosetta_jax's model classes
are (Keras' own convention: keras.applications.ResNet50 is a function too); a block the others make a module of
(FeedForward, ConvBN, ResidualBlock, TextEncoderBlock) is a function from its input tensor to its output.

What differs between the frameworks, and how each package reconciles it: docs/conventions.md.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from rosetta_common.inputs import PAD_ID
from rosetta_common.onnx_conventions import INPUT_NAME, TOKENS_NAME
from rosetta_common.registry import (
    AttentionSpec,
    CNNSpec,
    GRUSpec,
    LSTMSpec,
    MLPSpec,
    ResNetSpec,
    TextTransformerSpec,
    not_built,
)
from rosetta_common.spec import ModelConfig
from rosetta_common.training import dropout_features
from rosetta_common.weights import Weights, is_frozen
from rosetta_tf import weights as _weights

PACKAGE = "rosetta_tf"  # registration namespace: load_model(safe_mode=True) finds our layers by it


@keras.saving.register_keras_serializable(package=PACKAGE)
class AddChannel(layers.Layer):
    """(B, H, W) -> (B, H, W, 1); a named layer instead of a Lambda, which safe_mode refuses to load."""

    def call(self, x: Any) -> Any:
        return ops.expand_dims(x, -1)


def MLP(settings: MLPSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    inputs = keras.Input(shape=image_shape, name="images")
    x = layers.Flatten(name="flatten")(inputs)  # row-major, as the reference's reshape
    x = layers.Dense(settings.hidden, activation="relu", name="hidden")(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="mlp")


def CNN(settings: CNNSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    inputs = keras.Input(shape=image_shape, name="images")
    x = AddChannel(name="add_channel")(inputs)
    x = layers.Conv2D(settings.conv1_filters, 3, padding="same", activation="relu", name="conv1")(x)
    x = layers.MaxPooling2D(pool_size=2, strides=2, name="pool")(x)  # "valid": floor, as the reference
    x = layers.Conv2D(settings.conv2_filters, 3, padding="same", activation="relu", name="conv2")(x)
    x = layers.Flatten(name="flatten")(x)  # NHWC -> (h, w, c) order, the canonical one
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="cnn")


@keras.saving.register_keras_serializable(package=PACKAGE)
class PositionEmbedding(layers.Layer):
    """Adds a learned (tokens, embed_dim) table to its input."""

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        self.pos_embedding = self.add_weight(
            shape=(input_shape[-2], input_shape[-1]), initializer="zeros", name="pos_embedding"
        )

    def call(self, x: Any) -> Any:
        return x + self.pos_embedding


@keras.saving.register_keras_serializable(package=PACKAGE)
class SelfAttention(layers.Layer):
    """Multi-head self-attention: bias-free q/k/v projections, out projection with bias."""

    def __init__(self, embed_dim: int, num_heads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if embed_dim % num_heads:
            raise ValueError(f"num_heads ({num_heads}) must divide embed_dim ({embed_dim})")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.query = layers.Dense(embed_dim, use_bias=False, name="query")
        self.key = layers.Dense(embed_dim, use_bias=False, name="key")
        self.value = layers.Dense(embed_dim, use_bias=False, name="value")
        self.out = layers.Dense(embed_dim, name="out")

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        for dense in (self.query, self.key, self.value, self.out):
            dense.build(input_shape)

    def _split(self, t: Any) -> Any:
        # (B, T, E) -> (B, heads, T, head_dim); head h owns columns h*head_dim:(h+1)*head_dim.
        tokens = t.shape[1]
        return ops.transpose(ops.reshape(t, (-1, tokens, self.num_heads, self.head_dim)), (0, 2, 1, 3))

    def attention_weights(self, q: Any, k: Any) -> Any:
        """softmax(q k^T / sqrt(head_dim)) of the split q and k, (B, heads, T, T): its own method so that the
        taps (rosetta_tf.taps) read the weights this forward computes, not a copy of the formula."""
        # Scale after the matmul, as the reference does (scaling q first rounds differently).
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / math.sqrt(self.head_dim)
        return ops.softmax(scores, axis=-1)

    def call(self, x: Any) -> Any:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        attended = ops.matmul(self.attention_weights(q, k), v)
        merged = ops.reshape(ops.transpose(attended, (0, 2, 1, 3)), (-1, x.shape[1], self.embed_dim))
        return self.out(merged)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "embed_dim": self.embed_dim, "num_heads": self.num_heads}


def gelu_exact(x: Any) -> Any:
    """Exact GELU written as torch's CPU kernel computes it, 0.5 * x * (1 + erf(x / sqrt(2))).

    Not ops.gelu(approximate=False): TF 2.21 lowers that to Erfc, which tf2onnx 1.17 cannot convert.
    """
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


@keras.saving.register_keras_serializable(package=PACKAGE)
class ExactGelu(layers.Layer):
    """gelu_exact as a layer (its output is the block.mlp.gelu tap)."""

    def call(self, x: Any) -> Any:
        return gelu_exact(x)


def FeedForward(x: Any, embed_dim: int, mlp_dim: int, name: str) -> Any:
    """The text block's MLP on `x`: Dense to mlp_dim, exact GELU (ExactGelu), Dense back to embed_dim, its layers
    `<name>_fc1`, `<name>_gelu`, `<name>_fc2`. (The image model's EncoderBlock, one layer, holds its fc1 and fc2
    itself.)"""
    h = layers.Dense(mlp_dim, name=f"{name}_fc1")(x)
    return layers.Dense(embed_dim, name=f"{name}_fc2")(ExactGelu(name=f"{name}_gelu")(h))


@keras.saving.register_keras_serializable(package=PACKAGE)
class EncoderBlock(layers.Layer):
    """One pre-norm Transformer encoder block: x + Attn(LN1(x)), then h + fc2(GELU(fc1(LN2(h))))."""

    def __init__(
        self, embed_dim: int, num_heads: int, mlp_dim: int, layer_norm_eps: float, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.embed_dim, self.num_heads, self.mlp_dim = embed_dim, num_heads, mlp_dim
        self.layer_norm_eps = layer_norm_eps
        self.norm1 = layers.LayerNormalization(epsilon=layer_norm_eps, name="norm1")
        self.attn = SelfAttention(embed_dim, num_heads, name="attn")
        self.norm2 = layers.LayerNormalization(epsilon=layer_norm_eps, name="norm2")
        self.fc1 = layers.Dense(mlp_dim, name="fc1")
        self.fc2 = layers.Dense(embed_dim, name="fc2")

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        self.norm1.build(input_shape)
        self.attn.build(input_shape)
        self.norm2.build(input_shape)
        self.fc1.build(input_shape)
        self.fc2.build((*input_shape[:-1], self.mlp_dim))

    def call(self, x: Any) -> Any:
        h = x + self.attn(self.norm1(x))
        return h + self.fc2(gelu_exact(self.fc1(self.norm2(h))))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "embed_dim": self.embed_dim, "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim, "layer_norm_eps": self.layer_norm_eps}


def AttentionClassifier(settings: AttentionSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    a = settings
    inputs = keras.Input(shape=image_shape, name="images")  # each image row is one token
    x = layers.Dense(a.embed_dim, name="embed")(inputs)
    x = PositionEmbedding(name="pos_embedding")(x)
    x = EncoderBlock(a.embed_dim, a.num_heads, a.mlp_dim, a.layer_norm_eps, name="block")(x)
    x = layers.LayerNormalization(epsilon=a.layer_norm_eps, name="final_norm")(x)
    x = layers.GlobalAveragePooling1D(name="mean_tokens")(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="attention")


# Keras' BatchNormalization momentum is the weight of the old running average, the spec's meaning: unchanged.
# A function (not an inline number) so that the package's tests can plant torch's meaning (1 - m) here.
def batchnorm_momentum(momentum: float) -> float:
    return momentum


def conv(filters: int, size: int, stride: int, name: str) -> layers.Conv2D:
    """A bias-free convolution (a BatchNorm follows) with Keras' "same" padding, which is TensorFlow's and the
    canonical one: ceil(size / stride) outputs, the odd extra row and column of a stride-2 conv at the bottom
    and right (rosetta_common.reference.same_padding). torch's padding=1 would pad both sides instead."""
    return layers.Conv2D(filters, size, strides=stride, padding="same", use_bias=False, name=name)


def channel_rows(x: Any) -> Any:
    """(..., C) -> (C, n): each channel's n values along the innermost axis."""
    return tf.transpose(tf.reshape(x, (-1, tf.shape(x)[-1])))


@tf.custom_gradient
def channel_sum(x: Any) -> Any:
    """(..., C) -> (C,): each channel summed over every other axis, along the innermost axis (BatchNorm below)."""

    def grad(dy: Any) -> Any:
        return tf.broadcast_to(dy, tf.shape(x))

    return tf.reduce_sum(channel_rows(x), axis=1), grad


@tf.custom_gradient
def per_channel(values: Any, shape: Any) -> Any:
    """(C,) broadcast to `shape` (..., C), its gradient summed by channel_sum, not by TensorFlow's broadcast
    gradient (a reduce_sum over the leading axes: the column reduction BatchNorm below avoids)."""

    def grad(dy: Any) -> Any:
        return channel_sum(dy), None

    return tf.broadcast_to(values, shape), grad


@keras.saving.register_keras_serializable(package=PACKAGE)
class BatchNormalization(layers.BatchNormalization):
    """Keras' BatchNormalization, in training mode summing each channel along the innermost axis and normalizing
    as the spec writes it, (x - mean) * (scale / sqrt(var + eps)) + bias; in inference mode Keras' own.

    Why: Keras sums a channel's N*H*W values (tf.nn.moments, and autodiff's gradient of every per-channel
    broadcast: the scale's, the bias's, the mean's) with TensorFlow's reduction over the leading axes, whose
    float32 error is several times torch's and XLA's: on a (32, 28, 28, 8) batch a mean 8.9e-7 off float64
    (relative), against 1.1e-7 for torch, 9.0e-8 for XLA and 8.0e-8 for the same sum along the innermost axis
    (measured). Its normalization, x * inv + (bias - mean * inv), also cancels when a channel's mean is large
    against its spread, as over MNIST's blank margins. On 8x8 digits it stays within the lockstep bound; on
    28x28 MNIST (data.source=mnist5k) TF's resnet parted from torch's and JAX's at step 1 (its BatchNorm scales
    1.5e-4 apart after one SGD step, torch's and JAX's bit for bit equal) and failed every lockstep check. With
    these sums its state after a step is torch's and JAX's to their own distance (every first-12-step loss
    within 1.1e-7 of both, measured)."""

    def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        if not (training and self.trainable) or mask is not None or not (self.scale and self.center):
            return super().call(inputs, training=training, mask=mask)
        x = tf.cast(inputs, "float32")
        shape = tf.shape(x)
        count = tf.cast(tf.reduce_prod(shape[:-1]), x.dtype)
        mean = channel_sum(x) / count
        # The biased variance, two-pass; the mean's gradient through it is zero, dropped as tf.nn.moments does.
        variance = channel_sum(tf.square(x - per_channel(tf.stop_gradient(mean), shape))) / count
        self.moving_mean.assign(self.moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(self.moving_variance * self.momentum + variance * (1.0 - self.momentum))
        # Read as tensors: a variable handed to a custom gradient in eager mode would be a variable it uses.
        scale, bias = tf.convert_to_tensor(self.gamma), tf.convert_to_tensor(self.beta)
        inv = tf.math.rsqrt(variance + self.epsilon) * scale
        y = (x - per_channel(mean, shape)) * per_channel(inv, shape) + per_channel(bias, shape)
        return tf.cast(y, self.compute_dtype)


def batchnorm(settings: ResNetSpec, name: str) -> layers.BatchNormalization:
    """BatchNormalization (above) has the spec's convention as it stands, so both numbers pass unchanged:
    `momentum` (batchnorm_momentum) is the weight of the old running value (running = m * running + (1 - m) *
    batch; torch's `momentum` is 1 - m), and the running variance averages the biased batch variance, the one that
    normalizes. Only epsilon's default differs (Keras 1e-3): the spec's is always passed."""
    return BatchNormalization(momentum=batchnorm_momentum(settings.batchnorm_momentum),
                              epsilon=settings.batchnorm_epsilon, name=name)


def ConvBN(x: Any, settings: ResNetSpec, filters: int, kernel: int, stride: int, name: str) -> Any:
    """A convolution and its BatchNorm on `x`, the layers `<name>_conv` and `<name>_bn` (the canonical names
    `<name>.conv` and `<name>.bn`)."""
    return batchnorm(settings, f"{name}_bn")(conv(filters, kernel, stride, f"{name}_conv")(x))


def ResidualBlock(x: Any, settings: ResNetSpec, filters: int, name: str) -> Any:
    """conv3x3 stride 2 + BN + ReLU, conv3x3 + BN; shortcut conv1x1 stride 2 + BN; add; ReLU, on `x`, its layers
    named after the canonical `<name>.conv1`, `<name>.bn1`, ... (`<name>_conv1`, ...)."""
    shortcut = ConvBN(x, settings, filters, 1, 2, f"{name}_shortcut")
    y = layers.ReLU(name=f"{name}_relu1")(batchnorm(settings, f"{name}_bn1")(conv(filters, 3, 2, f"{name}_conv1")(x)))
    y = batchnorm(settings, f"{name}_bn2")(conv(filters, 3, 1, f"{name}_conv2")(y))
    return layers.ReLU(name=f"{name}_relu")(layers.Add(name=f"{name}_add")([y, shortcut]))


POOLED = "pool"  # the layer whose output (the pooled features) dropout acts on
DROPOUT = "dropout"


def ResNet(settings: ResNetSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    s = settings
    inputs = keras.Input(shape=image_shape, name="images")
    x = AddChannel(name="add_channel")(inputs)
    x = layers.ReLU(name="stem_relu")(ConvBN(x, s, s.stem_filters, 3, 1, "stem"))
    y = ResidualBlock(x, s, s.block_filters, "block")
    pooled = layers.GlobalAveragePooling2D(name=POOLED)(y)
    # Keras' Dropout, identity whenever training is off (predict, every export). Training never runs it: the
    # training model (training_view below) multiplies the pooled features by common's mask instead. The seed
    # is pinned only so that the layer's seed-generator state (a variable, saved with the model) has the same
    # bytes in every process; it never draws.
    x = layers.Dropout(s.dropout, seed=0, name=DROPOUT)(pooled)
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="resnet")


def LSTMClassifier(settings: LSTMSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    inputs = keras.Input(shape=image_shape, name="images")  # each image row is one time step
    # Keras' cell computes the reference's formula: z = x W + h U + b, gates i, f, c, o, sigmoid on i, f, o (the
    # default recurrent_activation, passed explicitly because it matters), tanh on c and on the new cell state.
    # unit_forget_bias only initializes the bias (to 1 on the forget block): build() overwrites it. seed: the
    # cell's seed-generator state is a saved variable; pinned so that it is the same in every process (the cell
    # has no dropout, it never draws).
    x = layers.LSTM(settings.hidden, activation="tanh", recurrent_activation="sigmoid", seed=0, name="lstm")(inputs)
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="lstm")


def GRUClassifier(settings: GRUSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    inputs = keras.Input(shape=image_shape, name="images")  # each image row is one time step
    # reset_after=True is torch's (and the canonical) formula: the reset gate multiplies h U_h + b_hh, so the
    # recurrent bias sits inside it; Keras keeps both biases in one (2, 3h) variable (weights.py).
    # unroll=True: tf2onnx has no pattern for Keras 3's GRU cell (it matches tf.keras 2's BiasAdd), so a rolled
    # GRU converts to an ONNX Loop whose body it names and deduplicates differently in every process, and
    # model.onnx would never have the same bytes twice. Unrolled (one step per image row: 8 for digits, 28 for
    # MNIST), the graph is plain ops that onnx_conventions.canonical_names makes byte-stable.
    x = layers.GRU(settings.hidden, activation="tanh", recurrent_activation="sigmoid", reset_after=True,
                   unroll=True, seed=0, name="gru")(inputs)  # seed: as the LSTM's
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="gru")


# The text model. Every mask is True = a real token / attend, Keras' polarity (torch's key_padding_mask is the
# negation). Each convention is one module-level function, looked up when the graph is traced, so that a test can
# plant the mistake it guards against (tests/test_text.py; the conformance suite plants the rest).


def padding_mask(tokens: Any) -> Any:
    """(B, T) bool, True where a position holds a real token (rosetta_common.inputs.padding_mask's polarity)."""
    return ops.not_equal(tokens, PAD_ID)


def attention_mask(mask: Any) -> Any:
    """MultiHeadAttention's attention_mask for a padding mask: (B, 1, T), broadcast over the queries, True = attend:
    query i may read key j iff j is a real token. Only the key side is masked: a padded position is still computed
    as a query (mask & mask.T would leave its row with no key at all)."""
    return ops.expand_dims(mask, 1)


def masked_mean(x: Any, mask: Any) -> Any:
    """The mean over the real tokens of each row, (B, T, E) -> (B, E): padded positions are left out."""
    weights = ops.expand_dims(ops.cast(mask, x.dtype), -1)
    return ops.sum(x * weights, axis=1) / ops.sum(weights, axis=1)


def text_layer_norm(settings: TextTransformerSpec, name: str) -> layers.LayerNormalization:
    """Keras' LayerNormalization with the spec's epsilon (1e-5): Keras' default is 1e-3, torch's and Flax's 1e-5 and
    1e-6. Keras normalizes with the biased variance, the spec's, so nothing else needs converting."""
    return layers.LayerNormalization(epsilon=settings.layer_norm_eps, name=name)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PaddingMask(layers.Layer):
    """Token ids -> padding_mask(tokens), a layer of its own (a Lambda would not load in safe_mode)."""

    def call(self, tokens: Any) -> Any:
        return padding_mask(tokens)


@keras.saving.register_keras_serializable(package=PACKAGE)
class AttentionMask(layers.Layer):
    """A padding mask -> attention_mask(mask), MultiHeadAttention's argument."""

    def call(self, mask: Any) -> Any:
        return attention_mask(mask)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PositionTable(layers.Layer):
    """Adds learned positions to the token embeddings: a (max_length, embed_dim) table of which a batch of length T
    adds rows 0..T-1 (T is dynamic: one graph, one SavedModel and one model.onnx serve every length)."""

    def __init__(self, max_length: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_length = max_length

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        self.pos_embedding = self.add_weight(shape=(self.max_length, input_shape[-1]), initializer="zeros",
                                             name="pos_embedding")

    def call(self, x: Any) -> Any:
        return x + self.pos_embedding[: ops.shape(x)[1]]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "max_length": self.max_length}


@keras.saving.register_keras_serializable(package=PACKAGE)
class MaskedMean(layers.Layer):
    """(features (B, T, E), padding mask (B, T)) -> masked_mean: the mean over the real tokens."""

    def call(self, x: Any, mask: Any) -> Any:
        return masked_mean(x, mask)


TEXT_POOL = "pool"  # the text model's pooling layer (its output is the `pool` tap, the head's input)


def TextEncoderBlock(x: Any, mask: Any, settings: TextTransformerSpec, name: str) -> Any:
    """The text model's pre-norm encoder block on `x` (B, T, E) with padding_mask's `mask` (B, T): Keras'
    MultiHeadAttention between LayerNormalizations, the padded keys masked (AttentionMask), then FeedForward, its
    layers named after the canonical `<name>.norm1`, `<name>.attn`, ... (`<name>_norm1`, ...)."""
    s = settings
    n = text_layer_norm(s, f"{name}_norm1")(x)
    attn = layers.MultiHeadAttention(s.num_heads, key_dim=s.head_dim, use_bias=True, name=f"{name}_attn")
    a = attn(n, n, attention_mask=AttentionMask(name="attention_mask")(mask))
    h = layers.Add(name=f"{name}_attn_residual")([x, a])
    f = FeedForward(text_layer_norm(s, f"{name}_norm2")(h), s.embed_dim, s.mlp_dim, f"{name}_mlp")
    return layers.Add(name=f"{name}_mlp_residual")([h, f])


def TextTransformer(settings: TextTransformerSpec, vocab_size: int, max_length: int,
                    num_classes: int) -> keras.Model:
    """Token ids (B, T) int64, 1 <= T <= max_length, PAD_ID padding -> logits. Keras' own layers throughout:
    - Embedding(vocab_size, embed_dim) without mask_zero: the mask is explicit (PaddingMask), never Keras' implicit
      one, which MultiHeadAttention would apply to the queries as well (masking padded query rows completely) and
      GlobalAveragePooling1D would silently use. Row PAD_ID is an ordinary row (the canonical init's zero is loaded
      like any value; it never reaches the logits, so it gets no gradient);
    - MultiHeadAttention(num_heads, key_dim=head_dim, use_bias=True) called with attention_mask (B, 1, T), True =
      attend. Its per-head kernels are the canonical ones reshaped (weights.py);
    - LayerNormalization with the spec's epsilon, Dense, exact GELU (TextEncoderBlock, FeedForward), and the mean
      over real tokens (MaskedMean).
    Layer names are the canonical prefixes (dots as underscores), so weights.py and taps.py map names one to one."""
    s = settings
    tokens = keras.Input(shape=(None,), dtype="int64", name=TOKENS_NAME)
    mask = PaddingMask(name="padding_mask")(tokens)
    embedded = layers.Embedding(vocab_size, s.embed_dim, mask_zero=False, name="embed")(tokens)
    h = PositionTable(max_length, name="pos_embedding")(embedded)
    h = TextEncoderBlock(h, mask, s, "block")
    z = text_layer_norm(s, "final_norm")(h)
    pooled = MaskedMean(name=TEXT_POOL)(z, mask)
    return keras.Model(tokens, layers.Dense(num_classes, name="head")(pooled), name="text_transformer")


BUILDERS = {"mlp": MLP, "cnn": CNN, "attention": AttentionClassifier, "resnet": ResNet, "lstm": LSTMClassifier,
            "gru": GRUClassifier}
CONFIG_ATTR = _weights.CONFIG_ATTR  # the attribute a model keeps its ModelConfig under


def attach_config(model: keras.Model, config: ModelConfig) -> keras.Model:
    """Record `config` on `model` (also used by export.load_native on a reloaded model.keras)."""
    setattr(model, CONFIG_ATTR, config)
    return model


def freeze(model: keras.Model) -> keras.Model:
    """Mark the model's frozen parameters (rosetta_common.weights.FROZEN: the text model's key bias, which the
    softmax cancels, so that its gradient is rounding noise alone) not trainable: Keras' trainable_variables, and so
    fit's gradients, every optimizer and the data-parallel step, leave them out, and they stay as loaded, bit for
    bit. (A flag of the Keras variable, not saved in model.keras: only a model build() makes is ever trained.)"""
    for name, binding in _weights.bindings(model).items():
        if is_frozen(name):
            binding.variable.trainable = False
    return model


def create(config: ModelConfig) -> keras.Model:
    """The Keras model of `config`, with Keras' initial weights (build() replaces them)."""
    if config.input.kind == "tokens":
        model = TextTransformer(config.settings, int(config.vocab_size), int(config.max_length), config.num_classes)
        return freeze(attach_config(model, config))
    builder = BUILDERS.get(config.arch)
    if builder is None:
        raise not_built(config.arch, "rosetta_tf")
    return attach_config(builder(config.settings, config.image_shape, config.num_classes), config)


def build(config: ModelConfig, weights: Weights) -> keras.Model:
    """The Keras model of `config` holding copies of these canonical weights (WeightsError if they do not fit).

    Keras has no persistent train/eval mode: predict() and the exports call the model with training=False,
    and only fit() and forward_train() run it (or its training twin, training_view) with training=True.
    """

    model = create(config)
    _weights.from_canonical(model, weights)
    return model


def model_config(model: keras.Model) -> ModelConfig:
    config = getattr(model, CONFIG_ATTR, None)
    if not isinstance(config, ModelConfig):
        raise ValueError(f"Keras model {model.name!r} has no Rosetta ModelConfig: make it with rosetta_tf.build")
    return config


def image_spec(model: keras.Model) -> tf.TensorSpec:
    """Dynamic batch, the model's static (height, width): the one signature predict and every export use."""
    height, width = model_config(model).image_shape
    return tf.TensorSpec([None, height, width], tf.float32, name=INPUT_NAME)


def tokens_spec() -> tf.TensorSpec:
    """Token ids int64 (batch, length), both dynamic: the one signature of a token model's predict and exports."""
    return tf.TensorSpec([None, None], tf.int64, name=TOKENS_NAME)


def input_spec(model: keras.Model) -> tf.TensorSpec:
    """The model's input signature: image_spec for an image model, tokens_spec for a token model."""
    return tokens_spec() if model_config(model).input.kind == "tokens" else image_spec(model)


def model_input(config: ModelConfig, x: Any, where: str) -> tf.Tensor:
    """What the model reads, as a tensor. Token ids are checked (rosetta_common.inputs: a one-line InputError for a
    wrong dtype or shape, an id outside the vocabulary, a sequence longer than max_length, a row of padding alone):
    Keras would cast a wrong dtype silently, and a bad id fails far less clearly in a graph, or not at all on a GPU.
    Images are cast to float32 as they always were (as rosetta_torch's model_input does), so the image models' predict,
    taps and SavedModel calls take exactly what they took before the text model."""
    if config.input.kind == "images":
        return tf.constant(np.asarray(x, np.float32))
    return tf.constant(config.input.check(x, where))


# One traced forward per model. A graph (not an eager call), so predict gets the same graph rewrites as
# the SavedModel's serve endpoint; a dynamic-batch signature, so no batch size retraces (Keras'
# predict_on_batch retraces for each new size, and model.predict splits into batches of 32).
_FORWARDS: weakref.WeakKeyDictionary[keras.Model, Any] = weakref.WeakKeyDictionary()


def _forward(model: keras.Model) -> Any:
    if model not in _FORWARDS:
        if model_config(model).input.kind == "tokens":  # dynamic length too: no sequence length retraces
            _FORWARDS[model] = tf.function(lambda tokens: model(tokens, training=False),
                                           input_signature=[tokens_spec()])
        else:
            _FORWARDS[model] = tf.function(lambda images: model(images, training=False),
                                           input_signature=[image_spec(model)])
    return _FORWARDS[model]


def predict(model: keras.Model, images: np.ndarray) -> np.ndarray:
    """Logits (batch, classes) float32 for float32 images (batch, height, width), or for a token model int64 token
    ids (batch, length), 1 <= length <= max_length; checked first (model_input: one InputError line)."""
    x = model_input(model_config(model), images, "predict")
    return np.asarray(_forward(model)(x), dtype=np.float32)


# The model fit trains and forward_train runs, per inference model (see training_view).
_TRAINING: weakref.WeakKeyDictionary[keras.Model, keras.Model] = weakref.WeakKeyDictionary()
MASK_INPUT = "dropout_mask"


def training_view(model: keras.Model) -> keras.Model:
    """The model a training step runs: `model` itself, or for a model with dropout a second functional model
    over the same layers (so the same variables) that takes the step's dropout mask as a second input,
    {"images", "dropout_mask"}, and multiplies the pooled features by it where `model` has its Dropout.

    Why not Keras' Dropout in training: it draws its mask from TF's generator, which no other framework can
    reproduce, so the three could never drop the same units and training parity would be lost; common draws
    every step's mask from the seed (rosetta_common.training.dropout_masks) and each framework multiplies it in.
    Why a second model, not a mask argument on the first: the inference model and its exports keep one input,
    and fit feeds the mask as ordinary input data from the same tf.data stream as the images, so the training
    step stays the one compiled graph of compile + fit (no per-step Python, no retracing): the same speed as the
    models without dropout, and bitwise the reference's pooled * mask."""
    if dropout_features(model_config(model)) is None:
        return model
    if model not in _TRAINING:
        features = model.get_layer(POOLED).output  # the graph node of `model`: shared, not copied
        mask = keras.Input(shape=features.shape[1:], name=MASK_INPUT)
        dropped = layers.Multiply(name="apply_dropout_mask")([features, mask])
        logits = model.get_layer("head")(dropped)
        _TRAINING[model] = keras.Model({INPUT_NAME: model.inputs[0], MASK_INPUT: mask}, logits,
                                       name=f"{model.name}_training")
    return _TRAINING[model]


def check_dropout_mask(config: ModelConfig, dropout_mask: np.ndarray | None, batch: int) -> None:
    """ValueError (one line) for a mask the model cannot use."""
    if dropout_mask is None:
        return
    features = dropout_features(config)
    shape = np.shape(dropout_mask)
    if features is None:
        raise ValueError(f"dropout_mask of shape {shape}: the {config.arch} model has no dropout; allowed: None")
    if shape != (batch, features):
        raise ValueError(f"dropout_mask shape = {shape}: allowed: {(batch, features)} (batch, pooled features)")


_TRAIN_FORWARDS: weakref.WeakKeyDictionary[keras.Model, Any] = weakref.WeakKeyDictionary()


def forward_logits(model: keras.Model, inputs: Any, dropout_mask: Any) -> Any:
    """The training-mode forward (training=True) of `model`, a training_view, with the step's dropout mask for a
    model that has dropout (the ResNet: its training view takes it as a second input)."""
    if dropout_mask is None:
        return model(inputs, training=True)
    return model({INPUT_NAME: inputs, MASK_INPUT: dropout_mask}, training=True)


def forward_train(model: keras.Model, images: np.ndarray, dropout_mask: np.ndarray | None) -> np.ndarray:
    """One training-mode forward as fit's step runs it (a graph, training=True), without a gradient: BatchNorm
    normalizes with the batch's statistics and moves its running statistics in place; `dropout_mask` (batch,
    features) multiplies the pooled features (None: no dropout). Keras keeps no mode, so the model is in
    inference mode again right after (predict calls it with training=False)."""
    config = model_config(model)
    x = model_input(config, images, "forward_train")
    batch = int(x.shape[0])
    check_dropout_mask(config, dropout_mask, batch)
    features = dropout_features(config)
    if features is None:
        mask = None
    else:
        mask = np.ones((batch, features), np.float32) if dropout_mask is None else np.asarray(dropout_mask, np.float32)
    if model not in _TRAIN_FORWARDS:
        trainer = training_view(model)
        if mask is None:
            _TRAIN_FORWARDS[model] = tf.function(lambda x: forward_logits(trainer, x, None),
                                                 input_signature=[input_spec(model)])
        else:
            mask_spec = tf.TensorSpec([None, features], tf.float32, name=MASK_INPUT)
            _TRAIN_FORWARDS[model] = tf.function(lambda x, m: forward_logits(trainer, x, m),
                                                 input_signature=[image_spec(model), mask_spec])
    run = _TRAIN_FORWARDS[model]
    logits = run(x) if mask is None else run(x, tf.constant(mask))
    return np.asarray(logits, dtype=np.float32)
