"""Canonical weights (rosetta-canonical-v1, see rosetta_common.weights) <-> Flax NNX variables, in one place: the
contract's from_canonical() and to_canonical().

Flax already keeps the canonical layouts (dense kernels (in, out), conv kernels HWIO, NHWC flatten), so no tensor is
transposed or permuted; what differs is a few names (BatchNorm's statistics, the recurrent cells'), which variables
are state rather than parameters, and the text model's per-head attention kernels. Every such change is made and
undone in this module, exactly, so that models.py can name its submodules after the canonical names and everything
outside the package sees canonical weights only. An NNX variable's attribute path joined with "." is its native
name, so most names map to themselves.

What each framework keeps differently, and how its package maps it: docs/conventions.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rosetta_common.spec import ModelConfig
from rosetta_common.weights import Weights, canonical_shapes, check_weights

# Every variable of these models: trainable parameters and BatchNorm's running statistics. nnx.BatchNorm keeps the
# statistics as BatchStat variables: state, not parameters, so they are written and read here but never handed to
# the optimizer (train.py differentiates nnx.Param only).
VARIABLES = (nnx.Param, nnx.BatchStat)

# Canonical name -> NNX path, where they differ (the RNN's cell sits under `<prefix>.cell`).
# LSTM: nnx.OptimizedLSTMCell holds `dense_i.kernel` (in, 4h) without bias and `dense_h.kernel` (h, 4h) with
# `dense_h.bias` (4h): the one canonical bias lives on the hidden side in Flax (only the sum of torch's two enters
# the formula). GRU: the cell (models.GRUCell) holds `dense_i.kernel`/`dense_i.bias` (input side, b_ir b_iz b_in) and
# `dense_h.kernel`/`dense_h.bias` (hidden side, b_hr b_hz b_hn); stock nnx.GRUCell has no `dense_h.bias`.
RENAMED = {
    "lstm.kernel": "lstm.cell.dense_i.kernel",
    "lstm.recurrent_kernel": "lstm.cell.dense_h.kernel",
    "lstm.bias": "lstm.cell.dense_h.bias",
    "gru.kernel": "gru.cell.dense_i.kernel",
    "gru.input_bias": "gru.cell.dense_i.bias",
    "gru.recurrent_kernel": "gru.cell.dense_h.kernel",
    "gru.recurrent_bias": "gru.cell.dense_h.bias",
}
# Canonical BatchNorm statistic suffix -> nnx.BatchNorm's variable name. Its momentum, epsilon and variance are set
# in models.py, where the layers are made (Flax's momentum is the spec's; use_fast_variance=False).
BATCHNORM_STATISTICS = {"running_mean": "mean", "running_var": "var"}

# Gate blocks along the last axis of every tensor of the recurrent layer, canonical and Flax's. Flax's order equals
# the canonical one for both cells, so the blocks are reordered by the identity permutation; it is written out so that
# a wrong order is one constant away and the package's tests can plant it.
CANONICAL_GATES = {"lstm": ("i", "f", "g", "o"), "gru": ("r", "z", "n")}
FLAX_GATES = {"lstm": ("i", "f", "g", "o"), "gru": ("r", "z", "n")}


def native_name(name: str) -> str:
    """The NNX path of canonical `name`."""
    if name in RENAMED:
        return RENAMED[name]
    prefix, _, leaf = name.rpartition(".")
    return f"{prefix}.{BATCHNORM_STATISTICS[leaf]}" if leaf in BATCHNORM_STATISTICS else name


# text_transformer's attention tensors, canonical name -> Flax's shape as a function of (embed, heads, head_dim).
# nnx.MultiHeadAttention keeps its projections per head (nnx.LinearGeneral): query/key/value kernel (embed, heads,
# head_dim) and bias (heads, head_dim), out kernel (heads, head_dim, embed) and bias (embed,). Canonical head h is
# columns h*head_dim:(h+1)*head_dim (rows of the out kernel), so each is a row-major reshape, no permutation.
# nnx.Embed's `embedding` (vocabulary, embed) is canonical `embed.embedding` as it is (Flax has no padding row
# option: row PAD_ID is whatever the canonical weights hold, zero at init).
PER_HEAD = {
    **{f"block.attn.{p}.kernel": lambda e, h, d: (e, h, d) for p in ("query", "key", "value")},
    **{f"block.attn.{p}.bias": lambda e, h, d: (h, d) for p in ("query", "key", "value")},
    "block.attn.out.kernel": lambda e, h, d: (h, d, e),
}


def native_shape(config: ModelConfig, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape Flax keeps canonical `name` (of canonical `shape`) in."""
    if config.arch != "text_transformer" or name not in PER_HEAD:
        return shape
    a = config.settings
    return PER_HEAD[name](a.embed_dim, a.num_heads, a.head_dim)


