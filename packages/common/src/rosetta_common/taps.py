"""Per-layer taps: the canonical, ordered list of intermediate values of every architecture, and the framework-free
comparison that names the first tap where two forwards part.

When a forward check fails, the logits say only that something differs. Every framework package returns these
taps (`forward_with_taps` in its `taps.py`), in these names, this order and these layouts, and so does the float64
reference (`rosetta_common.reference.forward_with_taps`), so `first_divergent` points at the layer where a porting
mistake enters instead of leaving a bisection by hand. The order is the order in which the reference's forward
computes them, which is what makes "first" meaningful: a mistake shows at the tap where it enters and at every
later one that depends on it. The layouts, the same whatever the framework keeps, are stated above `taps`.

How the validate stage compares them: docs/judge.md ("Per-layer taps").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rosetta_common.registry import entry
from rosetta_common.spec import ModelConfig


@dataclass(frozen=True)
class Tap:
    name: str
    shape: tuple[int, ...]  # for the batch size asked for
    layout: str  # the axes, in words


# The taps' layouts, whatever the framework keeps (each package converts to them):
# - images are NHWC (batch, height, width, channels) (torch's NCHW is transposed);
# - dense outputs are (batch, features), or (batch, tokens, features) for attention's per-token layers;
# - attention's q, k and v are taken after the head split, (batch, heads, tokens, head_dim), head h being columns
#   h*head_dim:(h+1)*head_dim of the projection (rosetta_common.weights); the attention weights are the softmax,
#   (batch, heads, query token, key token);
# - recurrent layers tap the hidden state (and the LSTM its cell state) after every time step, (batch, time,
#   hidden), not gate pre-activations (their layout is the one thing every framework orders differently);
# - `.relu` / `.gelu` taps are the activation's output, the tap named by the layer alone its pre-activation;
# - the text model's taps cover every position, padded ones too (each is computed as a query; padding is excluded
#   only as an attention key, where its weight is exactly 0, and from the pool); its attention is each framework's
#   built-in layer, whose q, k and v stay inside it, so its first attention tap is the weights;
# - `logits` is the model's output, what `predict` returns.
def taps(config: ModelConfig, batch: int, length: int | None = None) -> list[Tap]:
    """Every tap of `config`'s architecture for a batch of `batch` inputs (token models: of `length` tokens, the
    maximum by default), in the order the forward computes them."""
    arch, classes, a = config.arch, config.num_classes, config.settings
    b = batch
    features = "(batch, features)"
    nhwc = "NHWC (batch, height, width, channels)"
    logits = Tap("logits", (b, classes), "(batch, classes)")
    if arch == "text_transformer":
        return _encoder_taps(a, b, length or int(config.max_length), logits, qkv=False,  # type: ignore[arg-type]
                             embed="the token embedding plus the positions",
                             weights="softmax, exactly 0 at padded keys", pool="the mean over real tokens "
                             "(padding excluded)")
    height, width = config.image_shape  # type: ignore[misc]
    if arch == "mlp":
        return [Tap("hidden", (b, a.hidden), features), Tap("hidden.relu", (b, a.hidden), features), logits]
    if arch == "cnn":
        c1, c2, half = a.conv1_filters, a.conv2_filters, (height // 2, width // 2)
        return [Tap("conv1", (b, height, width, c1), nhwc), Tap("conv1.relu", (b, height, width, c1), nhwc),
                Tap("pool", (b, *half, c1), nhwc), Tap("conv2", (b, *half, c2), nhwc),
                Tap("conv2.relu", (b, *half, c2), nhwc), logits]
    if arch == "attention":
        return _encoder_taps(a, b, height, logits, qkv=True, embed="the embedding plus the positions",
                             weights="softmax", pool="the mean over tokens")
    if arch == "resnet":
        stem, filters = a.stem_filters, a.block_filters
        full, half = (b, height, width, stem), (b, -(-height // 2), -(-width // 2), filters)
        return [
            Tap("stem.conv", full, nhwc), Tap("stem.bn", full, nhwc), Tap("stem.relu", full, nhwc),
            Tap("block.shortcut.conv", half, nhwc), Tap("block.shortcut.bn", half, nhwc),
            Tap("block.conv1", half, nhwc), Tap("block.bn1", half, nhwc), Tap("block.relu1", half, nhwc),
            Tap("block.conv2", half, nhwc), Tap("block.bn2", half, nhwc),
            Tap("block", half, f"{nhwc}: ReLU of the residual sum"),
            Tap("pool", (b, filters), f"{features}: the global mean, before dropout"),
            logits,
        ]
    if entry(arch).family == "recurrent":
        steps = "(batch, time, hidden): after every time step (image row)"
        states = [Tap(f"{arch}.hidden", (b, height, a.hidden), steps)]
        if arch == "lstm":  # the cell state is computed first in each step: c_t, then h_t = o * tanh(c_t)
            states.insert(0, Tap("lstm.cell", (b, height, a.hidden), steps))
        return [*states, logits]
    raise ValueError(f"architecture {arch!r} has no taps")  # ModelConfig admits only the architectures above


def _encoder_taps(a: Any, b: int, tokens: int, logits: Tap, qkv: bool, embed: str, weights: str,
                  pool: str) -> list[Tap]:
    """The taps of the pre-norm encoder both attention models share, for `tokens` tokens. Only the image model's own
    attention ops expose q, k and v (`qkv`); the text model's built-in layers keep them inside."""
    e, m, heads = a.embed_dim, a.mlp_dim, a.num_heads
    per_token = "(batch, tokens, features)"
    split = [Tap(f"block.attn.{p}", (b, heads, tokens, a.head_dim), "(batch, heads, tokens, head_dim)")
             for p in ("query", "key", "value")] if qkv else []
    return [
        Tap("embed", (b, tokens, e), f"{per_token}: {embed}"),
        Tap("block.norm1", (b, tokens, e), per_token),
        *split,
        Tap("block.attn.weights", (b, heads, tokens, tokens), f"(batch, heads, query token, key token): {weights}"),
        Tap("block.attn.out", (b, tokens, e), f"{per_token}: the output projection"),
        Tap("block.norm2", (b, tokens, e), f"{per_token}: of the first residual sum"),
        Tap("block.mlp.fc1", (b, tokens, m), per_token),
        Tap("block.mlp.gelu", (b, tokens, m), per_token),
        Tap("block.mlp.fc2", (b, tokens, e), per_token),
        Tap("block", (b, tokens, e), f"{per_token}: the block's output, both residual sums"),
        Tap("final_norm", (b, tokens, e), per_token),
        Tap("pool", (b, e), f"(batch, features): {pool}"),
        logits,
    ]


