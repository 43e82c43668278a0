"""Canonical <-> Keras weights, in one place.

Keras already keeps the canonical layouts (dense kernels (in, out), conv kernels HWIO, NHWC flatten),
so the mapping is by name only: values are copied unchanged. LayerNorm's `scale`/`bias` are Keras'
`gamma`/`beta`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import keras
import numpy as np

from rosetta_common.spec import Spec
from rosetta_common.weights import Weights, canonical_shapes, check_weights
from rosetta_tf import models


def _variables(model: keras.Model) -> dict[str, keras.Variable]:
    """Canonical name -> the model's variable, in canonical order."""
    arch = model.name
    if arch in ("mlp", "cnn"):
        names = ("hidden", "head") if arch == "mlp" else ("conv1", "conv2", "head")
        out: dict[str, keras.Variable] = {}
        for name in names:
            layer = model.get_layer(name)
            out[f"{name}.kernel"], out[f"{name}.bias"] = layer.kernel, layer.bias
        return out
    if arch == "attention":
        embed, block = model.get_layer("embed"), model.get_layer("block")
        final, head = model.get_layer("final_norm"), model.get_layer("head")
        attn = block.attn
        return {
            "embed.kernel": embed.kernel,
            "embed.bias": embed.bias,
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
            "final_norm.scale": final.gamma,
            "final_norm.bias": final.beta,
            "head.kernel": head.kernel,
            "head.bias": head.bias,
        }
    raise ValueError(f"model {model.name!r} is not one of rosetta's architectures (mlp, cnn, attention)")


def infer_shapes(
    arch: str, weights: Mapping[str, np.ndarray], image_shape: tuple[int, int] | None = None
) -> tuple[tuple[int, int], int]:
    """(image_shape, num_classes) implied by canonical weights.

    Keras needs static input shapes. The attention weights pin height and width exactly; the mlp's and
    cnn's only pin their product (or the pooled size), so there square images are assumed unless the
    caller passes image_shape.
    """
    try:
        return _infer_shapes(arch, weights, image_shape)
    except KeyError as missing:
        raise ValueError(f"{arch} weights: missing {missing} (needed to infer the image shape)") from None


def _infer_shapes(
    arch: str, weights: Mapping[str, np.ndarray], image_shape: tuple[int, int] | None
) -> tuple[tuple[int, int], int]:
    num_classes = int(weights["head.bias"].shape[0])
    if image_shape is not None:
        return (int(image_shape[0]), int(image_shape[1])), num_classes
    if arch == "attention":
        return (int(weights["pos_embedding"].shape[0]), int(weights["embed.kernel"].shape[0])), num_classes
    if arch == "mlp":
        pixels = int(weights["hidden.kernel"].shape[0])
        side = math.isqrt(pixels)
        if side * side != pixels:
            raise ValueError(f"mlp hidden.kernel: {pixels} rows: not a square image; pass image_shape")
        return (side, side), num_classes
    if arch == "cnn":
        cells = int(weights["head.kernel"].shape[0]) // int(weights["conv2.bias"].shape[0])
        side = math.isqrt(cells)
        if side * side != cells:
            raise ValueError(f"cnn head.kernel: {cells} pooled cells: not a square; pass image_shape")
        return (2 * side, 2 * side), num_classes  # even sides assumed (digits 8x8, MNIST 28x28)
    raise ValueError(f"architecture {arch!r} is unknown; allowed: mlp, cnn, attention")


def to_native(model: keras.Model, weights: Mapping[str, np.ndarray]) -> None:
    """Assign canonical weights to the model's variables (checked against the canonical shapes)."""
    variables = _variables(model)
    check_weights(weights, {k: tuple(v.shape) for k, v in variables.items()}, source="build")
    for name, variable in variables.items():
        variable.assign(np.asarray(weights[name], dtype=np.float32))


def from_native(model: keras.Model) -> Weights:
    return {name: np.array(var.numpy(), dtype=np.float32) for name, var in _variables(model).items()}


def build(
    arch: str, spec: Spec, weights: Mapping[str, np.ndarray], image_shape: tuple[int, int] | None = None
) -> keras.Model:
    """The Keras model of `arch` holding these canonical weights."""
    shape, num_classes = infer_shapes(arch, weights, image_shape)
    check_weights(weights, canonical_shapes(arch, spec, shape, num_classes), source=f"{arch} weights")
    model = models.create(arch, spec, shape, num_classes)
    to_native(model, weights)
    return model


def canonical_weights(model: keras.Model) -> Weights:
    return from_native(model)
