"""Canonical weights (rosetta-canonical-v1, see rosetta_common.weights) <-> torch state dicts, in one place: the
contract's from_canonical() and to_canonical().

torch keeps several canonical tensors in other layouts: Linear and Conv2d weights transposed (out first), the CNN
head's rows in the order of its NCHW flatten, the LSTM's one bias as two, the text model's query, key and value
fused into one in_proj. Every such change is made and undone in this module, exactly, so that models.py can name its
modules after the canonical names and everything outside the package sees canonical weights only. The shapes these
mappings need come from the model's own ModelConfig (`model.config`, set by models.create), never from the weights.

What each framework keeps differently, and how its package maps it: docs/conventions.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from rosetta_common.spec import ModelConfig
from rosetta_common.weights import Weights, canonical_shapes, check_weights

# Canonical suffix -> torch suffix; every other name (`x.bias`, `x.running_mean`, `x.running_var`, `pos_embedding`)
# is the same in both, but for the recurrent layers' and the text model's attention (below).
_SUFFIXES = {".kernel": ".weight", ".scale": ".weight"}
# The recurrent layers' tensors have torch's own names. LSTM: the canonical (in, 4h) / (h, 4h) kernels are
# weight_ih_l0 (4h, in) / weight_hh_l0 (4h, h), transposed; GRU: (in, 3h) / (h, 3h) likewise, input_bias is bias_ih_l0
# and recurrent_bias bias_hh_l0, torch's formula being the spec's (b_hn inside r * (...)).
_RECURRENT_NAMES = {
    "lstm.kernel": "lstm.weight_ih_l0",
    "lstm.recurrent_kernel": "lstm.weight_hh_l0",
    "lstm.bias": "lstm.bias_ih_l0",  # bias_hh_l0 is zero: see split_lstm_bias
    "gru.kernel": "gru.weight_ih_l0",
    "gru.recurrent_kernel": "gru.weight_hh_l0",
    "gru.input_bias": "gru.bias_ih_l0",
    "gru.recurrent_bias": "gru.bias_hh_l0",
}
LSTM_HIDDEN_BIAS = "lstm.bias_hh_l0"
# BatchNorm: scale/bias are BatchNorm2d's weight/bias; running_mean/running_var map one to one (the statistics are
# canonical state, float32 both ways). torch's extra `num_batches_tracked` counter is not canonical: to_canonical
# drops it and from_canonical sets it to zero, a fresh module's count, so that strict loading still works (with
# `momentum` set, torch never reads it). BatchNorm's momentum, epsilon and running variance are set in models.py,
# where the layers are made.
TRACKED = ".num_batches_tracked"  # torch's BatchNorm step counter: not canonical

# text_transformer: nn.MultiheadAttention fuses the three input projections: in_proj_weight (3e, e) holds the query,
# key and value kernels transposed, stacked, and in_proj_bias (3e,) their biases end to end; row block j holds
# canonical projection IN_PROJ_ORDER[j] (torch's order is q, k, v); written out, as GATE_ORDER, so a test can plant a
# wrong one. `block.attn.out` is its out_proj (a Linear); `embed.embedding` (V, e) is nn.Embedding's weight as it is
# (no transpose; its padding_idx row 0 is loaded like any row: zero in the canonical init, and torch never gives it a
# gradient). The image attention model keeps its three separate Linears (`block.attn.query.weight` ...).
IN_PROJ_ORDER: tuple[str, ...] = ("query", "key", "value")
_TEXT_NAMES = {"embed.embedding": "embed.weight", "block.attn.out.kernel": "block.attn.out_proj.weight",
               "block.attn.out.bias": "block.attn.out_proj.bias"}
IN_PROJ = {"kernel": "block.attn.in_proj_weight", "bias": "block.attn.in_proj_bias"}

# Torch's gate block j holds canonical gate block GATE_ORDER[arch][j]. Canonical LSTM i, f, g, o and GRU r, z, n
# are torch's own orders, so both are the identity; written out because a gate order is exactly the kind of
# mapping that another framework gets wrong (Keras' GRU is z, r, h).
GATE_ORDER: dict[str, tuple[int, ...]] = {"lstm": (0, 1, 2, 3), "gru": (0, 1, 2)}


def _in_proj(name: str) -> tuple[str, str] | None:
    """(projection, "kernel" | "bias") of a canonical q/k/v name of the text model, else None."""
    parts = name.split(".")
    if len(parts) == 4 and parts[:2] == ["block", "attn"] and parts[2] in IN_PROJ_ORDER and parts[3] in IN_PROJ:
        return parts[2], parts[3]
    return None


def torch_name(name: str, arch: str | None = None) -> str:
    """The torch state-dict name holding canonical `name` (for text_transformer, q, k and v share in_proj_*)."""
    if arch == "text_transformer":
        if name in _TEXT_NAMES:
            return _TEXT_NAMES[name]
        if (fused := _in_proj(name)) is not None:
            return IN_PROJ[fused[1]]
    if name in _RECURRENT_NAMES:
        return _RECURRENT_NAMES[name]
    for canonical, native in _SUFFIXES.items():
        if name.endswith(canonical):
            return name.removesuffix(canonical) + native
    return name


def _cnn_head_cells(config: ModelConfig) -> tuple[int, int, int]:
    (height, width), channels = config.image_shape, config.settings.conv2_filters
    return height // 2, width // 2, channels


def _gate_blocks(value: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """The gate blocks of the last axis rearranged: block j of the result is block order[j] of `value`."""
    blocks = np.split(value, len(order), axis=-1)
    return np.concatenate([blocks[i] for i in order], axis=-1)


def _recurrent(config: ModelConfig, name: str) -> bool:
    return config.arch in GATE_ORDER and name.startswith(f"{config.arch}.")


# Layouts: dense kernel (in, out) -> Linear.weight (out, in), a transpose; conv kernel HWIO -> Conv2d.weight OIHW,
# kernel.transpose(3, 2, 0, 1); the CNN head's canonical rows follow the (height, width, channel) flatten and torch
# flattens NCHW as (channel, height, width), so they are permuted here, and only here, before the transpose.
def to_torch_layout(config: ModelConfig, name: str, value: np.ndarray) -> np.ndarray:
    """One canonical array in torch's layout (the tensor torch_name(name) holds)."""
    if config.arch == "cnn" and name == "head.kernel":
        h, w, c = _cnn_head_cells(config)
        value = value.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(c * h * w, -1)  # rows (h,w,c) -> (c,h,w)
    if _recurrent(config, name):  # canonical gates on the last axis, before the transpose
        value = _gate_blocks(value, GATE_ORDER[config.arch])
    if name.endswith("kernel"):  # .kernel and .recurrent_kernel
        return value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T  # HWIO -> OIHW; (in,out) -> (out,in)
    return value


