"""Shared setup: determinism switched on once, and a Keras warning that is not ours filtered."""

from __future__ import annotations

import pytest

import rosetta_tf


def pytest_configure(config: pytest.Config) -> None:
    # Keras 3.15's convert_to_numpy calls np.array on TF tensors, which numpy 2.4 flags; not ours to fix.
    config.addinivalue_line(
        "filterwarnings", "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
    )


@pytest.fixture(scope="session", autouse=True)
def _configured() -> None:
    rosetta_tf.configure(0)
