"""The seven architectures as plain `nn.Module`s, and the contract's build(), predict(), model_config() and
forward_train().

Written the way the PyTorch docs write models, with torch's own layers (nn.Conv2d, nn.BatchNorm2d, nn.Dropout,
nn.LSTM, nn.GRU, nn.Embedding, nn.MultiheadAttention) and no hand-rolled math, so that what Rosetta compares is
torch as people use it. Attribute names mirror the canonical weight names (`block.attn.query`, `block.bn1`, `lstm`,
`head`, ...), so weights.py maps the state dict by name and holds every layout change in one place. Where torch's
layers do not follow the spec (BatchNorm's momentum and running variance, "same" padding at stride 2, dropout's
generator, the attention mask's polarity, the padding row), the spec's convention is set where the layer is made,
and the code that sets it says how (batchnorm_momentum, BatchNorm2d, same_pad, ResNet.forward, attention_mask).

What differs between the frameworks, and how each package reconciles it: docs/conventions.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rosetta_common.inputs import PAD_ID
from rosetta_common.reference import same_padding
from rosetta_common.registry import (
    AttentionSpec,
    CNNSpec,
    GRUSpec,
    LSTMSpec,
    MLPSpec,
    ResNetSpec,
    TextTransformerSpec,
    not_built,
)
from rosetta_common.spec import ModelConfig
from rosetta_common.training import dropout_features
from rosetta_common.weights import Weights
from rosetta_torch.weights import from_canonical


class MLP(nn.Module):
    """Flatten, Linear + ReLU, Linear."""

    def __init__(self, in_features: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_features, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, H, W)
        return self.head(F.relu(self.hidden(images.flatten(1))))


class CNN(nn.Module):
    """Conv3x3 + ReLU, MaxPool 2x2, Conv3x3 + ReLU, flatten (NCHW: channel, height, width), Linear."""

    def __init__(self, conv1_filters: int, conv2_filters: int, pooled_hw: tuple[int, int], num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, conv1_filters, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(conv1_filters, conv2_filters, kernel_size=3, padding=1)
        self.head = nn.Linear(conv2_filters * math.prod(pooled_hw), num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, H, W)
        x = F.relu(self.conv1(images.unsqueeze(1)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.conv2(x))
        return self.head(x.flatten(1))


class SelfAttention(nn.Module):
    """Multi-head self-attention: bias-free query/key/value projections, an output projection with bias."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()  # AttentionSpec has checked that num_heads divides embed_dim
        self.num_heads = num_heads
        self.query = nn.Linear(embed_dim, embed_dim, bias=False)
        self.key = nn.Linear(embed_dim, embed_dim, bias=False)
        self.value = nn.Linear(embed_dim, embed_dim, bias=False)
        self.out = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, E)
        batch, tokens, embed = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:  # (B, T, E) -> (B, heads, T, head_dim)
            return t.view(batch, tokens, self.num_heads, embed // self.num_heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        # Written out with tensor ops rather than F.scaled_dot_product_attention:
        # the reader sees the same four steps as in the Keras and Flax files.
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        attended = scores.softmax(dim=-1) @ v
        return self.out(attended.transpose(1, 2).reshape(batch, tokens, embed))


class FeedForward(nn.Module):
    def __init__(self, embed_dim: int, mlp_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block."""

    def __init__(self, embed_dim: int, num_heads: int, mlp_dim: int, eps: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim, eps=eps)
        self.attn = SelfAttention(embed_dim, num_heads)
        self.norm2 = nn.LayerNorm(embed_dim, eps=eps)
        self.mlp = FeedForward(embed_dim, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class AttentionClassifier(nn.Module):
    """Each image row is a token: Linear embedding + learned positions, one block, LayerNorm, mean, Linear."""

    def __init__(self, height: int, width: int, embed_dim: int, num_heads: int, mlp_dim: int, eps: float,
                 num_classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(width, embed_dim)
        self.pos_embedding = nn.Parameter(torch.zeros(height, embed_dim))
        self.block = EncoderBlock(embed_dim, num_heads, mlp_dim, eps)
        self.final_norm = nn.LayerNorm(embed_dim, eps=eps)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, H, W): H tokens of W features
        x = self.embed(images) + self.pos_embedding
        x = self.final_norm(self.block(x))
        return self.head(x.mean(dim=1))


def batchnorm_momentum(momentum: float) -> float:
    """torch's BatchNorm `momentum` (the new batch's weight) for the spec's (the old average's weight)."""
    return 1.0 - momentum


def corrected_running_var(running_var: torch.Tensor, previous: torch.Tensor, momentum: float, n: int) -> torch.Tensor:
    """torch's running-variance update, which averages the unbiased batch variance, turned into the spec's, which
    averages the biased one (exact algebra, no batch statistic recomputed): torch made
    new = (1 - momentum) * previous + momentum * var * n / (n - 1), so momentum * var * n / (n - 1) is
    new - (1 - momentum) * previous, and the spec's value is new - (new - (1 - momentum) * previous) / n."""
    return running_var - (running_var - (1.0 - momentum) * previous) / n


