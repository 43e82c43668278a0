"""The three architectures as plain `nn.Module`s, written the way the PyTorch docs write them.

Attribute names mirror the canonical weight names (`block.attn.query`, `head`, ...), so the state dict's
keys are the canonical names with `kernel`/`scale` read as `weight`; `weights.py` holds the layout
conversion (transposes, and the CNN head's row permutation) in one place.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rosetta_common.spec import AttentionSpec, CNNSpec, MLPSpec, ModelConfig
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
        # Written out with tensor ops, as the reference article does, rather than F.scaled_dot_product_attention:
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


class Block(nn.Module):
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
        self.block = Block(embed_dim, num_heads, mlp_dim, eps)
        self.final_norm = nn.LayerNorm(embed_dim, eps=eps)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, H, W): H tokens of W features
        x = self.embed(images) + self.pos_embedding
        x = self.final_norm(self.block(x))
        return self.head(x.mean(dim=1))


def make_module(config: ModelConfig) -> nn.Module:
    """A freshly initialised module of `config.arch`, recording `config` as `model.config`.

    The module keeps the validated config (not a dict or a name): weights.py maps its weights to and from
    canonical ones with it, and export.py stores it as JSON beside the state dict so that the module can be
    rebuilt without the spec.
    """
    (height, width), num_classes, s = config.image_shape, config.num_classes, config.settings
    if isinstance(s, MLPSpec):
        model: nn.Module = MLP(height * width, s.hidden, num_classes)
    elif isinstance(s, CNNSpec):
        model = CNN(s.conv1_filters, s.conv2_filters, (height // 2, width // 2), num_classes)
    elif isinstance(s, AttentionSpec):
        model = AttentionClassifier(height, width, s.embed_dim, s.num_heads, s.mlp_dim, s.layer_norm_eps,
                                    num_classes)
    else:  # ModelConfig admits only the architectures above; a new one needs a module here
        raise ValueError(f"architecture {config.arch!r} has no torch module")
    model.config = config
    return model


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def build(config: ModelConfig, weights: Weights) -> nn.Module:
    """The torch module of `config` holding copies of these canonical weights (checked: WeightsError), on the
    default device, in eval mode."""
    model = make_module(config)
    from_canonical(model, weights)  # checks the weights, then copies them in (load_state_dict copies)
    return model.to(default_device()).eval()


@torch.inference_mode()
def predict(model: nn.Module, images: np.ndarray) -> np.ndarray:
    """Logits (batch, classes) float32 for images (batch, height, width) float32 in [0, 1]."""
    model.eval()
    x = torch.as_tensor(np.asarray(images, np.float32), device=model_device(model))
    return model(x).float().cpu().numpy()


def model_config(model: nn.Module) -> ModelConfig:
    """The validated config `model` was built from."""
    return model.config
