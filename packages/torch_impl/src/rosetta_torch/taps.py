"""The contract's forward_with_taps: every tap of rosetta_common.taps, read from the model's own forward with
torch's own mechanisms, converted to the canonical layout (NCHW -> NHWC, the heads split).

A tap points at the layer where a porting mistake enters only if it is what the model itself computes: so every
tap is read from one inference-mode forward as it runs (forward hooks and pre-hooks on its modules, a
TorchFunctionMode for the torch functions it calls), and the one value that forward does not hold, the LSTM's cell
state per step, comes from the model's own nn.LSTM stepped over the rows. Nothing in the model changes: hooks and
the mode exist only during this call, so state_dict, model.pt2 and model.onnx are what they were. Where each tap is
found: SOURCES.

How the taps are compared, and what a failing check does with them: docs/judge.md ("Per-layer taps").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from rosetta_common.registry import entry
from rosetta_common.spec import ModelConfig
from rosetta_common.taps import Tap, module_sources, taps
from rosetta_torch.models import model_input

# Tap -> where torch's forward holds it: (module path, "output" | "input" | the name of a torch function called in
# that module's own forward, first call); rosetta_common.taps.MODULE_SOURCES with torch's own entries. "" is the
# model; torch pads with a module of its own (nn.ZeroPad2d), so block.conv2's input is padded: relu1 is pad2's.
# Forward hooks give a module's output, forward pre-hooks its input: a ReLU or a pooling written as F.relu /
# F.max_pool2d is not a module, but its output is the next module's input (the CNN's pool is conv2's input, the GELU
# fc2's input). The two values that are no module's input or output are read by a TorchFunctionMode, which sees every
# torch function the forward calls: the CNN's first ReLU (it feeds F.max_pool2d) and the attention weights (the
# softmax inside SelfAttention.forward).
# The text model's attention is torch's nn.MultiheadAttention, module `block.attn`: its output is (attended,
# weights), the weights only when asked for (need_weights, per head: average_attn_weights=False), which a forward
# pre-hook does for this call alone (ATTENTION_WEIGHTS).
SOURCES = module_sources({
    "cnn": {"conv1.relu": ("", "relu")},
    "attention": {"block.attn.weights": ("block.attn", "softmax")},
    "resnet": {"block.relu1": ("block.pad2", "input")},
    "lstm": {"lstm.cell": ("lstm", "stepped")},
    "text_transformer": {"block.attn.weights": ("block.attn", "weights"), "block.attn.out": ("block.attn", "output")},
})
ATTENTION_WEIGHTS = {"need_weights": True, "average_attn_weights": False}


class _FunctionRecorder(TorchFunctionMode):
    """Records the first output of each named torch function in the innermost module running it."""

    def __init__(self, wanted: set[tuple[str, str]], scope: list[str], into: dict[tuple[str, str], Any]) -> None:
        super().__init__()
        self.wanted, self.scope, self.into = wanted, scope, into

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        key = (self.scope[-1], getattr(func, "__name__", ""))
        if key in self.wanted and key not in self.into:
            self.into[key] = out
        return out


def _first(value: Any) -> torch.Tensor:
    """A module's tensor: nn.LSTM / nn.GRU return (outputs, state), hooks' inputs are argument tuples."""
    return value[0] if isinstance(value, tuple) else value


def _canonical(config: ModelConfig, tap: Tap, value: torch.Tensor) -> np.ndarray:
    """torch's layout -> the tap's canonical one."""
    if entry(config.arch).family == "conv" and len(tap.shape) == 4:  # NCHW, or the CNN head's (c, h, w) flatten
        b, h, w, c = tap.shape
        value = value.reshape(b, c, h, w).permute(0, 2, 3, 1)
    elif tap.name in ("block.attn.query", "block.attn.key", "block.attn.value"):
        b, heads, tokens, head_dim = tap.shape
        value = value.reshape(b, tokens, heads, head_dim).transpose(1, 2)
    return value.float().cpu().numpy()


def _stepped_cells(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """The cell state after every step, (B, T, hidden), from nn.LSTM run one step at a time from the previous step's
    (h, c): nn.LSTM's fused kernel returns only the last cell state, so this is the model's own module and weights,
    not the forward's tensors."""
    h = c = torch.zeros(1, x.shape[0], lstm.hidden_size, device=x.device)
    cells = []
    for t in range(x.shape[1]):
        _, (h, c) = lstm(x[:, t:t + 1], (h, c))
        cells.append(c[0])
    return torch.stack(cells, dim=1)


@torch.inference_mode()
def forward_with_taps(model: nn.Module, images: np.ndarray) -> dict[str, np.ndarray]:
    """Every tap of rosetta_common.taps in the canonical names, order, shapes and layouts, float32, from one
    inference-mode forward of `model` (its `logits` are what predict returns)."""
    model.eval()
    config: ModelConfig = model.config
    sources = SOURCES[config.arch]
    x = model_input(model, images)
    modules = dict(model.named_modules())
    read: dict[tuple[str, str], Any] = {}
    scope: list[str] = []
    handles = []

    def enter(path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            scope.append(path)
            read.setdefault((path, "input"), _first(args))
        return hook

    def leave(path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            scope.pop()
            read.setdefault((path, "output"), _first(output))
            if isinstance(module, nn.MultiheadAttention):
                read.setdefault((path, "weights"), output[1])
        return hook

    def with_weights(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        return args, {**kwargs, **ATTENTION_WEIGHTS}

    try:
        for path, module in modules.items():
            handles.append(module.register_forward_pre_hook(enter(path)))
            handles.append(module.register_forward_hook(leave(path)))
            if isinstance(module, nn.MultiheadAttention):
                handles.append(module.register_forward_pre_hook(with_weights, with_kwargs=True))
        wanted = {source for source in sources.values() if source[1] not in ("input", "output", "stepped", "weights")}
        with _FunctionRecorder(wanted, scope, read):
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    length = x.shape[1] if config.input.kind == "tokens" else None
    if config.arch == "lstm":  # after the hooks are gone: stepping calls the module again
        read[("lstm", "stepped")] = _stepped_cells(model.lstm, x)
    return {tap.name: _canonical(config, tap, read[sources[tap.name]]) for tap in taps(config, len(x), length)}
