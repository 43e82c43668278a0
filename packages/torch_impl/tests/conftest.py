"""Fixtures of rosetta_torch's own tests (the conformance suite covers the contract): torch configured once,
a few images."""

from __future__ import annotations

import numpy as np
import pytest

import rosetta_torch
from rosetta_common.testing import IMAGE_SHAPE


@pytest.fixture(scope="session", autouse=True)
def _configure() -> None:
    rosetta_torch.configure(0)


@pytest.fixture(scope="session")
def images() -> np.ndarray:
    return np.random.default_rng(7).random((7, *IMAGE_SHAPE), dtype=np.float32)
