"""The seven architectures as Flax NNX modules, and the contract's build(), predict(), model_config() and
forward_train().

Written the way Flax's own NNX examples write models, with Flax's own layers (nnx.Conv, nnx.BatchNorm, nnx.Dropout,
nnx.RNN, nnx.LayerNorm, nnx.Embed, nnx.MultiHeadAttention), so that what Rosetta compares is Flax as people use it.
NNX (Flax 0.12's recommended API, not Linen) keeps attribute paths that are, nearly everywhere, the canonical names
(`self.block.attn.query.kernel` is "block.attn.query.kernel"), so weights.py maps them by name. Where Flax's
defaults do not follow the spec (LayerNorm's epsilon and variance, GELU's approximation, BatchNorm's variance, the
GRU's missing recurrent bias), the spec's convention is set where the layer is made, and the code that sets it says
how (LayerNorm, FeedForward, batchnorm, GRUCell; the text model's masks at TextTransformer).

What differs between the frameworks, and how each package reconciles it: docs/conventions.md.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rosetta_common.inputs import PAD_ID
from rosetta_common.registry import not_built
from rosetta_common.spec import ModelConfig
from rosetta_common.training import dropout_features
from rosetta_common.weights import Weights
from rosetta_jax.weights import from_canonical


class MLP(nnx.Module):
    def __init__(self, height: int, width: int, hidden: int, num_classes: int, *, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(height * width, hidden, rngs=rngs)
        self.head = nnx.Linear(hidden, num_classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = images.reshape(images.shape[0], -1)  # row-major flatten, as the spec says
        return self.head(nnx.relu(self.hidden(x)))


class CNN(nnx.Module):
    def __init__(self, height: int, width: int, conv1: int, conv2: int, num_classes: int, *,
                 rngs: nnx.Rngs) -> None:
        # "SAME" on a 3x3 kernel at stride 1 is zero padding 1 on every side.
        self.conv1 = nnx.Conv(1, conv1, kernel_size=(3, 3), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(conv1, conv2, kernel_size=(3, 3), padding="SAME", rngs=rngs)
        self.head = nnx.Linear((height // 2) * (width // 2) * conv2, num_classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = nnx.relu(self.conv1(images[..., None]))  # NHWC with one channel
        # VALID pooling floors odd sizes like the reference; window_shape must be a keyword for jax2onnx.
        x = nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2), padding="VALID")
        x = nnx.relu(self.conv2(x))
        return self.head(x.reshape(x.shape[0], -1))  # NHWC flatten = canonical (h, w, c) order


class SelfAttention(nnx.Module):
    """Multi-head self-attention from plain tensor ops (not nnx.MultiHeadAttention, whose per-head kernels
    and all-or-nothing bias would not map one to one onto the canonical (embed, embed) kernels)."""

    def __init__(self, embed_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> None:
        self.num_heads = num_heads
        self.query = nnx.Linear(embed_dim, embed_dim, use_bias=False, rngs=rngs)
        self.key = nnx.Linear(embed_dim, embed_dim, use_bias=False, rngs=rngs)
        self.value = nnx.Linear(embed_dim, embed_dim, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(embed_dim, embed_dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, tokens, embed = x.shape
        head_dim = embed // self.num_heads

        def split(t: jax.Array) -> jax.Array:  # (B, T, E) -> (B, T, heads, head_dim); head h = columns h*hd:
            return t.reshape(batch, tokens, self.num_heads, head_dim)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        attended = jnp.einsum("bhqk,bkhd->bqhd", self.attention_weights(q, k), v).reshape(batch, tokens, embed)
        return self.out(attended)

    def attention_weights(self, q: jax.Array, k: jax.Array) -> jax.Array:
        """softmax(q k^T / sqrt(head_dim)) of q and k split as (B, T, heads, head_dim), (B, heads, T, T): its own
        method so that the taps (rosetta_jax.taps) read the weights this forward computes."""
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        return jax.nn.softmax(scores, axis=-1)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, epsilon: float) -> jax.Array:
    """nnx.LayerNorm(use_fast_variance=False)'s forward over the last axis, the same bits (tests/test_models.py
    compares them), with the closed-form gradient below."""
    return _layer_norm_forward(x, scale, bias, epsilon)[0]


def _layer_norm_forward(x: jax.Array, scale: jax.Array, bias: jax.Array, epsilon: float
                        ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    """The forward and what the backward needs (x_hat, rstd, scale). The ops of Flax's float32 LayerNorm with
    use_fast_variance=False, in its order: the mean, then the mean of the squared deviations (two passes, the
    biased variance), then (x - mean) * (rsqrt(var + eps) * scale) + bias."""
    mean = jnp.mean(x, axis=-1)[..., None]
    var = jnp.mean(jax.lax.square(x - mean), axis=-1)[..., None]
    rstd = jax.lax.rsqrt(var + epsilon)
    y = (x - mean) * (rstd * scale) + bias
    return y, ((x - mean) * rstd, rstd, scale)


def _layer_norm_backward(epsilon: float, saved: tuple[jax.Array, jax.Array, jax.Array], grad: jax.Array
                         ) -> tuple[jax.Array, jax.Array, jax.Array]:
    # dx = rstd (g' - mean(g') - x_hat mean(g' x_hat)) with g' = grad * scale: one pass over the row for the two
    # means, where autodiff of the two-pass variance replays both passes backwards (1.06x and 1.15x the step's time
    # of Flax's one-pass LayerNorm on the attention model, digits and mnist5k: benchmarks/README.md).
    x_hat, rstd, scale = saved
    batch_axes = tuple(range(grad.ndim - 1))
    g = grad * scale
    dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
    return dx, (grad * x_hat).sum(batch_axes), grad.sum(batch_axes)


layer_norm.defvjp(lambda x, scale, bias, epsilon: _layer_norm_forward(x, scale, bias, epsilon),
                  _layer_norm_backward)


# nnx.LayerNorm's defaults are epsilon 1e-6 and a one-pass "fast" variance; the spec's are `layer_norm_eps` and the
# biased two-pass variance (torch's), so epsilon comes from the spec and use_fast_variance=False. In training
# (training_view) its gradient is the closed form torch's and Keras' kernels compute (layer_norm above), not
# autodiff's trace of the two passes: the same forward, bit for bit, at Flax's one-pass speed.
class LayerNorm(nnx.LayerNorm):
    """nnx.LayerNorm over the last axis with the spec's two-pass variance; in a training view (closed_form_grad)
    its forward is layer_norm's, the same bits with the closed-form gradient. Elsewhere it is Flax's own call,
    which jax2onnx's nnx.LayerNorm plugin exports."""

    def __init__(self, num_features: int, *, epsilon: float, rngs: nnx.Rngs) -> None:
        super().__init__(num_features, epsilon=epsilon, use_fast_variance=False, rngs=rngs)
        self.closed_form_grad = False

    def set_view(self, closed_form_grad: bool | None = None) -> None:
        """nnx.view's hook (training_view sets closed_form_grad=True).

        Args:
          closed_form_grad: if True, the forward is layer_norm's, whose gradient is the closed form.
        """
        if closed_form_grad is not None:
            self.closed_form_grad = closed_form_grad

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        if mask is not None:
            return super().__call__(x, mask=mask)
        if not self.closed_form_grad:
            return super().__call__(x)  # (x) alone: jax2onnx's patched call takes no mask
        return layer_norm(x, self.scale[...], self.bias[...], self.epsilon)


