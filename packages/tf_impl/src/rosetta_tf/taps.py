"""The contract's forward_with_taps: every tap of rosetta_common.taps, read from the model's own layers with
Keras' own mechanism, a functional model over the layers' outputs, converted to the canonical layout.

A tap points at the layer where a porting mistake enters only if it is what the model itself computes: so every
tap is read from the model's own graph (a keras.Model over its layers' outputs and inputs), and what that graph
does not hold (a fused activation's pre-activation, the attention block's inner values, the attention layer's
weights, the recurrent states per step) comes from the model's own layers and weights, called by Keras. Nothing in
the model changes: the reading model shares the layers and variables, so model.keras, the SavedModel and
model.onnx are what they were. Where each tap is found: SOURCES.

How the taps are compared, and what a failing check does with them: docs/judge.md ("Per-layer taps").
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from rosetta_common.registry import entry
from rosetta_common.spec import ModelConfig
from rosetta_common.taps import taps
from rosetta_tf import models
from rosetta_tf.models import model_config

# Tap -> where the Keras model holds it: (layer name, "output" | "input"); "pre": the layer's output without its
# fused activation; "block": inside the attention block (the block's sublayers, applied to its input);
# "stepped": the recurrent layer's cell, stepped; "scores": the attention layer's weights, asked of it (_scores).
# A keras.Model(model.inputs, [layer outputs and inputs]) over the model's own graph nodes reads every tap that is a
# layer's output or input: all of the ResNet's (its ReLUs are layers), the CNN's pool and post-ReLU convs, the
# attention model's embedding, block, final norm and mean, and every tap of the text model (Keras' own layers at the
# top level of its graph; its pooled features are the MaskedMean layer's) but its attention weights. Keras' NHWC is
# the canonical layout already.
# The inputs of the text model's attention layer, read for "scores".
_ATTENTION_INPUTS = (("block_norm1", "output"), ("attention_mask", "output"))
_RESNET = ["stem.conv", "stem.bn", "stem.relu", "block.shortcut.conv", "block.shortcut.bn", "block.conv1",
           "block.bn1", "block.relu1", "block.conv2", "block.bn2"]
SOURCES: dict[str, dict[str, tuple[str, str]]] = {
    "mlp": {"hidden": ("hidden", "pre"), "hidden.relu": ("hidden", "output"), "logits": ("head", "output")},
    "cnn": {"conv1": ("conv1", "pre"), "conv1.relu": ("conv1", "output"), "pool": ("pool", "output"),
            "conv2": ("conv2", "pre"), "conv2.relu": ("conv2", "output"), "logits": ("head", "output")},
    "attention": {
        "embed": ("block", "input"),
        **{name: ("block", "block") for name in (
            "block.norm1", "block.attn.query", "block.attn.key", "block.attn.value", "block.attn.weights",
            "block.attn.out", "block.norm2", "block.mlp.fc1", "block.mlp.gelu", "block.mlp.fc2")},
        "block": ("block", "output"), "final_norm": ("final_norm", "output"), "pool": ("mean_tokens", "output"),
        "logits": ("head", "output"),
    },
    "resnet": {**{name: (name.replace(".", "_"), "output") for name in _RESNET},
               "block": ("block_relu", "output"), "pool": (models.POOLED, "output"), "logits": ("head", "output")},
    "text_transformer": {
        "embed": ("pos_embedding", "output"), "block.norm1": ("block_norm1", "output"),
        "block.attn.weights": ("block_attn", "scores"), "block.attn.out": ("block_attn", "output"),
        "block.norm2": ("block_norm2", "output"), "block.mlp.fc1": ("block_mlp_fc1", "output"),
        "block.mlp.gelu": ("block_mlp_gelu", "output"), "block.mlp.fc2": ("block_mlp_fc2", "output"),
        "block": ("block_mlp_residual", "output"), "final_norm": ("final_norm", "output"),
        "pool": (models.TEXT_POOL, "output"), "logits": ("head", "output"),
    },
    "lstm": {"lstm.cell": ("lstm", "stepped"), "lstm.hidden": ("lstm", "stepped"), "logits": ("head", "output")},
    "gru": {"gru.hidden": ("gru", "stepped"), "logits": ("head", "output")},
}


def _without_activation(layer: layers.Layer) -> layers.Layer:
    """The same layer, same weights, with no activation: the pre-activation of a fused Dense / Conv2D. A layer
    with a fused activation (activation="relu": the MLP's hidden layer, the CNN's convs) never holds its
    pre-activation as a tensor; this twin, rebuilt from the layer's own config and applied to the layer's own
    input, computes it with Keras' call and Keras' op."""
    twin = type(layer).from_config({**layer.get_config(), "activation": None})
    twin.build(layer.input.shape)
    twin.set_weights(layer.get_weights())
    return twin


def _inside_block(block: layers.Layer, x: Any) -> dict[str, Any]:
    """The attention block's inner taps: its own sublayers applied in EncoderBlock.call's order. The block is one
    custom layer whose sublayers are called inside its `call`, so its inner taps are no node of the functional
    graph; the attention weights are SelfAttention.attention_weights of the split q and k, the method its call uses
    (a wrong scale shows there). A mistake in EncoderBlock.call's or SelfAttention.call's own glue shows at `block`
    or `block.attn.out`."""
    attn = block.attn
    t: dict[str, Any] = {"block.norm1": block.norm1(x)}
    for p in ("query", "key", "value"):
        t[f"block.attn.{p}"] = attn._split(getattr(attn, p)(t["block.norm1"]))
    t["block.attn.weights"] = attn.attention_weights(t["block.attn.query"], t["block.attn.key"])
    t["block.attn.out"] = attn(t["block.norm1"])
    t["block.norm2"] = block.norm2(x + t["block.attn.out"])
    t["block.mlp.fc1"] = block.fc1(t["block.norm2"])
    t["block.mlp.gelu"] = models.gelu_exact(t["block.mlp.fc1"])  # looked up now: the function call uses
    t["block.mlp.fc2"] = block.fc2(t["block.mlp.gelu"])
    return t


def _scores(layer: layers.MultiHeadAttention, read: dict[tuple[str, str], Any]) -> Any:
    """The attention weights (B, heads, T, T) of Keras' MultiHeadAttention on the inputs the model gave it (the
    block_norm1 and attention_mask outputs): the layer returns them only when asked (return_attention_scores=True).
    Asked, it takes its einsum path instead of the fused dot_product_attention predict runs: the same weights to
    float32 rounding; a wrong mask shows in both, and in block.attn.out."""
    n, mask = (read[node] for node in _ATTENTION_INPUTS)
    _, weights = layer(n, n, attention_mask=mask, return_attention_scores=True, training=False)
    return weights


def _stepped(layer: layers.Layer, x: Any) -> dict[str, Any]:
    """The recurrent layer's hidden (and LSTM cell) state after every step, (B, T, hidden), from its own cell
    (layer.cell) stepped over the rows: Keras' LSTM and GRU return the last step only (return_sequences=False, kept
    so that the exports are unchanged)."""
    zeros = tf.zeros((x.shape[0], layer.units), x.dtype)
    states = [zeros, zeros] if isinstance(layer, layers.LSTM) else [zeros]
    hidden, cells = [], []
    for t in range(x.shape[1]):
        h, states = layer.cell(x[:, t], states, training=False)
        hidden.append(h)
        cells.append(states[-1])
    out = {f"{layer.name}.hidden": tf.stack(hidden, axis=1)}
    if isinstance(layer, layers.LSTM):  # the LSTM cell's states are [h, c]
        out["lstm.cell"] = tf.stack(cells, axis=1)
    return out


def forward_with_taps(model: keras.Model, images: np.ndarray) -> dict[str, np.ndarray]:
    """Every tap of rosetta_common.taps in the canonical names, order, shapes and layouts, float32, from the
    model's layers in inference mode (training=False; its `logits` are what predict returns). `images`: what
    the model reads, images or token ids, checked as predict checks them."""
    config: ModelConfig = model_config(model)
    sources = SOURCES[config.arch]
    x = models.model_input(config, images, "forward_with_taps")
    wanted = {(name, "input" if kind in ("pre", "block") else kind) for name, kind in sources.values()
              if kind not in ("stepped", "scores")}
    if any(kind == "scores" for _, kind in sources.values()):
        wanted.update(_ATTENTION_INPUTS)
    nodes = sorted(wanted)
    reader = keras.Model(model.inputs, [getattr(model.get_layer(name), kind) for name, kind in nodes])
    values = reader(x, training=False)
    values = values if isinstance(values, list | tuple) else [values]  # a one-output model returns a tensor
    read = dict(zip(nodes, values, strict=True))
    found: dict[str, Any] = {}
    if config.arch == "attention":
        found.update(_inside_block(model.get_layer("block"), read[("block", "input")]))
    if entry(config.arch).family == "recurrent":
        found.update(_stepped(model.get_layer(config.arch), x))
    found.update({tap: _scores(model.get_layer(name), read) for tap, (name, kind) in sources.items()
                  if kind == "scores"})
    length = int(x.shape[1]) if config.input.kind == "tokens" else None
    out = {}
    for tap in taps(config, int(x.shape[0]), length):
        name, kind = sources[tap.name]
        if tap.name in found:
            value = found[tap.name]
        elif kind == "pre":
            value = _without_activation(model.get_layer(name))(read[(name, "input")])
        else:
            value = read[(name, kind)]
        out[tap.name] = np.asarray(value, np.float32)
    return out
