"""Canonical weights (rosetta-canonical-v1, see rosetta_common.weights) <-> torch state dicts, in one place.

Names: the modules in models.py are named after the canonical names, so a canonical `x.kernel` or
`x.scale` is torch's `x.weight`, and `x.bias` / `pos_embedding` keep their names.
Layouts:
- dense kernel (in, out) -> Linear.weight (out, in): a transpose;
- conv kernel HWIO -> Conv2d.weight OIHW: kernel.transpose(3, 2, 0, 1);
- the CNN head: canonical rows follow the (height, width, channel) flatten; torch flattens NCHW as
  (channel, height, width), so the rows are permuted here (and only here) before the transpose.
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


def module_config(arch: str, spec: Spec, weights: Mapping[str, np.ndarray],
                  image_shape: tuple[int, int] | None = None) -> dict[str, Any]:
    """Everything models.make_module needs, read from the spec and the weights' shapes.

    Only the CNN cannot read its image shape from the weights alone (its head holds height*width*channels
    rows); it is taken from `image_shape` when given, else the pooled map is assumed square.
    """
    num_classes = int(weights["head.bias"].shape[0])
    if arch == "mlp":
        in_features, hidden = weights["hidden.kernel"].shape
        config = {"in_features": in_features, "hidden": hidden}
        image = None
    elif arch == "cnn":
        c1, c2 = weights["conv1.kernel"].shape[3], weights["conv2.kernel"].shape[3]
        pooled = weights["head.kernel"].shape[0] // c2
        if image_shape is not None:
            pooled_hw = (image_shape[0] // 2, image_shape[1] // 2)
        else:
            side = math.isqrt(pooled)
            if side * side != pooled:
                raise ValueError(f"cnn head.kernel has {pooled} positions per channel, not a square: "
                                 "pass image_shape to build")
            pooled_hw = (side, side)
        config = {"conv1_filters": c1, "conv2_filters": c2, "pooled_hw": list(pooled_hw)}
        image = (pooled_hw[0] * 2, pooled_hw[1] * 2)
    elif arch == "attention":
        a = spec.architecture.attention
        (height, embed_dim), width = weights["pos_embedding"].shape, weights["embed.kernel"].shape[0]
        config = {"height": height, "width": width, "embed_dim": embed_dim, "num_heads": a.num_heads,
                  "mlp_dim": int(weights["block.mlp.fc1.kernel"].shape[1]), "layer_norm_eps": a.layer_norm_eps}
        image = (height, width)
    else:
        raise ValueError(f"architecture {arch!r} is unknown; allowed: mlp, cnn, attention")
    config["num_classes"] = num_classes
    if image is not None:  # the spec and the weights must agree on every shape
        check_weights(weights, canonical_shapes(arch, spec, image, num_classes), f"{arch} weights")
    return config


def _cnn_head_rows(config: Mapping[str, Any]) -> tuple[int, int, int]:
    height, width = config["pooled_hw"]
    return height, width, config["conv2_filters"]


def to_torch_layout(arch: str, name: str, value: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """One canonical array in torch's layout (under torch_name(name))."""
    if arch == "cnn" and name == "head.kernel":
        h, w, c = _cnn_head_rows(config)
        value = value.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(c * h * w, -1)  # rows (h,w,c)->(c,h,w)
    if name.endswith(".kernel"):
        return value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T  # HWIO -> OIHW, (in,out) -> (out,in)
    return value


def from_torch_layout(arch: str, name: str, value: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """The exact inverse of to_torch_layout: a torch array back in canonical layout."""
    if name.endswith(".kernel"):
        value = value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
    if arch == "cnn" and name == "head.kernel":
        h, w, c = _cnn_head_rows(config)
        value = value.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(h * w * c, -1)
    return value


def to_state_dict(arch: str, weights: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {
        torch_name(name): torch.from_numpy(
            np.ascontiguousarray(to_torch_layout(arch, name, np.asarray(value, np.float32), config)))
        for name, value in weights.items()
    }


def canonical_names(model: nn.Module) -> dict[str, str]:
    """torch parameter name -> canonical name, in the module's order (a LayerNorm's weight is a `scale`)."""
    names = {}
    for prefix, module in model.named_modules():
        for short, _ in module.named_parameters(recurse=False):
            full = f"{prefix}.{short}" if prefix else short
            if short == "weight":
                short = "scale" if isinstance(module, nn.LayerNorm) else "kernel"
            names[full] = f"{prefix}.{short}" if prefix else short
    return names


def from_state_dict(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> Weights:
    """Canonical float32 arrays from tensors keyed like `model`'s parameters (its state dict, or its gradients)."""
    return {
        name: np.ascontiguousarray(
            from_torch_layout(model.arch, name, tensors[native].detach().cpu().numpy(), model.config), np.float32)
        for native, name in canonical_names(model).items()
    }


def build(arch: str, spec: Spec, weights: Mapping[str, np.ndarray],
          image_shape: tuple[int, int] | None = None) -> nn.Module:
    """The torch module of `arch` holding these canonical weights, on the default device, in eval mode."""
    config = module_config(arch, spec, weights, image_shape)
    model = make_module(arch, config)
    model.load_state_dict(to_state_dict(arch, weights, config), strict=True)
    return model.to(default_device()).eval()


def canonical_weights(model: nn.Module) -> Weights:
    return from_state_dict(model, model.state_dict())
