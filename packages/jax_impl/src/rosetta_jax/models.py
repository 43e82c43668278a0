"""The three architectures as Flax NNX modules, written the way Flax's own NNX examples write models, and
the contract's build(), predict() and model_config().

NNX (not Linen) because it is Flax 0.12's recommended API and because its attribute paths *are* the
canonical names: `self.block.attn.query.kernel` is "block.attn.query.kernel", Flax keeps dense kernels
(in, out) and conv kernels HWIO, and it flattens NHWC, so weights.py maps names one to one with no
transposes (rosetta_common.weights' docstring chose that convention).

Defaults that differ from the spec and are overridden here on purpose:
- nnx.LayerNorm: epsilon 1e-6 and a one-pass "fast" variance by default; the spec is eps 1e-5 and the
  biased two-pass variance (torch's), so epsilon comes from the spec and use_fast_variance=False.
- nnx.gelu: the tanh approximation by default; the spec is exact (erf) GELU, so approximate=False.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rosetta_common.spec import ModelConfig
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
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        weights = jax.nn.softmax(scores, axis=-1)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, tokens, embed)
        return self.out(attended)


class MLPBlock(nnx.Module):
    def __init__(self, embed_dim: int, mlp_dim: int, *, rngs: nnx.Rngs) -> None:
        self.fc1 = nnx.Linear(embed_dim, mlp_dim, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_dim, embed_dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(nnx.gelu(self.fc1(x), approximate=False))


class EncoderBlock(nnx.Module):
    """One pre-norm Transformer encoder block."""

    def __init__(self, embed_dim: int, num_heads: int, mlp_dim: int, eps: float, *, rngs: nnx.Rngs) -> None:
        self.norm1 = nnx.LayerNorm(embed_dim, epsilon=eps, use_fast_variance=False, rngs=rngs)
        self.attn = SelfAttention(embed_dim, num_heads, rngs=rngs)
        self.norm2 = nnx.LayerNorm(embed_dim, epsilon=eps, use_fast_variance=False, rngs=rngs)
        self.mlp = MLPBlock(embed_dim, mlp_dim, rngs=rngs)

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
        self.final_norm = nnx.LayerNorm(embed_dim, epsilon=eps, use_fast_variance=False, rngs=rngs)
        self.head = nnx.Linear(embed_dim, num_classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = self.embed(images) + self.pos_embedding[...]
        x = self.final_norm(self.block(x))
        return self.head(x.mean(axis=1))


Model = MLP | CNN | AttentionClassifier


def create(config: ModelConfig) -> Model:
    """An abstract model (shapes only, no random init; build() fills in canonical weights), carrying its
    ModelConfig as a static attribute: the pydantic object is frozen and hashable, so NNX keeps it in the
    graphdef (static data, part of jit's cache key) rather than as state."""
    height, width = config.image_shape
    a = config.settings  # that architecture's section; ModelConfig validated that it is the right one

    def make() -> Model:
        rngs = nnx.Rngs(0)  # never used for real values: eval_shape only traces the initialisers
        model: Model
        if config.arch == "mlp":
            model = MLP(height, width, a.hidden, config.num_classes, rngs=rngs)
        elif config.arch == "cnn":
            model = CNN(height, width, a.conv1_filters, a.conv2_filters, config.num_classes, rngs=rngs)
        else:  # "attention": ModelConfig admits no other architecture
            model = AttentionClassifier(height, width, a.embed_dim, a.num_heads, a.mlp_dim, a.layer_norm_eps,
                                        config.num_classes, rngs=rngs)
        model.config = config
        return model

    return nnx.eval_shape(make)


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


def predict(model: Model, images: np.ndarray) -> np.ndarray:
    """Logits as float32 numpy; compiles once per new batch size (the graphdef is the static cache key)."""
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, state, jnp.asarray(images, jnp.float32)), dtype=np.float32)
