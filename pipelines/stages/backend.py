"""Load a framework package through the one interface that all three implement."""

from __future__ import annotations

import importlib
from types import ModuleType

from rosetta_common.interface import check_backend

MODULES = {"torch": "rosetta_torch", "tf": "rosetta_tf", "jax": "rosetta_jax"}


def load_backend(framework: str, seed: int) -> ModuleType:
    module = importlib.import_module(MODULES[framework])
    check_backend(module)
    module.configure(seed)
    return module