# nnx.gelu's default is the tanh approximation; the spec's GELU is exact (erf), so approximate=False.
class FeedForward(nnx.Module):
    def __init__(self, embed_dim: int, mlp_dim: int, *, rngs: nnx.Rngs) -> None:
        self.fc1 = nnx.Linear(embed_dim, mlp_dim, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_dim, embed_dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(nnx.gelu(self.fc1(x), approximate=False))


class EncoderBlock(nnx.Module):
    """One pre-norm Transformer encoder block."""

    def __init__(self, embed_dim: int, num_heads: int, mlp_dim: int, eps: float, *, rngs: nnx.Rngs) -> None:
        self.norm1 = LayerNorm(embed_dim, epsilon=eps, rngs=rngs)
        self.attn = SelfAttention(embed_dim, num_heads, rngs=rngs)
        self.norm2 = LayerNorm(embed_dim, epsilon=eps, rngs=rngs)
        self.mlp = FeedForward(embed_dim, mlp_dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class AttentionClassifier(nnx.Module):
    """Each image row is a token: embed + learned positions, one encoder block, final norm, mean, head."""

    def __init__(self, height: int, width: int, embed_dim: int, num_heads: int, mlp_dim: int, eps: float,
                 num_classes: int, *, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Linear(width, embed_dim, rngs=rngs)
        self.pos_embedding = nnx.Param(jnp.zeros((height, embed_dim), jnp.float32))
        self.block = EncoderBlock(embed_dim, num_heads, mlp_dim, eps, rngs=rngs)
        self.final_norm = LayerNorm(embed_dim, epsilon=eps, rngs=rngs)
        self.head = nnx.Linear(embed_dim, num_classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = self.embed(images) + self.pos_embedding[...]
        x = self.final_norm(self.block(x))
        return self.head(x.mean(axis=1))


# Flax's nnx.BatchNorm momentum is the weight of the old running average, the spec's meaning: unchanged.
# A function (not an inline number) so that the package's tests can plant torch's meaning (1 - m) here.
def batchnorm_momentum(momentum: float) -> float:
    return momentum


# Flax's padding="SAME" is lax.padtype_to_pads's, TensorFlow's: the spec's (rosetta_common.reference.same_padding).
def conv(in_channels: int, out_channels: int, kernel: int, stride: int, *, rngs: nnx.Rngs) -> nnx.Conv:
    """A bias-free convolution (a BatchNorm follows every one). Flax's "SAME" is TensorFlow's: at stride 2 the
    odd row and column of padding go at the bottom and right, as the spec says (torch's padding=1 would pad
    both sides, the tests plant it)."""
    return nnx.Conv(in_channels, out_channels, kernel_size=(kernel, kernel), strides=stride, padding="SAME",
                    use_bias=False, rngs=rngs)


# nnx.BatchNorm's defaults are momentum 0.99 and a one-pass "fast" variance. Its momentum means what the spec's does
# (the old average's weight: running = m * running + (1 - m) * batch), so the spec's number is passed unchanged
# (batchnorm_momentum; torch's argument would be 1 - m). Epsilon comes from the spec (Flax's default 1e-5 is the
# spec's default, not necessarily its value); use_fast_variance=False gives the two-pass biased variance, which both
# normalizes the batch and enters the running variance (the spec's convention: Flax, unlike torch, never averages
# the unbiased one). use_running_average=True: every model is in inference mode unless a training view is asked
# for (training_view).
def batchnorm(channels: int, momentum: float, epsilon: float, *, rngs: nnx.Rngs) -> nnx.BatchNorm:
    return nnx.BatchNorm(channels, use_running_average=True, momentum=batchnorm_momentum(momentum),
                         epsilon=epsilon, use_fast_variance=False, rngs=rngs)


class ConvBN(nnx.Module):
    """A convolution and its BatchNorm, under the canonical names `<prefix>.conv` and `<prefix>.bn`."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, momentum: float,
                 epsilon: float, *, rngs: nnx.Rngs) -> None:
        self.conv = conv(in_channels, out_channels, kernel, stride, rngs=rngs)
        self.bn = batchnorm(out_channels, momentum, epsilon, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(x))


class ResidualBlock(nnx.Module):
    """conv3x3 stride 2 + BN + ReLU, conv3x3 + BN; shortcut conv1x1 stride 2 + BN; add; ReLU."""

    def __init__(self, in_channels: int, filters: int, momentum: float, epsilon: float, *, rngs: nnx.Rngs) -> None:
        self.conv1 = conv(in_channels, filters, 3, 2, rngs=rngs)
        self.bn1 = batchnorm(filters, momentum, epsilon, rngs=rngs)
        self.conv2 = conv(filters, filters, 3, 1, rngs=rngs)
        self.bn2 = batchnorm(filters, momentum, epsilon, rngs=rngs)
        self.shortcut = ConvBN(in_channels, filters, 1, 2, momentum, epsilon, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return nnx.relu(y + self.shortcut(x))


class ResNet(nnx.Module):
    """Stem conv + BN + ReLU, one residual block, global average pool, dropout (training only), dense head."""

    def __init__(self, stem_filters: int, block_filters: int, dropout: float, momentum: float, epsilon: float,
                 num_classes: int, *, rngs: nnx.Rngs) -> None:
        self.stem = ConvBN(1, stem_filters, 3, 1, momentum, epsilon, rngs=rngs)
        self.block = ResidualBlock(stem_filters, block_filters, momentum, epsilon, rngs=rngs)
        # Flax's own layer, deterministic (identity) unless a caller switches the model to Flax's train mode.
        self.dropout = nnx.Dropout(dropout, deterministic=True)
        self.head = nnx.Linear(block_filters, num_classes, rngs=rngs)

    def __call__(self, images: jax.Array, dropout_mask: jax.Array | None = None) -> jax.Array:
        x = nnx.relu(self.stem(images[..., None]))
        pooled = self.block(x).mean(axis=(1, 2))
        # nnx.Dropout is the identity in inference mode. A training step multiplies by the shared mask instead
        # (rosetta_common.training.dropout_masks, already 0 or 1 / (1 - rate)) rather than letting nnx.Dropout
        # draw one: its mask comes from JAX's threefry key, which torch and TF cannot reproduce, so the three
        # frameworks would drop different units and their step losses could never agree.
        pooled = self.dropout(pooled) if dropout_mask is None else pooled * dropout_mask
        return self.head(pooled)


# Flax's nnx.GRUCell computes torch's formula except that its recurrent Linear has no bias (use_bias=False), so
# b_hr, b_hz and b_hn cannot be held; b_hr and b_hz could be folded into the input bias, b_hn cannot (r multiplies
# it). This subclass is the smallest honest fix.
class GRUCell(nnx.GRUCell):
    """nnx.GRUCell with a bias on its recurrent Linear (b_hr, b_hz, b_hn), so that it computes torch's formula
    n = tanh(x W_n + b_in + r * (h U_n + b_hn)) for any b_hn: Flax's own cell has no recurrent bias at all
    (its docstring's b_hn is never created). Only dense_h changes; __call__ is Flax's."""

    def __init__(self, in_features: int, hidden_features: int, *, rngs: nnx.Rngs) -> None:
        super().__init__(in_features, hidden_features, rngs=rngs)
        self.dense_h = nnx.Linear(hidden_features, 3 * hidden_features, use_bias=True, rngs=rngs)


# The RNNs get an explicit zero initial carry and rngs=False: nnx.RNN's default keeps an RNG stream (state that
# counts calls) only to feed the carry initialiser, which draws nothing for zeros.
def zeros_carry(images: jax.Array, hidden: int) -> jax.Array:
    return jnp.zeros((images.shape[0], hidden), images.dtype)


# nnx.OptimizedLSTMCell holds one (in, 4h) input kernel without bias and one (h, 4h) recurrent kernel with the one
# bias, gates split in the order i, f, g, o: the canonical layout exactly (weights.py only renames).
class LSTMClassifier(nnx.Module):
    """Each image row is a time step: nnx.RNN over nnx.OptimizedLSTMCell, its last hidden state, a head."""

    def __init__(self, width: int, hidden: int, num_classes: int, *, rngs: nnx.Rngs) -> None:
        self.hidden = hidden
        self.lstm = nnx.RNN(nnx.OptimizedLSTMCell(width, hidden, rngs=rngs), return_carry=True, rngs=False)
        self.head = nnx.Linear(hidden, num_classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        zeros = zeros_carry(images, self.hidden)
        (_, last_hidden), _ = self.lstm(images, initial_carry=(zeros, zeros))  # the carry is (c, h)
        return self.head(last_hidden)


class GRUClassifier(nnx.Module):
    """Each image row is a time step: nnx.RNN over GRUCell (torch's formula), its last hidden state, a head."""

    def __init__(self, width: int, hidden: int, num_classes: int, *, rngs: nnx.Rngs) -> None:
        self.hidden = hidden
        self.gru = nnx.RNN(GRUCell(width, hidden, rngs=rngs), return_carry=True, rngs=False)
        self.head = nnx.Linear(hidden, num_classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        last_hidden, _ = self.gru(images, initial_carry=zeros_carry(images, self.hidden))
        return self.head(last_hidden)


# The text model's masks, each its own module-level function so that a test can plant the mistakes the
# conformance suite names (the polarity inverted, padding pooled) in one place.
def padding_mask(tokens: jax.Array) -> jax.Array:
    """(B, T) bool, True where a position holds a real token (not PAD_ID)."""
    return tokens != PAD_ID


def attention_mask(real: jax.Array) -> jax.Array:
    """nnx.MultiHeadAttention's `mask` from padding_mask's (B, T): True = attend, the polarity of Flax's (and Keras')
    mask, the negation of torch's key_padding_mask. (B, 1, 1, T) broadcasts over heads and QUERIES: only padded
    keys are masked. nnx.make_attention_mask(real, real) would be (B, 1, T, T) with the padded query rows masked
    in full, and a softmax over no key at all (uniform or NaN) where the spec computes every query."""
    return real[:, None, None, :]


def masked_mean(x: jax.Array, real: jax.Array) -> jax.Array:
    """The mean of x (B, T, E) over the real positions of padding_mask's (B, T): padding is not pooled."""
    keep = real.astype(x.dtype)[..., None]
    return (x * keep).sum(axis=1) / keep.sum(axis=1)


class TextEncoderBlock(nnx.Module):
    """The pre-norm encoder block of the text model: Flax's own nnx.MultiHeadAttention (biases on all four
    projections, no dropout, no decoding cache) between LayerNorms, the MLP as the attention model's."""

    def __init__(self, embed_dim: int, num_heads: int, mlp_dim: int, eps: float, *, rngs: nnx.Rngs) -> None:
        self.norm1 = LayerNorm(embed_dim, epsilon=eps, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads, embed_dim, qkv_features=embed_dim, out_features=embed_dim,
                                           use_bias=True, decode=False, deterministic=True, rngs=rngs)
        self.norm2 = LayerNorm(embed_dim, epsilon=eps, rngs=rngs)
        self.mlp = FeedForward(embed_dim, mlp_dim, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array, sow_weights: bool = False) -> jax.Array:
        # sow_weights (the taps only) sows the softmax into nnx.Intermediate (nnx.capture reads it).
        x = x + self.attn(self.norm1(x), mask=mask, sow_weights=sow_weights)
        return x + self.mlp(self.norm2(x))


class TextTransformer(nnx.Module):
    """Token ids (B, T), 1 <= T <= max_length, PAD_ID padding: nnx.Embed plus learned positions (rows 0..T-1), one
    encoder block whose attention skips padded keys, a final LayerNorm, the mean over real tokens, a dense head.
    nnx.Embed has no padding option (torch's padding_idx): the canonical embedding's zero row 0 is loaded like
    any other row, and padding is handled by the masks alone."""

    def __init__(self, vocab_size: int, max_length: int, embed_dim: int, num_heads: int, mlp_dim: int, eps: float,
                 num_classes: int, *, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocab_size, embed_dim, rngs=rngs)
        self.pos_embedding = nnx.Param(jnp.zeros((max_length, embed_dim), jnp.float32))
        self.block = TextEncoderBlock(embed_dim, num_heads, mlp_dim, eps, rngs=rngs)
        self.final_norm = LayerNorm(embed_dim, epsilon=eps, rngs=rngs)
        self.head = nnx.Linear(embed_dim, num_classes, rngs=rngs)
        # The mask and pooling functions as static attributes (as nnx.MultiHeadAttention keeps its attention_fn):
        # part of the graphdef, so a model built while one is planted differently compiles anew instead of
        # reusing jit's cached program of the right one.
        self.padding_mask, self.attention_mask, self.masked_mean = padding_mask, attention_mask, masked_mean

    def __call__(self, tokens: jax.Array, sow_weights: bool = False) -> jax.Array:
        real = self.padding_mask(tokens)
        x = self.embed(tokens) + self.pos_embedding[: tokens.shape[1]]
        x = self.final_norm(self.block(x, self.attention_mask(real), sow_weights))
        return self.head(self.masked_mean(x, real))


Model = MLP | CNN | AttentionClassifier | ResNet | LSTMClassifier | GRUClassifier | TextTransformer


def create(config: ModelConfig) -> Model:
    """An abstract model (shapes only, no random init; build() fills in canonical weights), carrying its
    ModelConfig as a static attribute: the pydantic object is frozen and hashable, so NNX keeps it in the
    graphdef (static data, part of jit's cache key) rather than as state."""
    a = config.settings  # that architecture's section; ModelConfig validated that it is the right one

    def make() -> Model:
        rngs = nnx.Rngs(0)  # never used for real values: eval_shape only traces the initialisers
        model = (TextTransformer(config.vocab_size, config.max_length, a.embed_dim, a.num_heads, a.mlp_dim,
                                 a.layer_norm_eps, config.num_classes, rngs=rngs)
                 if config.arch == "text_transformer" else image_model(config, rngs))
        model.config = config
        return model

    return nnx.eval_shape(make)


def image_model(config: ModelConfig, rngs: nnx.Rngs) -> Model:
    """The module of an image architecture (create's, inside its eval_shape)."""
    height, width = config.image_shape
    a = config.settings
    if config.arch == "mlp":
        return MLP(height, width, a.hidden, config.num_classes, rngs=rngs)
    if config.arch == "cnn":
        return CNN(height, width, a.conv1_filters, a.conv2_filters, config.num_classes, rngs=rngs)
    if config.arch == "attention":
        return AttentionClassifier(height, width, a.embed_dim, a.num_heads, a.mlp_dim, a.layer_norm_eps,
                                   config.num_classes, rngs=rngs)
    if config.arch == "resnet":
        return ResNet(a.stem_filters, a.block_filters, a.dropout, a.batchnorm_momentum, a.batchnorm_epsilon,
                      config.num_classes, rngs=rngs)
    if config.arch == "lstm":
        return LSTMClassifier(width, a.hidden, config.num_classes, rngs=rngs)
    if config.arch == "gru":
        return GRUClassifier(width, a.hidden, config.num_classes, rngs=rngs)
    raise not_built(config.arch, "rosetta_jax")


def build(config: ModelConfig, weights: Weights) -> Model:
    """The NNX model of `config` holding copies of these canonical weights (WeightsError if they do not fit)."""
    model = create(config)
    from_canonical(model, weights)
    return model


def model_config(model: Model) -> ModelConfig:
    """The validated config `model` was built from (what export_native writes to config.json)."""
    return model.config


@partial(jax.jit, static_argnums=0)
def _forward(graphdef: nnx.GraphDef[Any], state: nnx.State, images: jax.Array) -> jax.Array:
    return nnx.merge(graphdef, state)(images)


def jax_ids(tokens: np.ndarray) -> np.ndarray:
    """Checked int64 token ids as int32, JAX's integer without x64 (which the package leaves off: it would make
    every default float64): exact, ids are below vocab_size."""
    return tokens.astype(np.int32)


def model_input(config: ModelConfig, x: np.ndarray, where: str) -> jax.Array:
    """`x` checked against what the model reads (rosetta_common.inputs: one-line InputError), as a JAX array:
    images float32, token ids int32 (jax_ids)."""
    x = config.input.check(x, where)
    return jnp.asarray(jax_ids(x)) if config.input.kind == "tokens" else jnp.asarray(x, jnp.float32)


def predict(model: Model, images: np.ndarray) -> np.ndarray:
    """Logits as float32 numpy for images or token ids (checked first); compiles once per new input shape (the
    graphdef is the static cache key)."""
    x = model_input(model.config, images, "predict")
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, state, x), dtype=np.float32)


def training_view(model: Model) -> Model:
    """The model in training mode, sharing its variables: BatchNorm on batch statistics (updating its running
    ones). nnx.Dropout stays deterministic: a training step applies the shared mask itself (ResNet.__call__),
    and no mask means no dropout, as the contract says. `model` itself stays in inference mode."""
    return nnx.view(model, use_running_average=False, closed_form_grad=True, raise_if_not_found=False)


def check_dropout_mask(config: ModelConfig, dropout_mask: np.ndarray | None, batch: int) -> None:
    """ValueError (one line) for a mask the model cannot use."""
    if dropout_mask is None:
        return
    features = dropout_features(config)
    if features is None:
        raise ValueError(f"dropout_mask of shape {np.shape(dropout_mask)}: the {config.arch} model has no "
                         "dropout; allowed: None")
    if np.shape(dropout_mask) != (batch, features):
        raise ValueError(f"dropout_mask of shape {np.shape(dropout_mask)}: must be (batch, features) = "
                         f"{(batch, features)}")


def forward_logits(model: Model, images: jax.Array, dropout_mask: jax.Array | None) -> jax.Array:
    """The model's forward, with the step's dropout mask for a model that has dropout (the ResNet)."""
    return model(images) if dropout_mask is None else model(images, dropout_mask)


@partial(jax.jit, static_argnums=0)
def _forward_train(graphdef: nnx.GraphDef[Any], state: nnx.State, images: jax.Array,
                   dropout_mask: jax.Array | None) -> tuple[jax.Array, nnx.State]:
    model = nnx.merge(graphdef, state)
    logits = forward_logits(model, images, dropout_mask)
    return logits, nnx.state(model, nnx.BatchStat)


def forward_train(model: Model, images: np.ndarray, dropout_mask: np.ndarray | None) -> np.ndarray:
    """One training-mode forward as a training step runs it, without a gradient: BatchNorm normalizes with the
    batch's statistics and its running statistics move in place; the dropout mask (or none) multiplies the
    pooled features. The model stays in inference mode (only a view of it trains)."""
    x = model_input(model.config, images, "forward_train")
    check_dropout_mask(model.config, dropout_mask, len(images))
    graphdef, state = nnx.split(training_view(model))
    mask = None if dropout_mask is None else jnp.asarray(dropout_mask, jnp.float32)
    logits, statistics = _forward_train(graphdef, state, x, mask)
    nnx.update(model, statistics)
    return np.asarray(logits, dtype=np.float32)
