"""A float64 numpy forward pass of every architecture, straight from the canonical weights.

It is the written-down meaning of each model: each framework's tests compare their native forward with it
(on deliberately asymmetric weights), which pins every transpose, name mapping and flatten permutation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from rosetta_common.inputs import padding_mask
from rosetta_common.spec import ModelConfig
from rosetta_common.taps import tap_names

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


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's "same" padding (Keras and Flax use it): ceil(size / stride) outputs; when the padding is
    odd, the extra row or column goes after (bottom, right). torch's `padding=1` pads both sides, and torch
    refuses padding="same" for strides above 1, so its models pad explicitly with these numbers."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def conv2d(x: np.ndarray, kernel: np.ndarray, stride: int = 1, padding: str = "same") -> np.ndarray:
    """x (B, H, W, C), kernel HWIO, no bias. padding "same" is same_padding's; "symmetric" pads (k - 1) // 2
    on every side, as torch's `padding=1` does for a 3x3 kernel (kept to show, in tests, what it changes)."""
    kh, kw = kernel.shape[:2]
    if padding == "same":
        pads = (same_padding(x.shape[1], kh, stride), same_padding(x.shape[2], kw, stride))
    else:
        pads = (((kh - 1) // 2,) * 2, ((kw - 1) // 2,) * 2)
    padded = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]
    return np.einsum("bhwcij,ijco->bhwo", windows, kernel)


def batch_norm(x: np.ndarray, w: Mapping[str, np.ndarray], prefix: str, momentum: float, eps: float,
               training: bool, statistics: dict[str, np.ndarray]) -> np.ndarray:
    """BatchNorm over every axis but the last. Inference: the running statistics. Training: the batch's mean
    and biased variance normalize, and the running statistics move by rosetta_common.registry.ResNetSpec's
    convention (running = momentum * running + (1 - momentum) * batch); the new values go to `statistics`."""
    mean, var = w[f"{prefix}.running_mean"], w[f"{prefix}.running_var"]
    if training:
        axes = tuple(range(x.ndim - 1))
        batch_mean = x.mean(axis=axes)
        batch_var = ((x - batch_mean) ** 2).mean(axis=axes)  # biased
        statistics[f"{prefix}.running_mean"] = momentum * mean + (1 - momentum) * batch_mean
        statistics[f"{prefix}.running_var"] = momentum * var + (1 - momentum) * batch_var
        mean, var = batch_mean, batch_var
    return (x - mean) / np.sqrt(var + eps) * w[f"{prefix}.scale"] + w[f"{prefix}.bias"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def lstm_states(x: np.ndarray, w: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """x (B, T, in) -> (hidden, cell) after every step, each (B, T, hidden); gates i, f, g, o; one bias."""
    hidden = w["lstm.recurrent_kernel"].shape[0]
    h = c = np.zeros((x.shape[0], hidden))
    hs, cs = [], []
    for t in range(x.shape[1]):
        z = x[:, t] @ w["lstm.kernel"] + h @ w["lstm.recurrent_kernel"] + w["lstm.bias"]
        i, f, g, o = np.split(z, 4, axis=-1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        hs.append(h)
        cs.append(c)
    return np.stack(hs, axis=1), np.stack(cs, axis=1)


def lstm_last_hidden(x: np.ndarray, w: Mapping[str, np.ndarray]) -> np.ndarray:
    """x (B, T, in) -> the last hidden state."""
    return lstm_states(x, w)[0][:, -1]


def gru_states(x: np.ndarray, w: Mapping[str, np.ndarray]) -> np.ndarray:
    """x (B, T, in) -> the hidden state after every step (B, T, hidden); torch's formula (Keras'
    reset_after=True), gates r, z, n."""
    hidden = w["gru.recurrent_kernel"].shape[0]
    h = np.zeros((x.shape[0], hidden))
    hs = []
    for t in range(x.shape[1]):
        xr, xz, xn = np.split(x[:, t] @ w["gru.kernel"] + w["gru.input_bias"], 3, axis=-1)
        hr, hz, hn = np.split(h @ w["gru.recurrent_kernel"] + w["gru.recurrent_bias"], 3, axis=-1)
        r, z = sigmoid(xr + hr), sigmoid(xz + hz)
        n = np.tanh(xn + r * hn)
        h = (1 - z) * n + z * h
        hs.append(h)
    return np.stack(hs, axis=1)


def gru_last_hidden(x: np.ndarray, w: Mapping[str, np.ndarray]) -> np.ndarray:
    """x (B, T, in) -> the last hidden state."""
    return gru_states(x, w)[:, -1]


def max_pool2x2(x: np.ndarray) -> np.ndarray:
    b, h, w, c = x.shape
    h2, w2 = h // 2, w // 2
    return x[:, : h2 * 2, : w2 * 2].reshape(b, h2, 2, w2, 2, c).max(axis=(2, 4))


def attention_block(h: np.ndarray, w: Mapping[str, np.ndarray], heads: int, eps: float,
                    key_mask: np.ndarray | None, t: dict[str, np.ndarray], biased_qkv: bool) -> np.ndarray:
    """The pre-norm encoder block (the attention model's and the text model's), filling its taps into `t`.
    `key_mask` (batch, tokens), True = attend: a False key gets weight exactly 0 (its score is -inf)."""
    batch, tokens, embed = h.shape
    hd = embed // heads

    def split(v: np.ndarray) -> np.ndarray:  # (B, T, E) -> (B, heads, T, head_dim)
        return v.reshape(batch, tokens, heads, hd).transpose(0, 2, 1, 3)

    n = t["block.norm1"] = layer_norm(h, w["block.norm1.scale"], w["block.norm1.bias"], eps)
    qkv = {}
    for p in ("query", "key", "value"):
        qkv[p] = split(n @ w[f"block.attn.{p}.kernel"] + (w[f"block.attn.{p}.bias"] if biased_qkv else 0.0))
        if not biased_qkv:  # the image attention model's own ops: q, k and v are taps
            t[f"block.attn.{p}"] = qkv[p]
    scores = qkv["query"] @ qkv["key"].transpose(0, 1, 3, 2) / math.sqrt(hd)
    if key_mask is not None:
        scores = np.where(np.asarray(key_mask, bool)[:, None, None, :], scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    t["block.attn.weights"] = scores / scores.sum(axis=-1, keepdims=True)
    attended = (t["block.attn.weights"] @ qkv["value"]).transpose(0, 2, 1, 3).reshape(batch, tokens, heads * hd)
    projected = attended @ w["block.attn.out.kernel"]
    t["block.attn.out"] = projected + w["block.attn.out.bias"]
    h = h + projected + w["block.attn.out.bias"]  # summed in this order since before the taps: same bits
    t["block.norm2"] = layer_norm(h, w["block.norm2.scale"], w["block.norm2.bias"], eps)
    t["block.mlp.fc1"] = t["block.norm2"] @ w["block.mlp.fc1.kernel"] + w["block.mlp.fc1.bias"]
    t["block.mlp.gelu"] = gelu(t["block.mlp.fc1"])
    projected = t["block.mlp.gelu"] @ w["block.mlp.fc2.kernel"]
    t["block.mlp.fc2"] = projected + w["block.mlp.fc2.bias"]
    t["block"] = h + projected + w["block.mlp.fc2.bias"]
    t["final_norm"] = layer_norm(t["block"], w["final_norm.scale"], w["final_norm.bias"], eps)
    return t["final_norm"]


def text_transformer(config: ModelConfig, w: Mapping[str, np.ndarray], tokens: np.ndarray, *,
                     key_mask: np.ndarray, pool_mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The text model's taps, float64. `key_mask` is which keys attention may read and `pool_mask` which positions
    the mean pools (default: key_mask); both True = a real token. The conformance suite plants mistakes through
    them (the mask inverted, padding pooled)."""
    a = config.settings
    pool_mask = key_mask if pool_mask is None else pool_mask
    t: dict[str, np.ndarray] = {}
    h = t["embed"] = w["embed.embedding"][tokens] + w["pos_embedding"][: tokens.shape[1]]
    z = attention_block(h, w, a.num_heads, a.layer_norm_eps, key_mask, t, biased_qkv=True)
    keep = np.asarray(pool_mask, np.float64)[..., None]
    t["pool"] = (z * keep).sum(axis=1) / keep.sum(axis=1)
    t["logits"] = t["pool"] @ w["head.kernel"] + w["head.bias"]
    return t


def forward(config: ModelConfig, weights: Mapping[str, np.ndarray], images: np.ndarray,
            padding: str = "same") -> np.ndarray:
    """Logits in float64 for images (batch, height, width), from canonical weights, in inference mode
    (BatchNorm uses its running statistics, no dropout). `padding` is conv2d's (tests plant "symmetric")."""
    return forward_with_taps(config, weights, images, padding=padding)["logits"]


def forward_train(config: ModelConfig, weights: Mapping[str, np.ndarray], images: np.ndarray,
                  dropout_mask: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One training-mode forward: BatchNorm normalizes with the batch's statistics, dropout multiplies by
    `dropout_mask` (rosetta_common.training.dropout_masks: 0 or 1 / (1 - rate); None: no dropout). Returns
    the logits and the updated running statistics (empty for models without BatchNorm)."""
    statistics: dict[str, np.ndarray] = {}
    logits = forward_with_taps(config, weights, images, training=True, dropout_mask=dropout_mask,
                               statistics=statistics)["logits"]
    return logits, statistics


def forward_with_taps(config: ModelConfig, weights: Mapping[str, np.ndarray], images: np.ndarray, *,
                      padding: str = "same", training: bool = False, dropout_mask: np.ndarray | None = None,
                      statistics: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every tap of rosetta_common.taps, float64, in tap order: the one forward of every architecture, which
    `forward` and `forward_train` read the logits of. Inference mode by default; `training` is forward_train's
    mode (batch statistics, the new running statistics written to `statistics`, `dropout_mask` applied to the
    pooled features after the `pool` tap)."""
    out = _forward(config, weights, images, training, dropout_mask, {} if statistics is None else statistics,
                   padding)
    names = tap_names(config)
    assert list(out) == names, (list(out), names)  # the forward computes the taps in the canonical order
    return out


def _forward(config: ModelConfig, weights: Mapping[str, np.ndarray], images: np.ndarray, training: bool,
             dropout_mask: np.ndarray | None, statistics: dict[str, np.ndarray],
             padding: str) -> dict[str, np.ndarray]:
    arch = config.arch
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    if arch == "text_transformer":
        return text_transformer(config, w, np.asarray(images), key_mask=padding_mask(images))
    x = np.asarray(images, np.float64)
    batch = x.shape[0]
    t: dict[str, np.ndarray] = {}  # the taps, filled in the order they are computed
    if arch == "mlp":
        t["hidden"] = x.reshape(batch, -1) @ w["hidden.kernel"] + w["hidden.bias"]
        t["hidden.relu"] = np.maximum(t["hidden"], 0.0)
        t["logits"] = t["hidden.relu"] @ w["head.kernel"] + w["head.bias"]
    elif arch == "cnn":
        t["conv1"] = conv3x3_same(x[..., None], w["conv1.kernel"], w["conv1.bias"])
        t["conv1.relu"] = np.maximum(t["conv1"], 0.0)
        t["pool"] = max_pool2x2(t["conv1.relu"])
        t["conv2"] = conv3x3_same(t["pool"], w["conv2.kernel"], w["conv2.bias"])
        t["conv2.relu"] = np.maximum(t["conv2"], 0.0)
        t["logits"] = t["conv2.relu"].reshape(batch, -1) @ w["head.kernel"] + w["head.bias"]  # (h, w, c) order
    elif arch == "attention":
        a = config.settings
        h = t["embed"] = x @ w["embed.kernel"] + w["embed.bias"] + w["pos_embedding"]
        attention_block(h, w, a.num_heads, a.layer_norm_eps, None, t, biased_qkv=False)
        t["pool"] = t["final_norm"].mean(axis=1)
        t["logits"] = t["pool"] @ w["head.kernel"] + w["head.bias"]
    elif arch == "resnet":
        r = config.settings

        def conv_bn(v: np.ndarray, conv: str, bn: str, stride: int) -> np.ndarray:
            t[conv] = conv2d(v, w[f"{conv}.kernel"], stride, padding)
            t[bn] = batch_norm(t[conv], w, bn, r.batchnorm_momentum, r.batchnorm_epsilon, training, statistics)
            return t[bn]

        h = t["stem.relu"] = np.maximum(conv_bn(x[..., None], "stem.conv", "stem.bn", 1), 0.0)
        shortcut = conv_bn(h, "block.shortcut.conv", "block.shortcut.bn", 2)
        t["block.relu1"] = np.maximum(conv_bn(h, "block.conv1", "block.bn1", 2), 0.0)
        y = conv_bn(t["block.relu1"], "block.conv2", "block.bn2", 1)
        t["block"] = np.maximum(y + shortcut, 0.0)
        pooled = t["pool"] = t["block"].mean(axis=(1, 2))
        if training and dropout_mask is not None:
            pooled = pooled * np.asarray(dropout_mask, np.float64)
        t["logits"] = pooled @ w["head.kernel"] + w["head.bias"]
    elif arch == "lstm":
        t["lstm.hidden"], t["lstm.cell"] = lstm_states(x, w)
        t = {"lstm.cell": t["lstm.cell"], "lstm.hidden": t["lstm.hidden"]}  # c_t comes first in every step
        t["logits"] = t["lstm.hidden"][:, -1] @ w["head.kernel"] + w["head.bias"]
    elif arch == "gru":
        t["gru.hidden"] = gru_states(x, w)
        t["logits"] = t["gru.hidden"][:, -1] @ w["head.kernel"] + w["head.bias"]
    else:
        raise ValueError(f"architecture {arch!r} is unknown")
    return t
