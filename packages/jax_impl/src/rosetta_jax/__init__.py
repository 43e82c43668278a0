"""Rosetta in JAX/Flax (NNX) with Optax: the Backend interface of rosetta_common.interface."""

from rosetta_jax.export import export_native, export_onnx, load_native, predict
from rosetta_jax.train import configure, train
from rosetta_jax.weights import build, canonical_weights

FRAMEWORK = "jax"

__all__ = ["FRAMEWORK", "build", "canonical_weights", "configure", "export_native", "export_onnx",
           "load_native", "predict", "train"]
