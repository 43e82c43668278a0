"""Canonical weights (rosetta-canonical-v1, see rosetta_common.weights) <-> torch state dicts, in one place.

Names: the modules in models.py are named after the canonical names, so a canonical `x.kernel` or
`x.scale` is torch's `x.weight`, and `x.bias` / `pos_embedding` keep their names.
Layouts:
- dense kernel (in, out) -> Linear.weight (out, in): a transpose;
- conv kernel HWIO -> Conv2d.weight OIHW: kernel.transpose(3, 2, 0, 1);
- the CNN head: canonical rows follow the (height, width, channel) flatten; torch flattens NCHW as
  (channel, height, width), so the rows are permuted here, and only here, before the transpose.
Every model carries its rosetta_common.spec.ModelConfig as `model.config` (models.make_module sets it):
the image shape and sizes these mappings need come from there, never from the weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from rosetta_common.spec import ModelConfig
from rosetta_common.weights import Weights, canonical_shapes, check_weights

# Canonical suffix -> torch suffix; every other name is the same in both.
_SUFFIXES = {".kernel": ".weight", ".scale": ".weight"}


def torch_name(name: str) -> str:
    for canonical, native in _SUFFIXES.items():
        if name.endswith(canonical):
            return name.removesuffix(canonical) + native
    return name


def _cnn_head_cells(config: ModelConfig) -> tuple[int, int, int]:
    (height, width), channels = config.image_shape, config.settings.conv2_filters
    return height // 2, width // 2, channels


def to_torch_layout(config: ModelConfig, name: str, value: np.ndarray) -> np.ndarray:
    """One canonical array in torch's layout (the tensor torch_name(name) holds)."""
    if config.arch == "cnn" and name == "head.kernel":
        h, w, c = _cnn_head_cells(config)
        value = value.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(c * h * w, -1)  # rows (h,w,c) -> (c,h,w)
    if name.endswith(".kernel"):
        return value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T  # HWIO -> OIHW; (in,out) -> (out,in)
    return value


def from_torch_layout(config: ModelConfig, name: str, value: np.ndarray) -> np.ndarray:
    """The exact inverse of to_torch_layout."""
    if name.endswith(".kernel"):
        value = value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
    if config.arch == "cnn" and name == "head.kernel":
        h, w, c = _cnn_head_cells(config)
        value = value.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(h * w * c, -1)
    return value


def to_state_dict(config: ModelConfig, weights: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Canonical weights as a state dict of a module of `config` (CPU tensors, torch names and layouts)."""
    return {
        torch_name(name): torch.from_numpy(np.ascontiguousarray(to_torch_layout(config, name, np.asarray(value))))
        for name, value in weights.items()
    }


def from_canonical(model: nn.Module, weights: Weights) -> None:
    """Assign canonical weights to `model` (checked first: WeightsError naming what is off)."""
    config: ModelConfig = model.config
    check_weights(weights, config, f"{config.arch} weights")
    model.load_state_dict(to_state_dict(config, weights), strict=True)  # copies; every name must match


def to_canonical(model: nn.Module) -> Weights:
    """The model's weights as canonical float32 arrays, in canonical order and layout."""
    config: ModelConfig = model.config
    state = model.state_dict()
    return {
        name: np.ascontiguousarray(
            from_torch_layout(config, name, state[torch_name(name)].detach().cpu().numpy()), np.float32)
        for name in canonical_shapes(config)
    }