def from_torch_layout(config: ModelConfig, name: str, value: np.ndarray) -> np.ndarray:
    """The exact inverse of to_torch_layout."""
    if name.endswith("kernel"):
        value = value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
    if _recurrent(config, name):
        value = _gate_blocks(value, tuple(np.argsort(GATE_ORDER[config.arch])))
    if config.arch == "cnn" and name == "head.kernel":
        h, w, c = _cnn_head_cells(config)
        value = value.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(h * w * c, -1)
    return value


def split_lstm_bias(bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The canonical LSTM bias as torch's (bias_ih_l0, bias_hh_l0): only their sum enters torch's formula, so
    all of it goes to bias_ih and bias_hh is zero (and frozen: models.LSTMClassifier)."""
    return bias, np.zeros_like(bias)


def to_state_dict(config: ModelConfig, weights: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Canonical weights as a state dict of a module of `config` (CPU tensors, torch names and layouts), without
    the num_batches_tracked counters, which are not canonical."""
    state: dict[str, np.ndarray] = {}
    blocks: dict[str, dict[str, np.ndarray]] = {"kernel": {}, "bias": {}}  # text_transformer's q, k, v
    for name, value in weights.items():
        native = to_torch_layout(config, name, np.asarray(value))
        fused = _in_proj(name) if config.arch == "text_transformer" else None
        if fused is not None:
            blocks[fused[1]][fused[0]] = native
        elif config.arch == "lstm" and name == "lstm.bias":
            state[torch_name(name)], state[LSTM_HIDDEN_BIAS] = split_lstm_bias(native)
        else:
            state[torch_name(name, config.arch)] = native
    for kind, parts in blocks.items():
        if parts:  # (out, in) kernels stacked on torch's rows, biases end to end: in_proj's q, k, v blocks
            state[IN_PROJ[kind]] = np.concatenate([parts[p] for p in IN_PROJ_ORDER], axis=0)
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in state.items()}


def from_canonical(model: nn.Module, weights: Weights) -> None:
    """Assign canonical weights to `model` (checked first: WeightsError naming what is off)."""
    config: ModelConfig = model.config
    check_weights(weights, config, f"{config.arch} weights")
    state = to_state_dict(config, weights)
    # BatchNorm's step counters are torch's own state, zero as a fresh module's: the model then holds what a build
    # from these weights holds, trained before or not, and loading stays strict.
    state.update({k: torch.zeros_like(v) for k, v in model.state_dict().items() if k.endswith(TRACKED)})
    model.load_state_dict(state, strict=True)  # copies; every name must match


def to_canonical(model: nn.Module) -> Weights:
    """The model's weights as canonical float32 arrays, in canonical order and layout (num_batches_tracked
    dropped; the LSTM's bias is bias_ih + bias_hh, which is exactly bias_ih while bias_hh is zero)."""
    config: ModelConfig = model.config
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if config.arch == "lstm":
        state["lstm.bias_ih_l0"] = state["lstm.bias_ih_l0"] + state.pop(LSTM_HIDDEN_BIAS)
    # Copies (np.array): a contiguous float32 tensor's numpy view would share the live parameter's memory, and
    # change with it as training goes on (a StepHook's snapshot would not be the step's).
    return {
        name: np.ascontiguousarray(np.array(from_torch_layout(config, name, _native(config, name, state)), np.float32))
        for name in canonical_shapes(config)
    }


def _native(config: ModelConfig, name: str, state: Mapping[str, torch.Tensor]) -> np.ndarray:
    """The torch tensor holding canonical `name`, as numpy: for the text model's q, k or v, its block of in_proj."""
    value = state[torch_name(name, config.arch)].numpy()
    fused = _in_proj(name) if config.arch == "text_transformer" else None
    if fused is None:
        return value
    block = IN_PROJ_ORDER.index(fused[0])
    return np.split(value, len(IN_PROJ_ORDER), axis=0)[block]