class BatchNorm2d(nn.BatchNorm2d):
    """torch's BatchNorm2d (its own kernel normalizes and updates the statistics), whose running variance
    follows the spec: after every training-mode forward, torch's update with the unbiased batch variance is
    corrected to the biased one (corrected_running_var), in the training loop and in forward_train alike. In
    eval mode it is nn.BatchNorm2d unchanged, so exports see only torch's op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.track_running_stats):
            return super().forward(x)
        previous = self.running_var.clone()
        out = super().forward(x)
        with torch.no_grad():
            # A new tensor, not an in-place update: autograd saved the buffer torch's kernel just wrote, and an
            # in-place change would fail the backward's version check.
            self.running_var = corrected_running_var(self.running_var, previous, self.momentum, x.numel() // x.shape[1])
        return out


# torch's `padding=1` pads both sides, and torch refuses padding="same" for strides above 1: every ResNet conv is
# preceded by an explicit nn.ZeroPad2d with TensorFlow's padding, the spec's (the extra row/column at the bottom/right).
def same_pad(size: tuple[int, int], kernel: int, stride: int) -> nn.ZeroPad2d:
    """TensorFlow's "same" padding for an input of `size` (height, width), as nn.ZeroPad2d's
    (left, right, top, bottom)."""
    top, bottom = same_padding(size[0], kernel, stride)
    left, right = same_padding(size[1], kernel, stride)
    return nn.ZeroPad2d((left, right, top, bottom))


def conv_out(size: tuple[int, int], stride: int) -> tuple[int, int]:
    """Output size of a "same" convolution: ceil(size / stride)."""
    return -(-size[0] // stride), -(-size[1] // stride)


def conv(in_channels: int, out_channels: int, kernel: int, stride: int) -> nn.Conv2d:
    """A bias-free convolution (a BatchNorm follows every one), unpadded: the same_pad before it gives it
    TensorFlow's "same" padding, the spec's."""
    return nn.Conv2d(in_channels, out_channels, kernel, stride=stride, bias=False)


def batchnorm(channels: int, momentum: float, eps: float) -> BatchNorm2d:
    """BatchNorm2d (above) with the spec's momentum converted to torch's (batchnorm_momentum) and its epsilon."""
    return BatchNorm2d(channels, eps=eps, momentum=batchnorm_momentum(momentum))


class ConvBN(nn.Module):
    """ZeroPad2d ("same"), Conv2d without bias, BatchNorm2d: `conv` and `bn` as the canonical names have them."""

    def __init__(self, size: tuple[int, int], in_channels: int, out_channels: int, kernel: int, stride: int,
                 momentum: float, eps: float) -> None:
        super().__init__()
        self.pad = same_pad(size, kernel, stride)
        self.conv = conv(in_channels, out_channels, kernel, stride)
        self.bn = batchnorm(out_channels, momentum, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(self.pad(x)))


class ResidualBlock(nn.Module):
    """conv3x3 stride 2 + BN + ReLU, conv3x3 + BN; shortcut conv1x1 stride 2 + BN; add; ReLU.

    The canonical names are block.conv1 / block.bn1 (not block.conv1.conv), so the two main-path convs keep
    their padding, conv and norm as separate attributes; the shortcut is one ConvBN (block.shortcut.conv/bn)."""

    def __init__(self, size: tuple[int, int], in_channels: int, filters: int, momentum: float, eps: float) -> None:
        super().__init__()
        half = conv_out(size, 2)
        self.pad1 = same_pad(size, 3, 2)
        self.conv1 = conv(in_channels, filters, 3, 2)
        self.bn1 = batchnorm(filters, momentum, eps)
        self.pad2 = same_pad(half, 3, 1)
        self.conv2 = conv(filters, filters, 3, 1)
        self.bn2 = batchnorm(filters, momentum, eps)
        self.shortcut = ConvBN(size, in_channels, filters, 1, 2, momentum, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(self.pad1(x))))
        y = self.bn2(self.conv2(self.pad2(y)))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """Stem (conv3x3 + BN + ReLU), one residual block, global average pool, dropout, Linear."""

    def __init__(self, image_shape: tuple[int, int], spec: ResNetSpec, num_classes: int) -> None:
        super().__init__()
        m, eps = spec.batchnorm_momentum, spec.batchnorm_epsilon
        self.stem = ConvBN(image_shape, 1, spec.stem_filters, 3, 1, m, eps)
        self.block = ResidualBlock(image_shape, spec.stem_filters, spec.block_filters, m, eps)
        self.dropout = nn.Dropout(spec.dropout)
        self.head = nn.Linear(spec.block_filters, num_classes)

    def forward(self, images: torch.Tensor, dropout_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = F.relu(self.stem(images.unsqueeze(1)))
        pooled = self.block(x).mean(dim=(2, 3))
        # Training with a mask: nn.Dropout would draw its mask from torch's generator, which TF's and JAX's cannot
        # reproduce, so the three frameworks would drop different units and their losses part at the first step;
        # the mask drawn once in common (0 or 1 / (1 - rate), inverted dropout as nn.Dropout scales) keeps them
        # step for step alike. Otherwise nn.Dropout: the identity in eval mode, which every export runs.
        dropped = pooled * dropout_mask if self.training and dropout_mask is not None else self.dropout(pooled)
        return self.head(dropped)


class LSTMClassifier(nn.Module):
    """Each image row is a time step: nn.LSTM (one layer, batch_first), the last hidden state, Linear.

    torch's LSTM has two biases (bias_ih, bias_hh) where the canonical layout, Keras and Flax have one: the
    canonical bias goes to bias_ih_l0 (weights.py), and bias_hh_l0 stays zero and frozen, so that the model
    trains one bias as the other frameworks do (two trainable copies would move their sum twice as fast)."""

    def __init__(self, width: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(width, hidden, batch_first=True)
        self.lstm.bias_hh_l0.requires_grad_(False)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, H, W): H steps of W features
        outputs, _ = self.lstm(images)
        return self.head(outputs[:, -1])  # one layer: the last step's output is the last hidden state


class GRUClassifier(nn.Module):
    """Each image row is a time step: nn.GRU (one layer, batch_first), the last hidden state, Linear. torch's
    GRU formula is the spec's (Keras' reset_after=True): both biases are canonical and trained."""

    def __init__(self, width: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.gru = nn.GRU(width, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, H, W): H steps of W features
        outputs, _ = self.gru(images)
        return self.head(outputs[:, -1])


def padding_mask(tokens: torch.Tensor) -> torch.Tensor:
    """(B, T) bool, True where a position holds a real token (rosetta_common.inputs.padding_mask's polarity, the
    "attend" one): the pooling's weights, and negated, torch's key_padding_mask."""
    return tokens != PAD_ID


def attention_mask(mask: torch.Tensor) -> torch.Tensor:
    """The attention layer's mask for a padding_mask: nn.MultiheadAttention's key_padding_mask, whose True means
    IGNORE that key, the opposite of Keras' attention_mask, Flax's mask and F.scaled_dot_product_attention's boolean
    attn_mask."""
    return ~mask


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over the real tokens of each row, (B, T, E) -> (B, E): padded positions are left out."""
    weights = mask.unsqueeze(-1).to(x.dtype)
    return (x * weights).sum(dim=1) / weights.sum(dim=1)


class TextEncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block around torch's nn.MultiheadAttention (one fused in_proj for q, k, v, all
    with biases; out_proj), the padded keys masked by key_padding_mask. Written out rather than
    nn.TransformerEncoderLayer: its inference fast path turns a padded batch into a nested tensor and returns zeros
    at the padded positions, where the spec computes every position as a query."""

    def __init__(self, embed_dim: int, num_heads: int, mlp_dim: int, eps: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim, eps=eps)
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, bias=True, batch_first=True)
        self.norm2 = nn.LayerNorm(embed_dim, eps=eps)
        self.mlp = FeedForward(embed_dim, mlp_dim)
        # The key bias is frozen (rosetta_common.weights.FROZEN): its rows of the fused in_proj_bias get no gradient,
        # so Adam leaves them exactly as loaded. A hook, not requires_grad: the q and v rows of the same tensor train.
        key_rows = torch.arange(embed_dim, 2 * embed_dim)
        self.attn.in_proj_bias.register_hook(lambda grad: grad.index_fill(0, key_rows.to(grad.device), 0.0))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B, T, E), (B, T) True = token
        n = self.norm1(x)
        # No attention weights asked for: torch then runs scaled_dot_product_attention (the taps ask for them).
        attended, _ = self.attn(n, n, n, key_padding_mask=attention_mask(mask), need_weights=False)
        x = x + attended
        return x + self.mlp(self.norm2(x))


class TextTransformer(nn.Module):
    """Token ids (B, T), 1 <= T <= max_length, PAD_ID padding: nn.Embedding (padding_idx: its row starts at zero and
    never gets a gradient) + learned positions 0..T-1, one block, LayerNorm, the mean over real tokens, Linear."""

    def __init__(self, vocab_size: int, max_length: int, spec: TextTransformerSpec, num_classes: int) -> None:
        super().__init__()
        e, eps = spec.embed_dim, spec.layer_norm_eps
        self.embed = nn.Embedding(vocab_size, e, padding_idx=PAD_ID)
        self.pos_embedding = nn.Parameter(torch.zeros(max_length, e))
        self.block = TextEncoderBlock(e, spec.num_heads, spec.mlp_dim, eps)
        self.final_norm = nn.LayerNorm(e, eps=eps)
        self.head = nn.Linear(e, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) int64
        mask = padding_mask(tokens)
        x = self.embed(tokens) + self.pos_embedding[: tokens.shape[1]]
        x = self.final_norm(self.block(x, mask))
        return self.head(masked_mean(x, mask))


def create(config: ModelConfig) -> nn.Module:
    """A freshly initialised module of `config.arch`, recording `config` as `model.config`.

    The module keeps the validated config (not a dict or a name): weights.py maps its weights to and from
    canonical ones with it, and export.py stores it as JSON beside the state dict so that the module can be
    rebuilt without the spec.
    """
    num_classes, s = config.num_classes, config.settings
    height, width = config.image_shape or (0, 0)  # a token model has none
    if isinstance(s, TextTransformerSpec):
        model: nn.Module = TextTransformer(config.vocab_size, config.max_length, s, num_classes)
    elif isinstance(s, MLPSpec):
        model = MLP(height * width, s.hidden, num_classes)
    elif isinstance(s, CNNSpec):
        model = CNN(s.conv1_filters, s.conv2_filters, (height // 2, width // 2), num_classes)
    elif isinstance(s, AttentionSpec):
        model = AttentionClassifier(height, width, s.embed_dim, s.num_heads, s.mlp_dim, s.layer_norm_eps,
                                    num_classes)
    elif isinstance(s, ResNetSpec):
        model = ResNet((height, width), s, num_classes)
    elif isinstance(s, LSTMSpec):
        model = LSTMClassifier(width, s.hidden, num_classes)
    elif isinstance(s, GRUSpec):
        model = GRUClassifier(width, s.hidden, num_classes)
    else:
        raise not_built(config.arch, "rosetta_torch")
    model.config = config
    return model


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def build(config: ModelConfig, weights: Weights) -> nn.Module:
    """The torch module of `config` holding copies of these canonical weights (checked: WeightsError), on the
    default device, in eval mode."""
    model = create(config)
    from_canonical(model, weights)  # checks the weights, then copies them in (load_state_dict copies)
    return model.to(default_device()).eval()


def model_config(model: nn.Module) -> ModelConfig:
    """The validated config `model` was built from."""
    return model.config


def model_input(model: nn.Module, x: np.ndarray) -> torch.Tensor:
    """The model's input as a tensor on its device: images as float32; token ids checked first
    (config.input.check: an id outside the vocabulary, another dtype, a sequence longer than max_length or a row
    of padding alone is one InputError line, not an IndexError or NaN from inside torch)."""
    spec = model.config.input
    if spec.kind == "tokens":
        return torch.as_tensor(spec.check(x, spec.name), device=model_device(model))
    return torch.as_tensor(np.asarray(x, np.float32), device=model_device(model))


@contextlib.contextmanager
def exported_attention() -> Iterator[None]:
    """nn.MultiheadAttention as torch.export and torch.onnx see it: its inference fast path
    (torch._native_multi_head_attention, taken in eval mode without a gradient) rounds otherwise than the
    F.multi_head_attention_forward the exporters trace, by up to 1.4e-6 in the logits (native_roundtrip_abs is
    1e-6); with it off, predict runs model.pt2's ops, bit for bit. The switch is torch's own, process-wide
    (torch.backends.mha), restored after; no other model has an nn.MultiheadAttention."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


