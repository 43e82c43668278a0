"""Small specs, asymmetric weights and learnable data for the framework packages' tests: the same tiny
problems in all three, so their suites stay fast and can be read side by side."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from rosetta_common.data import Dataset
from rosetta_common.inputs import random_batch, random_tokens
from rosetta_common.registry import ARCHITECTURES, REGISTRY, entry
from rosetta_common.spec import TOKEN_ARCHITECTURES, ModelConfig, Spec, parse_spec
from rosetta_common.taps import first_divergent
from rosetta_common.weights import Weights, canonical_shapes, random_weights

# The architectures the tests build and train: every registered one, or those this variable names (comma- or
# space-separated; `make test-model MODEL=cnn`), in the registry's order. An unknown name is entry()'s SpecError.
MODELS_VARIABLE = "ROSETTA_TEST_MODELS"


def models_under_test(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    named = [entry(name).name for name in environ.get(MODELS_VARIABLE, "").replace(",", " ").split()]
    return tuple(name for name in ARCHITECTURES if not named or name in named)


ARCHS = models_under_test()
IMAGE_SHAPE = (8, 8)
NUM_CLASSES = 10
VOCAB_SIZE = 50  # the small token model's vocabulary and maximum length
MAX_LENGTH = 12


def small_spec(**train: object) -> Spec:
    """Small architectures (fast: each registry entry's `small` settings), otherwise params.yaml's defaults; `train`
    overrides the train section."""
    return parse_spec({
        "architecture": {name: dict(e.small) for name, e in REGISTRY.items()},
        "train": {"epochs": 2, "batch_size": 16, **train},
        # one number for every model, so the optimizer references can take spec.optimizers.* as they are
        "optimizers": {"adam": {"learning_rate": 1e-3}, "sgd": {"learning_rate": 0.05}},
    })


def small_config(arch: str, image_shape: tuple[int, int] = IMAGE_SHAPE, spec: Spec | None = None) -> ModelConfig:
    """The small model of `arch`: of `image_shape` images, or (token models) of VOCAB_SIZE ids and MAX_LENGTH."""
    if arch in TOKEN_ARCHITECTURES:
        return ModelConfig.of_tokens(spec or small_spec(), arch, VOCAB_SIZE, MAX_LENGTH, NUM_CLASSES)
    return ModelConfig.of(spec or small_spec(), arch, image_shape, NUM_CLASSES)


def random_inputs(config: ModelConfig, batch: int, seed: int, length: int | None = None) -> np.ndarray:
    """Random valid inputs for `config`: images in [0, 1), or padded token ids (rosetta_common.inputs)."""
    return random_batch(config.input, batch, seed, length)


def asymmetric_weights(config: ModelConfig, seed: int) -> Weights:
    return random_weights(canonical_shapes(config), seed)


def learnable_data(n_train: int = 128, n_test: int = 32, seed: int = 0,
                   image_shape: tuple[int, int] = IMAGE_SHAPE, tokens: bool = False) -> Dataset:
    """Random images with labels from a fixed random linear map of the pixels: learnable, unlike noise. With
    `tokens`, padded token ids (VOCAB_SIZE, MAX_LENGTH) labelled by a random linear map of their counts."""
    rng = np.random.default_rng(seed)
    if tokens:
        ids = random_tokens(rng, n_train + n_test, MAX_LENGTH, VOCAB_SIZE)
        counts = np.stack([np.bincount(row, minlength=VOCAB_SIZE)[1:] for row in ids]).astype(np.float64)
        counts /= counts.sum(axis=1, keepdims=True)
        projection = rng.normal(size=(VOCAB_SIZE - 1, NUM_CLASSES))
        labels = (counts @ projection).argmax(axis=1).astype(np.int64)
        return Dataset(ids[:n_train], labels[:n_train], ids[n_train:], labels[n_train:])
    images = rng.random((n_train + n_test, *image_shape), dtype=np.float32)
    projection = rng.normal(size=(image_shape[0] * image_shape[1], NUM_CLASSES))
    labels = ((images.reshape(len(images), -1) - 0.5) @ projection).argmax(axis=1).astype(np.int64)
    return Dataset(images[:n_train], labels[:n_train], images[n_train:], labels[n_train:])


def swap_blocks(value: np.ndarray, blocks: int, a: int, b: int) -> np.ndarray:
    """Swap gate blocks a and b along the last axis (a gate order mapped wrongly)."""
    parts = np.split(value, blocks, axis=-1)
    parts[a], parts[b] = parts[b], parts[a]
    return np.concatenate(parts, axis=-1)


# A planted mistake must miss, where it enters, by this many tolerances at least: 10, not the 100 of the logits
# checks, because the tanh GELU is never more than 4.7e-4 from the exact one (at |x| near 2), 47 tolerances.
PLANTED_FACTOR = 10


def assert_localized(taps: dict[str, np.ndarray], reference: dict[str, np.ndarray], enters: str,
                     tolerance: float) -> None:
    """A planted mistake shows first at `enters`: every tap before it within `tolerance` of the reference, and
    `enters` off by far more (PLANTED_FACTOR tolerances), so the localization is no rounding accident."""
    first, diffs = first_divergent(taps, reference, tolerance)
    figures = "; ".join(f"{name}: {d.max_abs:.2e} abs, {d.rel:.1e} rel" for name, d in diffs.items())
    assert first == enters, f"first divergent tap {first}, the mistake enters at {enters}: {figures}"
    names = list(diffs)
    assert all(diffs[name].max_abs <= tolerance for name in names[: names.index(enters)]), figures
    assert diffs[enters].max_abs > PLANTED_FACTOR * tolerance, figures


def planted_case(arch: str, seed: int, image_shape: tuple[int, int] = (7, 10),
                 batch: int = 3) -> tuple[ModelConfig, Weights, np.ndarray]:
    """A config, asymmetric weights and a few images for planting a mistake: an odd height by default, so that
    the stride-2 "same" padding is (1, 1) down and (0, 1) across."""
    config = small_config(arch, image_shape)
    if arch in TOKEN_ARCHITECTURES:
        return config, asymmetric_weights(config, seed), random_inputs(config, batch, seed)
    images = np.random.default_rng(seed).random((batch, *image_shape), dtype=np.float32)
    return config, asymmetric_weights(config, seed), images
