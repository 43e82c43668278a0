"""Rosetta's framework-neutral core: spec, data, canonical weights, metrics. Imports no framework."""

__version__ = "0.1.0"

ARCHITECTURES = ("mlp", "cnn", "attention")
FRAMEWORKS = ("torch", "tf", "jax")