@torch.inference_mode()
def predict(model: nn.Module, inputs: np.ndarray) -> np.ndarray:
    """Logits (batch, classes) float32 for images (batch, height, width) float32 in [0, 1], or token ids
    int64 (batch, length), 1 <= length <= max_length, PAD_ID padding (checked: InputError)."""
    model.eval()
    x = model_input(model, inputs)
    with exported_attention():
        return model(x).float().cpu().numpy()


def training_view(model: nn.Module) -> nn.Module:
    """The module a training step runs: torch keeps the mode on the module itself, so this is `model` switched to
    train() mode (BatchNorm on the batch's statistics, updating its running ones); eval() switches it back."""
    return model.train()


def check_dropout_mask(config: ModelConfig, dropout_mask: np.ndarray | None, batch: int) -> None:
    """Raise ValueError (one line) unless `dropout_mask` fits the model: None for a model without dropout,
    else (batch, features)."""
    if dropout_mask is None:
        return
    features = dropout_features(config)
    shape = tuple(np.shape(dropout_mask))
    if features is None:
        raise ValueError(f"dropout_mask of shape {shape}: {config.arch} has no dropout (allowed: None)")
    if shape != (batch, features):
        raise ValueError(f"dropout_mask of shape {shape}: {config.arch} needs (batch, features) = {(batch, features)}")


