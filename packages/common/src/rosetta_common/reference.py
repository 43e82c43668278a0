"""A float64 numpy forward pass of every architecture, straight from the canonical weights.

It is the written-down meaning of each model: each framework's tests compare their native forward with it
(on deliberately asymmetric weights), which pins every transpose, name mapping and flatten permutation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from rosetta_common.spec import ModelConfig

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x), as torch's nn.GELU() and Keras' gelu(approximate=False) compute it."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, two-pass
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def conv3x3_same(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """x (B, H, W, C), kernel HWIO (3, 3, C, O), stride 1, zero padding 1 ('SAME')."""
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))  # (B, H, W, C, 3, 3)
    return np.einsum("bhwcij,ijco->bhwo", windows, kernel) + bias


def max_pool2x2(x: np.ndarray) -> np.ndarray:
    b, h, w, c = x.shape
    h2, w2 = h // 2, w // 2
    return x[:, : h2 * 2, : w2 * 2].reshape(b, h2, 2, w2, 2, c).max(axis=(2, 4))


def forward(config: ModelConfig, weights: Mapping[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    """Logits in float64 for images (batch, height, width), from canonical weights."""
    arch = config.arch
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    x = np.asarray(images, np.float64)
    batch = x.shape[0]
    if arch == "mlp":
        h = np.maximum(x.reshape(batch, -1) @ w["hidden.kernel"] + w["hidden.bias"], 0.0)
        return h @ w["head.kernel"] + w["head.bias"]
    if arch == "cnn":
        h = np.maximum(conv3x3_same(x[..., None], w["conv1.kernel"], w["conv1.bias"]), 0.0)
        h = max_pool2x2(h)
        h = np.maximum(conv3x3_same(h, w["conv2.kernel"], w["conv2.bias"]), 0.0)
        return h.reshape(batch, -1) @ w["head.kernel"] + w["head.bias"]  # (h, w, c) flatten order
    if arch == "attention":
        a = config.settings
        eps, heads, hd = a.layer_norm_eps, a.num_heads, a.head_dim
        h = x @ w["embed.kernel"] + w["embed.bias"] + w["pos_embedding"]
        tokens = h.shape[1]

        def split(t: np.ndarray) -> np.ndarray:  # (B, T, E) -> (B, heads, T, head_dim)
            return t.reshape(batch, tokens, heads, hd).transpose(0, 2, 1, 3)

        n = layer_norm(h, w["block.norm1.scale"], w["block.norm1.bias"], eps)
        q, k, v = (split(n @ w[f"block.attn.{p}.kernel"]) for p in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attended = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, tokens, heads * hd)
        h = h + attended @ w["block.attn.out.kernel"] + w["block.attn.out.bias"]
        n = layer_norm(h, w["block.norm2.scale"], w["block.norm2.bias"], eps)
        m = gelu(n @ w["block.mlp.fc1.kernel"] + w["block.mlp.fc1.bias"])
        h = h + m @ w["block.mlp.fc2.kernel"] + w["block.mlp.fc2.bias"]
        h = layer_norm(h, w["final_norm.scale"], w["final_norm.bias"], eps).mean(axis=1)
        return h @ w["head.kernel"] + w["head.bias"]
    raise ValueError(f"architecture {arch!r} is unknown; allowed: mlp, cnn, attention")
