"""Canonical <-> Keras weights, in one place: the contract's from_canonical() and to_canonical().

Keras already keeps the canonical layouts (dense kernels (in, out), conv kernels HWIO, NHWC flatten),
so the mapping is by name only: values are copied unchanged. LayerNorm's `scale`/`bias` are Keras'
`gamma`/`beta`.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np

from rosetta_common.spec import ModelConfig
from rosetta_common.weights import Weights, canonical_shapes, check_weights

CONFIG_ATTR = "rosetta_config"  # where models.build records the model's ModelConfig


def _config(model: keras.Model) -> ModelConfig:
    """The ModelConfig models.build attached (read here, not imported from models.py, so that models.py can
    import this module at the top without an import cycle)."""
    config = getattr(model, CONFIG_ATTR, None)
    if not isinstance(config, ModelConfig):
        raise ValueError(f"Keras model {model.name!r} has no Rosetta ModelConfig: make it with rosetta_tf.build")
    return config


def keras_variables(model: keras.Model) -> dict[str, keras.Variable]:
    """Canonical name -> the model's variable, in canonical order (rosetta_common.weights.canonical_shapes)."""
    config = _config(model)
    found: dict[str, keras.Variable] = {}
    if config.arch in ("mlp", "cnn"):
        for name in ("hidden", "head") if config.arch == "mlp" else ("conv1", "conv2", "head"):
            layer = model.get_layer(name)
            found[f"{name}.kernel"], found[f"{name}.bias"] = layer.kernel, layer.bias
    else:  # attention
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
        for name in ("embed", "head"):
            layer = model.get_layer(name)
            found[f"{name}.kernel"], found[f"{name}.bias"] = layer.kernel, layer.bias
        final = model.get_layer("final_norm")
        found["final_norm.scale"], found["final_norm.bias"] = final.gamma, final.beta
    # Ordered by the canonical list, and a KeyError here would be a canonical name this mapping forgot.
    return {name: found[name] for name in canonical_shapes(config)}


def from_canonical(model: keras.Model, weights: Mapping[str, np.ndarray]) -> None:
    """Assign canonical weights to the model's variables (copies); WeightsError unless they fit its config."""
    config = _config(model)
    check_weights(weights, config, source=f"{config.arch} weights")
    for name, variable in keras_variables(model).items():
        variable.assign(np.asarray(weights[name], dtype=np.float32))


def to_canonical(model: keras.Model) -> Weights:
    """The model's weights as float32 numpy copies, in canonical names and order."""
    return {name: np.array(variable.numpy(), dtype=np.float32) for name, variable in keras_variables(model).items()}