def forward_logits(model: nn.Module, images: torch.Tensor, dropout_mask: torch.Tensor | None) -> torch.Tensor:
    """The model's forward, with the step's dropout mask for a model that has dropout (the ResNet)."""
    return model(images) if dropout_mask is None else model(images, dropout_mask=dropout_mask)


@torch.no_grad()
def forward_train(model: nn.Module, images: np.ndarray, dropout_mask: np.ndarray | None) -> np.ndarray:
    """One training-mode forward as a training step runs it, without a gradient: BatchNorm normalizes with the
    batch's statistics and updates its running statistics in place by the spec's convention (momentum
    converted, running variance corrected to the biased batch variance: BatchNorm2d), dropout multiplies by
    `dropout_mask` (None: no dropout). The model is back in eval mode after."""
    config: ModelConfig = model.config
    check_dropout_mask(config, dropout_mask, len(images))
    device = model_device(model)
    x = model_input(model, images)
    features = dropout_features(config)
    if dropout_mask is None and features is not None:
        # The contract's None means no dropout; in train() mode nn.Dropout would drop units at random instead.
        dropout_mask = np.ones((len(images), features), np.float32)
    mask = None if dropout_mask is None else torch.as_tensor(np.asarray(dropout_mask, np.float32), device=device)
    try:
        out = forward_logits(training_view(model), x, mask)
    finally:
        model.eval()
    return out.float().cpu().numpy()
