"""The architectures: one entry each, from which every list of models is derived.

An entry holds what the framework-free parts of the project need to know of a model: its section of params.yaml
(the settings class), what it reads, its family (which tap layouts and per-framework branches apply), the default
learning rates and accuracy floor, the ops its forward uses (the TPU's derived bounds, tooling/devices/tpu_bounds.py),
and the settings of the small model the packages' tests build. The spec's defaults (rosetta_common.spec), the tiny
run, the benchmarks' model lists and the tests' expectations read it; the framework packages build each model from
its settings. Adding a model is one entry here plus its builder, weight map and taps in each package
(CONTRIBUTING.md, "Adding a model"). An architecture with no entry is one error everywhere: `entry(name)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rosetta_common.errors import RosettaError

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Probability = Annotated[float, Field(gt=0, lt=1)]


class SpecError(RosettaError, ValueError):
    """A params.yaml problem, phrased as one line for the user."""


# Every section of params.yaml: unknown keys refused, frozen (hashable, so JAX can keep a config as static data).
SECTION_CONFIG = ConfigDict(extra="forbid", frozen=True)


class Section(BaseModel):
    model_config = SECTION_CONFIG


# ---------------------------------------------------------------- each architecture's section of params.yaml


class MLPSpec(Section):
    hidden: PositiveInt = 256


class CNNSpec(Section):
    conv1_filters: PositiveInt = 32
    conv2_filters: PositiveInt = 64


class EncoderSpec(Section):
    """What both attention models' sections hold (their defaults differ), checked alike."""

    section: ClassVar[str]
    embed_dim: PositiveInt
    num_heads: PositiveInt
    mlp_dim: PositiveInt
    layer_norm_eps: PositiveFloat = 1e-5

    @model_validator(mode="after")
    def _heads_divide_embed(self) -> EncoderSpec:
        if self.embed_dim % self.num_heads:
            raise ValueError(f"architecture.{self.section}.num_heads = {self.num_heads}: must divide embed_dim "
                             f"({self.embed_dim})")
        return self

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


class AttentionSpec(EncoderSpec):
    section: ClassVar[str] = "attention"
    embed_dim: PositiveInt = 512
    num_heads: PositiveInt = 8
    mlp_dim: PositiveInt = 512


class ResNetSpec(Section):
    stem_filters: PositiveInt = 16
    block_filters: PositiveInt = 32
    # Dropout before the head, training only. Its masks are drawn once, in common, from the seed
    # (rosetta_common.training.dropout_masks), so the three frameworks drop the same units at every step.
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.2
    # One convention for BatchNorm, mapped to each framework's in its package:
    # running = momentum * running + (1 - momentum) * batch statistic (Keras' and Flax's meaning; torch's
    # `momentum` argument is 1 - this), and the running variance averages the biased batch variance, the one
    # that normalizes the batch (Keras and Flax do; torch averages the unbiased one and is corrected).
    batchnorm_momentum: Probability = 0.9
    batchnorm_epsilon: PositiveFloat = 1e-5  # torch's and Flax's default (Keras' is 1e-3)


class LSTMSpec(Section):
    hidden: PositiveInt = 128  # each image row is one time step; the last hidden state feeds the head


class GRUSpec(Section):
    hidden: PositiveInt = 128  # torch's formula: the reset gate applies after the recurrent matmul + bias


class TextTransformerSpec(EncoderSpec):
    """The text classifier: token embedding plus learned positions, one pre-norm encoder block whose attention
    ignores padded keys, a final LayerNorm, the mean over real tokens, a dense head (rosetta_common.reference)."""

    section: ClassVar[str] = "text_transformer"
    embed_dim: PositiveInt = 64
    num_heads: PositiveInt = 4
    mlp_dim: PositiveInt = 128


# ---------------------------------------------------------------- the forward's op uses (TPU bounds)

# The recurrent models' time steps: one image row each (8 x 8 digits), what the recorded TPU bounds assume.
STEPS = 8
LAYER_NORM = {"mean": 1, "variance": 1, "rsqrt": 1}  # a LayerNorm or a BatchNorm on the batch's statistics


def times(uses: Mapping[str, int], n: int) -> dict[str, int]:
    """`uses` repeated `n` times (a recurrent model's step, each of several norms)."""
    return {op: count * n for op, count in uses.items()}


def plus(*parts: Mapping[str, int]) -> dict[str, int]:
    """The op uses of several parts of one forward, added."""
    total: dict[str, int] = {}
    for part in parts:
        for op, count in part.items():
            total[op] = total.get(op, 0) + count
    return total


# ---------------------------------------------------------------- the registry