# Where a model whose submodules carry the canonical names (rosetta_torch's and rosetta_jax's do) holds each tap:
# (module path, "output" | "input"). A ReLU, a pooling or a GELU written as a function is no module, but its
# output is the next module's input. The taps no module's input or output holds (the CNN's first ReLU, the
# attention weights, the LSTM's cell state per step) are missing here: each package says where it finds them.
MODULE_SOURCES: dict[str, dict[str, tuple[str, str]]] = {
    "mlp": {"hidden": ("hidden", "output"), "hidden.relu": ("head", "input"), "logits": ("head", "output")},
    "cnn": {"conv1": ("conv1", "output"), "pool": ("conv2", "input"), "conv2": ("conv2", "output"),
            "conv2.relu": ("head", "input"), "logits": ("head", "output")},
    "attention": {
        "embed": ("block", "input"),
        **{name: (name, "output") for name in ("block.norm1", "block.attn.query", "block.attn.key",
                                               "block.attn.value", "block.attn.out", "block.norm2",
                                               "block.mlp.fc1", "block.mlp.fc2", "block", "final_norm")},
        "block.mlp.gelu": ("block.mlp.fc2", "input"), "pool": ("head", "input"), "logits": ("head", "output"),
    },
    "resnet": {
        **{name: (name, "output") for name in ("stem.conv", "stem.bn", "block.shortcut.conv", "block.shortcut.bn",
                                               "block.conv1", "block.bn1", "block.conv2", "block.bn2", "block")},
        "stem.relu": ("block", "input"), "block.relu1": ("block.conv2", "input"), "pool": ("dropout", "input"),
        "logits": ("head", "output"),
    },
    "lstm": {"lstm.hidden": ("lstm", "output"), "logits": ("head", "output")},
    "gru": {"gru.hidden": ("gru", "output"), "logits": ("head", "output")},
    "text_transformer": {
        "embed": ("block", "input"),
        **{name: (name, "output") for name in ("block.norm1", "block.norm2", "block.mlp.fc1", "block.mlp.fc2",
                                               "block", "final_norm")},
        "block.mlp.gelu": ("block.mlp.fc2", "input"), "pool": ("head", "input"), "logits": ("head", "output"),
    },
}


def module_sources(own: Mapping[str, Mapping[str, tuple[str, str]]]) -> dict[str, dict[str, tuple[str, str]]]:
    """MODULE_SOURCES with a package's own entries (what it finds elsewhere, or where it differs) put over it."""
    return {arch: {**sources, **own.get(arch, {})} for arch, sources in MODULE_SOURCES.items()}


def tap_names(config: ModelConfig) -> list[str]:
    return [tap.name for tap in taps(config, 1)]


@dataclass(frozen=True)
class TapDiff:
    max_abs: float  # max |a - b|
    scale: float  # max |b|: the tap's own size
    rel: float  # max_abs / scale (0 for two zero taps)


def tap_diffs(taps_a: Mapping[str, np.ndarray], taps_b: Mapping[str, np.ndarray]) -> dict[str, TapDiff]:
    """Each tap's max abs difference, and that relative to the scale of `taps_b` (the reference, usually), in
    order. ValueError, naming them, if the two do not hold the same taps in the same order and shapes."""
    if list(taps_a) != list(taps_b):
        raise ValueError(f"tap names differ: {list(taps_a)} against {list(taps_b)}")
    out = {}
    for name, b in taps_b.items():
        a64, b64 = np.asarray(taps_a[name], np.float64), np.asarray(b, np.float64)
        if a64.shape != b64.shape:
            raise ValueError(f"tap {name}: shape {a64.shape} against {b64.shape}")
        max_abs = float(np.max(np.abs(a64 - b64))) if a64.size else 0.0
        scale = float(np.max(np.abs(b64))) if b64.size else 0.0
        out[name] = TapDiff(max_abs, scale, max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else np.inf))
    return out


def first_divergent(taps_a: Mapping[str, np.ndarray], taps_b: Mapping[str, np.ndarray],
                    tolerance: float) -> tuple[str | None, dict[str, TapDiff]]:
    """The first tap (in tap order) whose max abs difference exceeds `tolerance` (None: every tap agrees), and
    every tap's figures. A NaN difference counts as over the tolerance."""
    diffs = tap_diffs(taps_a, taps_b)
    first = next((name for name, d in diffs.items() if not d.max_abs <= tolerance), None)
    return first, diffs
