"""The three architectures as Keras 3 functional models (see rosetta_common.reference for their meaning), and
the contract's build(), predict() and model_config().

Every layer is named after its canonical parameter prefix ("hidden", "conv1", "block", ...), so
weights.py maps names one to one. The attention block is written with keras.ops (not
keras.layers.MultiHeadAttention, whose per-head kernels and all-or-nothing bias do not map one to one).
Each model carries the validated ModelConfig it was built from (`model_config`): Keras' own model config
knows layers, not the spec, so export.py stores it beside model.keras and puts it back on reload.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from rosetta_common.onnx_conventions import INPUT_NAME
from rosetta_common.spec import AttentionSpec, CNNSpec, MLPSpec, ModelConfig
from rosetta_common.weights import Weights
from rosetta_tf import weights as _weights

PACKAGE = "rosetta_tf"  # registration namespace: load_model(safe_mode=True) finds our layers by it


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

    def call(self, x: Any) -> Any:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        # Scale after the matmul, as the reference does (scaling q first rounds differently).
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / math.sqrt(self.head_dim)
        attended = ops.matmul(ops.softmax(scores, axis=-1), v)
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


@keras.saving.register_keras_serializable(package=PACKAGE)
class AddChannel(layers.Layer):
    """(B, H, W) -> (B, H, W, 1); a named layer instead of a Lambda, which safe_mode refuses to load."""

    def call(self, x: Any) -> Any:
        return ops.expand_dims(x, -1)


def mlp(settings: MLPSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    inputs = keras.Input(shape=image_shape, name="images")
    x = layers.Flatten(name="flatten")(inputs)  # row-major, as the reference's reshape
    x = layers.Dense(settings.hidden, activation="relu", name="hidden")(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="mlp")


def cnn(settings: CNNSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    inputs = keras.Input(shape=image_shape, name="images")
    x = AddChannel(name="add_channel")(inputs)
    x = layers.Conv2D(settings.conv1_filters, 3, padding="same", activation="relu", name="conv1")(x)
    x = layers.MaxPooling2D(pool_size=2, strides=2, name="pool")(x)  # "valid": floor, as the reference
    x = layers.Conv2D(settings.conv2_filters, 3, padding="same", activation="relu", name="conv2")(x)
    x = layers.Flatten(name="flatten")(x)  # NHWC -> (h, w, c) order, the canonical one
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="cnn")


def attention(settings: AttentionSpec, image_shape: tuple[int, int], num_classes: int) -> keras.Model:
    a = settings
    inputs = keras.Input(shape=image_shape, name="images")  # each image row is one token
    x = layers.Dense(a.embed_dim, name="embed")(inputs)
    x = PositionEmbedding(name="pos_embedding")(x)
    x = EncoderBlock(a.embed_dim, a.num_heads, a.mlp_dim, a.layer_norm_eps, name="block")(x)
    x = layers.LayerNormalization(epsilon=a.layer_norm_eps, name="final_norm")(x)
    x = layers.GlobalAveragePooling1D(name="mean_tokens")(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="head")(x), name="attention")


BUILDERS = {"mlp": mlp, "cnn": cnn, "attention": attention}
CONFIG_ATTR = _weights.CONFIG_ATTR  # the attribute a model keeps its ModelConfig under


def attach_config(model: keras.Model, config: ModelConfig) -> keras.Model:
    """Record `config` on `model` (also used by export.load_native on a reloaded model.keras)."""
    setattr(model, CONFIG_ATTR, config)
    return model


def create(config: ModelConfig) -> keras.Model:
    """The Keras model of `config`, with Keras' initial weights (build() replaces them)."""
    builder = BUILDERS[config.arch]  # ModelConfig admits only these architectures
    return attach_config(builder(config.settings, config.image_shape, config.num_classes), config)


def build(config: ModelConfig, weights: Weights) -> keras.Model:
    """The Keras model of `config` holding copies of these canonical weights (WeightsError if they do not fit).

    Keras has no persistent train/eval mode: predict() and the exports call the model with training=False,
    and only fit() runs it with training=True.
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


# One traced forward per model. A graph (not an eager call), so predict gets the same graph rewrites as
# the SavedModel's serve endpoint; a dynamic-batch signature, so no batch size retraces (Keras'
# predict_on_batch retraces for each new size, and model.predict splits into batches of 32).
_FORWARDS: weakref.WeakKeyDictionary[keras.Model, Any] = weakref.WeakKeyDictionary()


def _forward(model: keras.Model) -> Any:
    if model not in _FORWARDS:
        _FORWARDS[model] = tf.function(lambda images: model(images, training=False),
                                       input_signature=[image_spec(model)])
    return _FORWARDS[model]


def predict(model: keras.Model, images: np.ndarray) -> np.ndarray:
    """Logits (batch, classes) float32 for float32 images (batch, height, width)."""
    return np.asarray(_forward(model)(tf.convert_to_tensor(np.asarray(images, np.float32))), dtype=np.float32)
