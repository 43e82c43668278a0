"""Which architectures the package under test implements (rosetta_common.interface.architectures): the text model
is being added package by package, and a test of an architecture a package does not list is skipped, saying so."""

from __future__ import annotations

from types import ModuleType

import pytest

from rosetta_common.interface import architectures


def skip_unless_implemented(backend: ModuleType, arch: str) -> None:
    if arch not in architectures(backend):
        pytest.skip(f"{backend.__name__} does not implement {arch} yet (its TOKEN_MODELS)")
