"""Fixtures of rosetta_jax's own tests (what the conformance suite cannot see): JAX configured once."""

from __future__ import annotations

import pytest

import rosetta_jax


@pytest.fixture(scope="session", autouse=True)
def _configure() -> None:
    rosetta_jax.configure(0)  # before any JAX computation: it sets XLA_FLAGS and the matmul precision