def _reorder(value: np.ndarray, source: tuple[str, ...], target: tuple[str, ...]) -> np.ndarray:
    """Gate blocks along the last axis from `source` order to `target` order (a copy, exact)."""
    blocks = dict(zip(source, np.split(value, len(source), axis=-1), strict=True))
    return np.concatenate([blocks[gate] for gate in target], axis=-1)


def _gates(name: str) -> str | None:
    """The recurrent layer whose gates `name` holds, or None."""
    prefix = name.split(".", 1)[0]
    return prefix if prefix in CANONICAL_GATES else None


def to_native(config: ModelConfig, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical weights -> {NNX path: array in Flax's layout}."""
    native = {}
    for name, shape in canonical_shapes(config).items():
        value = np.asarray(weights[name])
        if (layer := _gates(name)) is not None:
            value = _reorder(value, CANONICAL_GATES[layer], FLAX_GATES[layer])
        native[native_name(name)] = value.reshape(native_shape(config, name, shape))
    return native


def from_native(config: ModelConfig, native: Mapping[str, Any]) -> Weights:
    """{NNX path: array} -> canonical weights in canonical order (exact inverse of to_native). A path that is
    missing is left out and one that is not the model's is kept under its own name, so that check_weights
    names either."""
    weights: Weights = {}
    for name, shape in canonical_shapes(config).items():
        if native_name(name) not in native:
            continue
        value = np.array(native[native_name(name)], dtype=np.float32)
        if (layer := _gates(name)) is not None:
            value = _reorder(value, FLAX_GATES[layer], CANONICAL_GATES[layer])
        if value.shape == native_shape(config, name, shape):  # any other shape is kept for check_weights to name
            value = value.reshape(shape)
        weights[name] = value
    known = {native_name(name) for name in canonical_shapes(config)}
    return {**weights, **{path: np.asarray(v) for path, v in native.items() if path not in known}}


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
    """Flatten an NNX state to {NNX path: array}."""
    return {".".join(str(p) for p in path): var.get_value() for path, var in nnx.to_flat_state(state)}


def from_canonical(model: nnx.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Load canonical weights (running statistics included) into `model`'s variables, in place (WeightsError,
    one line, if they do not fit the model's config)."""
    config = model.config
    check_weights(weights, config, source=f"{config.arch} weights")
    native = to_native(config, weights)
    state = nnx.state(model, VARIABLES)
    shapes = {name: tuple(v.shape) for name, v in _flat(state).items()}
    expected = {name: tuple(np.shape(w)) for name, w in native.items()}
    if shapes != expected:  # models.py disagrees with canonical_shapes: a bug here, not in the caller's data
        raise AssertionError(f"NNX variables {shapes} differ from the canonical ones {expected}")
    # Copy (jnp.array) so the model never aliases the caller's numpy buffers.
    nnx.replace_by_pure_dict(state, _nest({k: jnp.array(v, dtype=jnp.float32) for k, v in native.items()}))
    nnx.update(model, state)


def to_canonical(model: nnx.Module) -> Weights:
    """The model's variables as canonical numpy float32 arrays in canonical order (exact inverse of
    from_canonical)."""
    return from_native(model.config, _flat(nnx.state(model, VARIABLES)))
