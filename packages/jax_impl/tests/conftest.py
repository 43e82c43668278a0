"""Shared small specs and data: tests use the real framework on tiny problems so the suite stays fast."""

from __future__ import annotations

import numpy as np
import pytest
import rosetta_jax
from rosetta_common.data import Dataset
from rosetta_common.spec import Spec, parse_spec

ARCHS = ("mlp", "cnn", "attention")
IMAGE_SHAPE = (8, 8)
NUM_CLASSES = 10


def small_spec(**train: object) -> Spec:
    """Small architectures (fast), otherwise params.yaml's defaults; `train` overrides the train section."""
    return parse_spec({
        "architecture": {"mlp": {"hidden": 32}, "cnn": {"conv1_filters": 4, "conv2_filters": 8},
                         "attention": {"embed_dim": 32, "num_heads": 4, "mlp_dim": 48}},
        "train": {"epochs": 2, "batch_size": 16, **train},
    })


def learnable_data(n_train: int = 128, n_test: int = 32, seed: int = 0) -> Dataset:
    """Random images with labels from a fixed random linear map of the pixels: learnable, unlike noise."""
    rng = np.random.default_rng(seed)
    images = rng.random((n_train + n_test, *IMAGE_SHAPE), dtype=np.float32)
    projection = rng.normal(size=(IMAGE_SHAPE[0] * IMAGE_SHAPE[1], NUM_CLASSES))
    labels = (images.reshape(len(images), -1) - 0.5) @ projection
    labels = labels.argmax(axis=1).astype(np.int64)
    return Dataset(images[:n_train], labels[:n_train], images[n_train:], labels[n_train:])


@pytest.fixture(scope="session", autouse=True)
def _configure() -> None:
    rosetta_jax.configure(0)


@pytest.fixture(scope="session")
def spec() -> Spec:
    return small_spec()


@pytest.fixture(scope="session")
def images() -> np.ndarray:
    return np.random.default_rng(7).random((7, *IMAGE_SHAPE), dtype=np.float32)