@dataclass(frozen=True)
class ArchitectureEntry:
    """One architecture: what the framework-free code knows of it (module docstring)."""

    name: str
    settings: type[Section]
    reads: Literal["images", "tokens"]
    # dense | conv (NHWC image activations, torch's NCHW transposed) | encoder (attention block, per-head q, k, v)
    # | recurrent (a hidden state per time step)
    family: Literal["dense", "conv", "encoder", "recurrent"]
    adam_rate: float  # the default learning rates (optimizers.<name>.learning_rate)
    sgd_rate: float
    min_test_accuracy: float  # the default floor on digits (quality.min_test_accuracy)
    ops: Mapping[str, int]  # the forward's op uses to the logits (the loss aside), as the packages build it
    small: Mapping[str, Any]  # the small model of the packages' tests (rosetta_common.testing): settings
    tiny: Mapping[str, Any]  # the tiny run's (tooling/build/tiny_run.py, the whole pipeline in minutes): settings over
    tiny_floor: float  # the defaults, and its accuracy floor after 2 epochs


REGISTRY: dict[str, ArchitectureEntry] = {e.name: e for e in (
    ArchitectureEntry(
        "mlp", MLPSpec, reads="images", family="dense", adam_rate=3e-3, sgd_rate=0.05, min_test_accuracy=0.95,
        ops={"matmul": 2},
        small={"hidden": 32}, tiny={}, tiny_floor=0.5),
    ArchitectureEntry(
        "cnn", CNNSpec, reads="images", family="conv", adam_rate=3e-3, sgd_rate=0.03, min_test_accuracy=0.95,
        ops={"conv": 2, "matmul": 1},
        small={"conv1_filters": 4, "conv2_filters": 8}, tiny={}, tiny_floor=0.5),
    ArchitectureEntry(
        "attention", AttentionSpec, reads="images", family="encoder", adam_rate=3e-4, sgd_rate=0.005,
        min_test_accuracy=0.93,
        # embed, q, k, v, out, fc1, fc2, head; scores and weighted values; three LayerNorms; the token mean
        ops=plus({"matmul": 8, "einsum": 2, "softmax": 1, "gelu": 1, "mean": 1}, times(LAYER_NORM, 3)),
        small={"embed_dim": 32, "num_heads": 4, "mlp_dim": 48},
        tiny={"embed_dim": 32, "num_heads": 4, "mlp_dim": 32}, tiny_floor=0.3),
    ArchitectureEntry(
        "resnet", ResNetSpec, reads="images", family="conv", adam_rate=1e-3, sgd_rate=0.03, min_test_accuracy=0.95,
        # stem, two block convolutions and the shortcut, each with a BatchNorm on the batch's statistics; the pool
        ops=plus({"conv": 4, "matmul": 1, "mean": 1}, times(LAYER_NORM, 4)),
        small={"stem_filters": 4, "block_filters": 6}, tiny={"stem_filters": 8, "block_filters": 16},
        tiny_floor=0.3),
    ArchitectureEntry(
        "lstm", LSTMSpec, reads="images", family="recurrent", adam_rate=3e-3, sgd_rate=0.1, min_test_accuracy=0.93,
        # per step: the input and recurrent products, three sigmoid gates, two tanh; then the head
        ops=plus(times({"matmul": 2, "sigmoid": 3, "tanh": 2}, STEPS), {"matmul": 1}),
        small={"hidden": 12}, tiny={"hidden": 32}, tiny_floor=0.3),
    ArchitectureEntry(
        "gru", GRUSpec, reads="images", family="recurrent", adam_rate=3e-3, sgd_rate=0.05, min_test_accuracy=0.93,
        ops=plus(times({"matmul": 2, "sigmoid": 2, "tanh": 1}, STEPS), {"matmul": 1}),
        small={"hidden": 10}, tiny={"hidden": 32}, tiny_floor=0.3),
    ArchitectureEntry(
        "text_transformer", TextTransformerSpec, reads="tokens", family="encoder", adam_rate=1e-3, sgd_rate=0.05,
        min_test_accuracy=0.7,
        # q, k, v, out, fc1, fc2, head; scores and weighted values; three LayerNorms; the masked token mean
        ops=plus({"matmul": 7, "einsum": 2, "softmax": 1, "gelu": 1, "mean": 1}, times(LAYER_NORM, 3)),
        small={"embed_dim": 16, "num_heads": 4, "mlp_dim": 24},
        tiny={"embed_dim": 16, "num_heads": 2, "mlp_dim": 32}, tiny_floor=0.5),
)}

ARCHITECTURES: tuple[str, ...] = tuple(REGISTRY)


def entry(name: str) -> ArchitectureEntry:
    """`name`'s entry; SpecError, one line naming it and the architectures there are, for any other name."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise SpecError(f"architecture = {name!r}: unknown; allowed: {', '.join(ARCHITECTURES)}") from None


def of_reading(reads: str) -> tuple[str, ...]:
    """The architectures that read `reads` ("images" or "tokens"), in the registry's order."""
    return tuple(name for name, e in REGISTRY.items() if e.reads == reads)


def not_built(name: str, package: str) -> NotImplementedError:
    """The one error of a framework package asked for an architecture it has no builder for (a registered one whose
    package side is still to write, CONTRIBUTING.md's "Adding a model"; an unknown one is `entry`'s SpecError)."""
    entry(name)
    return NotImplementedError(f"architecture = {name!r}: registered, but {package} does not build it yet "
                               "(CONTRIBUTING.md, 'Adding a model')")
