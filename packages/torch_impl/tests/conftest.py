"""Fixtures shared by the tests: configure torch once, a small spec, a few images."""

from __future__ import annotations

import numpy as np
import pytest

import rosetta_torch
from rosetta_common.spec import Spec
from rosetta_common.testing import IMAGE_SHAPE, small_spec


@pytest.fixture(scope="session", autouse=True)
def _configure() -> None:
    rosetta_torch.configure(0)


@pytest.fixture(scope="session")
def spec() -> Spec:
    return small_spec()


@pytest.fixture(scope="session")
def images() -> np.ndarray:
    return np.random.default_rng(7).random((7, *IMAGE_SHAPE), dtype=np.float32)
