"""Shared fixtures: a small spec (fast), learnable random data, and determinism switched on once."""

from __future__ import annotations

import numpy as np
import pytest

import rosetta_tf
from rosetta_common.data import Dataset
from rosetta_common.spec import Spec
from rosetta_common.testing import IMAGE_SHAPE, NUM_CLASSES, small_spec


def pytest_configure(config: pytest.Config) -> None:
    # Keras 3.15's convert_to_numpy calls np.array on TF tensors, which numpy 2.4 flags; not ours to fix.
    config.addinivalue_line(
        "filterwarnings", "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
    )


@pytest.fixture(scope="session", autouse=True)
def _configured() -> None:
    rosetta_tf.configure(0)


@pytest.fixture(scope="session")
def spec() -> Spec:
    return small_spec()


def make_data(n_train: int = 96, n_test: int = 32, shape: tuple[int, int] = IMAGE_SHAPE) -> Dataset:
    """Noisy copies of one random prototype per class, so a few steps of training can lower the loss."""
    rng = np.random.default_rng(0)
    prototypes = rng.random((NUM_CLASSES, *shape), dtype=np.float32)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, NUM_CLASSES, n)
        noise = rng.normal(0.0, 0.2, (n, *shape)).astype(np.float32)
        return np.clip(prototypes[labels] + noise, 0.0, 1.0).astype(np.float32), labels.astype(np.int64)

    return Dataset(*split(n_train), *split(n_test))


@pytest.fixture(scope="session")
def data() -> Dataset:
    return make_data()
