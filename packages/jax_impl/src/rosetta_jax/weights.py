"""Canonical <-> Flax NNX weights, in one place: the contract's from_canonical() and to_canonical().

The mapping is the identity on names and layouts: an NNX parameter's attribute path joined with "." is its
canonical name (models.py names every submodule after the canonical convention), Flax dense kernels are
(in, out) and conv kernels HWIO, and the CNN flattens NHWC, i.e. (h, w, c). So no tensor is transposed or
permuted here; what this module does is check names and shapes, so that a model can never silently hold a
tensor under the wrong name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rosetta_common.weights import Weights, canonical_shapes, check_weights

if TYPE_CHECKING:  # models.py imports this module for build()
    from rosetta_jax.models import Model


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


def _flat(state: nnx.State) -> dict[str, Any]:
    """Flatten an NNX parameter state to {canonical name: array}."""
    return {".".join(str(p) for p in path): var.get_value() for path, var in nnx.to_flat_state(state)}


def from_canonical(model: Model, weights: Mapping[str, np.ndarray]) -> None:
    """Load canonical weights into `model`'s parameters, in place (WeightsError, one line, if they do not fit
    the model's config)."""
    config = model.config
    check_weights(weights, config, source=f"{config.arch} weights")
    state = nnx.state(model, nnx.Param)
    native = {name: tuple(v.shape) for name, v in _flat(state).items()}
    expected = {name: tuple(np.shape(w)) for name, w in weights.items()}
    if native != expected:  # models.py disagrees with canonical_shapes: a bug here, not in the caller's data
        raise AssertionError(f"NNX parameters {native} differ from the canonical ones {expected}")
    # Copy (jnp.array) so the model never aliases the caller's numpy buffers.
    nnx.replace_by_pure_dict(state, _nest({k: jnp.array(v, dtype=jnp.float32) for k, v in weights.items()}))
    nnx.update(model, state)


def to_canonical(model: Model) -> Weights:
    """The model's parameters as canonical numpy float32 arrays in canonical order (exact inverse of
    from_canonical)."""
    flat = _flat(nnx.state(model, nnx.Param))
    return {name: np.array(flat[name], dtype=np.float32) for name in canonical_shapes(model.config)}
