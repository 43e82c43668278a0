"""Canonical weights (rosetta-canonical-v1, see rosetta_common.weights) <-> torch state dicts, in one place.

Names: the modules in models.py are named after the canonical names, so a canonical `x.kernel` or
`x.scale` is torch's `x.weight`, and `x.bias` / `pos_embedding` keep their names.
Layouts:
- dense kernel (in, out) -> Linear.weight (out, in): a transpose;
- conv kernel HWIO -> Conv2d.weight OIHW: kernel.transpose(3, 2, 0, 1);
- the CNN head: canonical rows follow the (height, width, channel) flatten; torch flattens NCHW as
  (channel, height, width), so the rows are permuted here, and only here, before the transpose.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from rosetta_common.spec import Spec
from rosetta_common.weights import Weights, canonical_shapes, check_weights
from rosetta_torch.models import default_device, make_module

# Canonical suffix -> torch suffix; every other name is the same in both.
_SUFFIXES = {".kernel": ".weight", ".scale": ".weight"}


def torch_name(name: str) -> str:
    for canonical, native in _SUFFIXES.items():
        if name.endswith(canonical):
            return name.removesuffix(canonical) + native
    return name


def infer_image_shape(arch: str, weights: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """The image shape the weights imply. Attention weights pin height and width; the mlp's and cnn's pin
    only their product (or the pooled size), so there square images are assumed: pass image_shape to build
    for anything else."""
    try:
        if arch == "attention":
            return int(weights["pos_embedding"].shape[0]), int(weights["embed.kernel"].shape[0])
        if arch == "mlp":
            cells, what = int(weights["hidden.kernel"].shape[0]), "mlp hidden.kernel: {} rows"
        elif arch == "cnn":
            cells = int(weights["head.kernel"].shape[0]) // int(weights["conv2.bias"].shape[0])
            what = "cnn head.kernel: {} pooled cells per channel"
        else:
            raise ValueError(f"architecture {arch!r} is unknown; allowed: mlp, cnn, attention")
    except KeyError as missing:
        raise ValueError(f"{arch} weights: names differ from the canonical ones (missing {missing})") from None
    side = math.isqrt(cells)
    if side * side != cells:
        raise ValueError(f"{what.format(cells)}: not a square image; pass image_shape")
    return (side, side) if arch == "mlp" else (2 * side, 2 * side)  # cnn: even sides (digits 8x8, MNIST 28x28)


def module_config(arch: str, spec: Spec, weights: Mapping[str, np.ndarray],
                  image_shape: tuple[int, int] | None = None) -> dict[str, Any]:
    """models.make_module's config, after checking the weights against the canonical names and shapes."""
    if arch not in ("mlp", "cnn", "attention"):
        raise ValueError(f"architecture {arch!r} is unknown; allowed: mlp, cnn, attention")
    shape = tuple(image_shape) if image_shape is not None else infer_image_shape(arch, weights)
    num_classes = int(weights["head.bias"].shape[0]) if "head.bias" in weights else 0
    check_weights(weights, canonical_shapes(arch, spec, shape, num_classes), f"{arch} weights")
    return {"image_shape": list(shape), "num_classes": num_classes,
            "architecture": getattr(spec.architecture, arch).model_dump()}


def canonical_order(arch: str, config: Mapping[str, Any]) -> list[str]:
    spec = Spec.model_validate({"architecture": {arch: config["architecture"]}})
    return list(canonical_shapes(arch, spec, tuple(config["image_shape"]), config["num_classes"]))


def _cnn_head_cells(config: Mapping[str, Any]) -> tuple[int, int, int]:
    (height, width), channels = config["image_shape"], config["architecture"]["conv2_filters"]
    return height // 2, width // 2, channels


def to_torch_layout(arch: str, name: str, value: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """One canonical array in torch's layout (the tensor torch_name(name) holds)."""
    if arch == "cnn" and name == "head.kernel":
        h, w, c = _cnn_head_cells(config)
        value = value.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(c * h * w, -1)  # rows (h,w,c) -> (c,h,w)
    if name.endswith(".kernel"):
        return value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T  # HWIO -> OIHW; (in,out) -> (out,in)
    return value


def from_torch_layout(arch: str, name: str, value: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """The exact inverse of to_torch_layout."""
    if name.endswith(".kernel"):
        value = value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
    if arch == "cnn" and name == "head.kernel":
        h, w, c = _cnn_head_cells(config)
        value = value.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(h * w * c, -1)
    return value


def to_state_dict(arch: str, weights: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {
        torch_name(name): torch.from_numpy(
            np.ascontiguousarray(to_torch_layout(arch, name, np.asarray(value, np.float32), config)))
        for name, value in weights.items()
    }


def from_state_dict(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> Weights:
    """Canonical float32 arrays, in canonical order, from tensors keyed like `model`'s parameters
    (its state dict, or its gradients)."""
    return {
        name: np.ascontiguousarray(from_torch_layout(
            model.arch, name, tensors[torch_name(name)].detach().cpu().numpy(), model.config), np.float32)
        for name in canonical_order(model.arch, model.config)
    }


def build(arch: str, spec: Spec, weights: Mapping[str, np.ndarray],
          image_shape: tuple[int, int] | None = None) -> nn.Module:
    """The torch module of `arch` holding (copies of) these canonical weights, on the default device, in
    eval mode."""
    config = module_config(arch, spec, weights, image_shape)
    model = make_module(arch, config)
    model.load_state_dict(to_state_dict(arch, weights, config), strict=True)  # copies; every name must match
    return model.to(default_device()).eval()


def canonical_weights(model: nn.Module) -> Weights:
    return from_state_dict(model, model.state_dict())
