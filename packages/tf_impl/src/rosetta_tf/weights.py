"""Canonical weights (rosetta-canonical-v1, see rosetta_common.weights) <-> Keras variables, in one place: the
contract's from_canonical() and to_canonical().

Keras already keeps most canonical layouts (dense kernels (in, out), conv kernels HWIO, NHWC flatten), so most of
the mapping is by name only, values copied unchanged; what differs is a few names (LayerNorm's, BatchNorm's), the
GRU's gate order and its two biases in one variable, and the text model's per-head attention kernels. Every such
change is made and undone in this module, exactly, so that models.py can name its layers after the canonical names
and everything outside the package sees canonical weights only. The model's ModelConfig, which models.build attaches
(`CONFIG_ATTR`), says which mapping applies.

What each framework keeps differently, and how its package maps it: docs/conventions.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import keras
import numpy as np

from rosetta_common.spec import ModelConfig
from rosetta_common.weights import Weights, canonical_shapes, check_weights

CONFIG_ATTR = "rosetta_config"  # where models.build records the model's ModelConfig

# Keras gate block j holds canonical gate block GATES[j] (canonical LSTM i, f, g, o; GRU r, z, n).
# LSTM: Keras' `kernel` (in, 4h), `recurrent_kernel` (h, 4h) and single `bias` (4h) have the canonical gate order and
# the canonical single bias (torch's two biases are summed in canonical form): the identity, stated so that a
# permutation cannot creep in unnoticed.
LSTM_GATES = (0, 1, 2, 3)  # Keras i, f, c, o: the same order
# GRU: Keras' gate blocks are z, r, h, so kernel, recurrent kernel and both biases are permuted. With
# reset_after=True (torch's formula) Keras keeps the two biases in one (2, 3h) variable: row 0 is the input bias,
# row 1 the recurrent bias, the one inside r * (h U + b).
GRU_GATES = (1, 0, 2)  # Keras z, r, h = canonical z, r, n
GRU_BIAS_ROWS = {"input_bias": 0, "recurrent_bias": 1}  # rows of Keras' (2, 3h) GRU bias (reset_after=True)
# BatchNorm's statistics are state, mapped by name as its scale and bias are. The rest is set in models.py, where the
# layers are made: Keras' `momentum` means what the spec's does (the old running value's weight: running =
# m * running + (1 - m) * batch), so models.batchnorm passes it unchanged (torch's would be 1 - m); Keras averages
# the biased batch variance (tf.nn.moments), the spec's convention, so nothing is corrected (torch needs it); Keras'
# default epsilon is 1e-3, so the spec's (1e-5 by default) is always passed. Padding: Keras' Conv2D(padding="same")
# is TensorFlow's, the canonical one (for stride 2 the odd extra row/column at the bottom/right), so kernels map
# unchanged and nothing pads by hand (models.conv). Dropout: no weights (its seed-generator state is a Keras
# variable but no weight).
BATCHNORM = {"scale": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
LAYERNORM = {"scale": "gamma", "bias": "beta"}
# Canonical projection -> MultiHeadAttention's EinsumDense sublayer.
ATTENTION_PROJECTIONS = {"query": "query_dense", "key": "key_dense", "value": "value_dense", "out": "output_dense"}
# text_transformer: Keras' Embedding keeps `embeddings` (vocab, embed), the canonical `embed.embedding` (row PAD_ID
# included: Keras has no padding row, the canonical zero is loaded like any value). MultiHeadAttention keeps
# per-head kernels: query/key/value `kernel` (embed, heads, head_dim) and `bias` (heads, head_dim), the output
# projection `kernel` (heads, head_dim, embed) and `bias` (embed,). Canonical head h owns the columns (rows, for the
# output kernel) h*head_dim:(h+1)*head_dim, so the values map unchanged, reshaped:
# how a canonical (in, out) projection splits into Keras' heads: "C", a row-major reshape, puts canonical column
# h*head_dim + j at [h, j] (head-major: head h owns a contiguous block of columns, the canonical convention).
HEAD_SPLIT = "C"


@dataclass(frozen=True)
class Binding:
    """Where one canonical tensor lives in a Keras model: a variable, or one row of it (the GRU's two biases
    share one variable), with its gate blocks in Keras' order (`gates`: Keras block j is canonical block
    gates[j]; None: no gate blocks)."""

    variable: keras.Variable
    row: int | None = None
    gates: tuple[int, ...] | None = None
    canonical_shape: tuple[int, ...] | None = None  # a per-head attention tensor: Keras holds it reshaped

    def to_keras(self, value: np.ndarray) -> np.ndarray:
        if self.canonical_shape is not None:
            return np.reshape(value, tuple(self.variable.shape), order=HEAD_SPLIT)
        if self.gates is None:
            return value
        blocks = np.split(value, len(self.gates), axis=-1)
        return np.concatenate([blocks[g] for g in self.gates], axis=-1)

    def from_keras(self, value: np.ndarray) -> np.ndarray:
        if self.canonical_shape is not None:
            return np.reshape(value, self.canonical_shape, order=HEAD_SPLIT)
        if self.gates is None:
            return value
        blocks = np.split(value, len(self.gates), axis=-1)
        canonical = [blocks[0]] * len(blocks)
        for keras_block, gate in enumerate(self.gates):
            canonical[gate] = blocks[keras_block]
        return np.concatenate(canonical, axis=-1)


def _config(model: keras.Model) -> ModelConfig:
    """The ModelConfig models.build attached (read here, not imported from models.py, so that models.py can
    import this module at the top without an import cycle)."""
    config = getattr(model, CONFIG_ATTR, None)
    if not isinstance(config, ModelConfig):
        raise ValueError(f"Keras model {model.name!r} has no Rosetta ModelConfig: make it with rosetta_tf.build")
    return config


def _layer(model: keras.Model, prefix: str) -> keras.layers.Layer:
    return model.get_layer(prefix.replace(".", "_"))  # canonical "block.conv1" is the layer "block_conv1"


def _attention(model: keras.Model) -> dict[str, Binding]:
    block = model.get_layer("block")
    attn = block.attn
    found = {
        "pos_embedding": model.get_layer("pos_embedding").pos_embedding,
        "block.norm1.scale": block.norm1.gamma,
        "block.norm1.bias": block.norm1.beta,
        "block.attn.query.kernel": attn.query.kernel,
        "block.attn.key.kernel": attn.key.kernel,
        "block.attn.value.kernel": attn.value.kernel,
        "block.attn.out.kernel": attn.out.kernel,
        "block.attn.out.bias": attn.out.bias,
        "block.norm2.scale": block.norm2.gamma,
        "block.norm2.bias": block.norm2.beta,
        "block.mlp.fc1.kernel": block.fc1.kernel,
        "block.mlp.fc1.bias": block.fc1.bias,
        "block.mlp.fc2.kernel": block.fc2.kernel,
        "block.mlp.fc2.bias": block.fc2.bias,
    }
    final = model.get_layer("final_norm")
    found["final_norm.scale"], found["final_norm.bias"] = final.gamma, final.beta
    return {name: Binding(variable) for name, variable in found.items()}


def _text_transformer(model: keras.Model, shapes: dict[str, tuple[int, ...]]) -> dict[str, Binding]:
    found = {"pos_embedding": Binding(model.get_layer("pos_embedding").pos_embedding)}
    attn = model.get_layer("block_attn")
    for name, shape in shapes.items():
        prefix, _, leaf = name.rpartition(".")
        if name in found:
            continue
        if prefix.startswith("block.attn."):  # block.attn.<projection>.<kernel|bias>: an EinsumDense of attn
            variable = getattr(getattr(attn, ATTENTION_PROJECTIONS[prefix.rpartition(".")[2]]), leaf)
            # Every per-head tensor is reshaped; the out bias (embed,) is the one Keras keeps as it is.
            found[name] = Binding(variable, canonical_shape=shape if tuple(variable.shape) != shape else None)
            continue
        layer = _layer(model, prefix)
        if isinstance(layer, keras.layers.LayerNormalization):
            found[name] = Binding(getattr(layer, LAYERNORM[leaf]))
        elif isinstance(layer, keras.layers.Embedding):
            found[name] = Binding(layer.embeddings)
        else:  # Dense: kernel and bias by name
            found[name] = Binding(getattr(layer, leaf))
    return found


def bindings(model: keras.Model) -> dict[str, Binding]:
    """Canonical name -> where it lives in the model, in canonical order (rosetta_common.weights.canonical_shapes)."""
    config = _config(model)
    if config.arch == "text_transformer":
        shapes = canonical_shapes(config)
        found = _text_transformer(model, shapes)
        return {name: found[name] for name in shapes}
    found: dict[str, Binding] = {}
    for name in canonical_shapes(config):
        prefix, _, leaf = name.rpartition(".")
        if config.arch == "attention" and prefix not in ("embed", "head"):
            continue  # the nested block, below
        layer = _layer(model, prefix)
        if isinstance(layer, keras.layers.BatchNormalization):
            found[name] = Binding(getattr(layer, BATCHNORM[leaf]))
        elif isinstance(layer, keras.layers.LSTM):  # kernel, recurrent_kernel, bias: one variable each
            found[name] = Binding(getattr(layer.cell, leaf), gates=LSTM_GATES)
        elif isinstance(layer, keras.layers.GRU) and leaf in GRU_BIAS_ROWS:
            found[name] = Binding(layer.cell.bias, row=GRU_BIAS_ROWS[leaf], gates=GRU_GATES)
        elif isinstance(layer, keras.layers.GRU):
            found[name] = Binding(getattr(layer.cell, leaf), gates=GRU_GATES)
        else:  # Dense and Conv2D: kernel and bias by name
            found[name] = Binding(getattr(layer, leaf))
    if config.arch == "attention":
        found.update(_attention(model))
    # Ordered by the canonical list; a KeyError here would be a canonical name this mapping forgot.
    return {name: found[name] for name in canonical_shapes(config)}


def from_canonical(model: keras.Model, weights: Mapping[str, np.ndarray]) -> None:
    """Assign canonical weights to the model's variables (copies); WeightsError unless they fit its config."""
    config = _config(model)
    check_weights(weights, config, source=f"{config.arch} weights")
    values: dict[int, tuple[keras.Variable, np.ndarray]] = {}  # one assignment per variable, rows gathered
    for name, binding in bindings(model).items():
        variable = binding.variable
        value = binding.to_keras(np.asarray(weights[name], dtype=np.float32))
        if binding.row is None:
            values[id(variable)] = (variable, value.copy())
        else:
            whole = values.setdefault(id(variable), (variable, np.array(variable.numpy(), np.float32)))[1]
            whole[binding.row] = value
    for variable, value in values.values():
        if tuple(value.shape) != tuple(variable.shape):  # a mapping bug, not bad input (check_weights ran)
            raise ValueError(f"{variable.path}: mapped shape {value.shape}, Keras holds {tuple(variable.shape)}")
        variable.assign(value)


def to_canonical(model: keras.Model) -> Weights:
    """The model's weights as float32 numpy copies, in canonical names, order and layout."""
    out: Weights = {}
    for name, binding in bindings(model).items():
        value = np.array(binding.variable.numpy(), dtype=np.float32)
        if binding.row is not None:
            value = value[binding.row]
        out[name] = np.ascontiguousarray(binding.from_keras(value))
    return out
