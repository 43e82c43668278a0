"""Canonical <-> Flax NNX weights, in one place.

The mapping is the identity on names and layouts: an NNX parameter's attribute path joined with "." is its
canonical name (models.py names every submodule after the canonical convention), Flax dense kernels are
(in, out) and conv kernels HWIO, and the CNN flattens NHWC, i.e. (h, w, c). So no tensor is transposed or
permuted here; what this module does is check names and shapes, so that a model can never silently hold a
tensor under the wrong name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rosetta_common.spec import Spec
from rosetta_common.weights import Weights, canonical_shapes, check_weights
from rosetta_jax.models import Model, ModelConfig, create


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"block.attn.query.kernel": x} -> {"block": {"attn": {"query": {"kernel": x}}}}"""
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def to_native(model: Model, weights: Mapping[str, np.ndarray]) -> None:
    """Load canonical weights into `model`'s parameters, in place (names and shapes checked first)."""
    check_weights(weights, canonical_shapes(model.config.arch, model.config.spec, model.config.image_shape,
                                            model.config.num_classes), source=f"{model.config.arch} weights")
    state = nnx.state(model, nnx.Param)
    native = {name: tuple(v.shape) for name, v in from_native_state(state).items()}
    expected = {name: tuple(np.shape(w)) for name, w in weights.items()}
    if native != expected:  # models.py disagrees with canonical_shapes: a bug here, not in the caller's data
        raise AssertionError(f"NNX parameters {native} differ from the canonical ones {expected}")
    # Copy (jnp.array) so the model never aliases the caller's numpy buffers.
    nnx.replace_by_pure_dict(state, _nest({k: jnp.array(v, dtype=jnp.float32) for k, v in weights.items()}))
    nnx.update(model, state)


def from_native_state(state: nnx.State) -> dict[str, Any]:
    """Flatten an NNX parameter state to {canonical name: array}."""
    return {".".join(str(p) for p in path): var.get_value() for path, var in nnx.to_flat_state(state)}


def from_native(model: Model) -> Weights:
    """The model's parameters as canonical numpy float32 arrays (the exact inverse of to_native)."""
    flat = from_native_state(nnx.state(model, nnx.Param))
    return {name: np.array(flat[name], dtype=np.float32) for name in canonical_shapes(
        model.config.arch, model.config.spec, model.config.image_shape, model.config.num_classes)}


def infer_config(arch: str, spec: Spec, weights: Mapping[str, np.ndarray]) -> ModelConfig:
    """The image shape and class count that the canonical weights imply (they are not in the spec)."""

    def shape(name: str) -> tuple[int, ...]:
        if name not in weights:
            raise ValueError(f"{arch} weights: names differ from the canonical ones (missing {name!r})")
        return tuple(np.shape(weights[name]))

    num_classes = shape("head.bias")[0]
    if arch == "mlp":
        # The flattened input only gives height * width; digits and MNIST are square.
        side = round(shape("hidden.kernel")[0] ** 0.5)
        image_shape = (side, side)
    elif arch == "cnn":
        pooled = shape("head.kernel")[0] // spec.architecture.cnn.conv2_filters
        side = round(pooled**0.5) * 2  # pooled = (h // 2) * (w // 2): assume square images
        image_shape = (side, side)
    elif arch == "attention":
        image_shape = (shape("pos_embedding")[0], shape("embed.kernel")[0])
    else:
        raise ValueError(f"architecture {arch!r} is unknown; allowed: mlp, cnn, attention")
    return ModelConfig(arch, image_shape, num_classes, spec.architecture.model_dump_json())


def build(arch: str, spec: Spec, weights: Mapping[str, np.ndarray],
          image_shape: tuple[int, int] | None = None) -> Model:
    """The NNX model of `arch` holding these canonical weights.

    The mlp and cnn weights do not pin height and width apart (only h*w, or (h//2)*(w//2)), so square
    images are assumed unless `image_shape` is given; check_weights then rejects shapes that disagree.
    """
    config = infer_config(arch, spec, weights)
    if image_shape is not None:
        config = ModelConfig(arch, (int(image_shape[0]), int(image_shape[1])), config.num_classes,
                             config.architecture)
    model = create(config)
    to_native(model, weights)
    return model


def canonical_weights(model: Model) -> Weights:
    return from_native(model)
