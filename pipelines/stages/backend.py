"""Load a framework package through the one contract that all three implement (rosetta_common.interface)."""

from __future__ import annotations

from types import ModuleType

from rosetta_common.data import Dataset
from rosetta_common.interface import load_backend as import_backend
from rosetta_common.spec import ModelConfig, Spec


def load_backend(framework: str, seed: int) -> ModuleType:
    """The package for `framework`, seeded and in deterministic mode (its import checks the contract)."""
    module = import_backend(framework)
    module.configure(seed)
    return module


def model_config(spec: Spec, arch: str, data: Dataset) -> ModelConfig:
    """The model's config: the spec's architecture section and the prepared data's image shape and classes."""
    return ModelConfig.of(spec, arch, data.image_shape, data.num_classes)
