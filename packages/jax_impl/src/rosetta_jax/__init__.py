"""Rosetta in JAX/Flax (NNX) with Optax: the backend contract of rosetta_common.interface."""

import sys

from rosetta_common.interface import check_backend
from rosetta_jax.distributed import start_worker, stop_worker, train_data_parallel
from rosetta_jax.export import export_native, export_onnx, load_native
from rosetta_jax.models import build, forward_train, model_config, predict
from rosetta_jax.taps import forward_with_taps
from rosetta_jax.train import apply_optimizer, configure, make_optimizer, train
from rosetta_jax.weights import from_canonical, to_canonical

FRAMEWORK = "jax"

__all__ = ["FRAMEWORK", "apply_optimizer", "build", "configure", "export_native", "export_onnx", "forward_train",
           "forward_with_taps", "from_canonical", "load_native", "make_optimizer", "model_config", "predict",
           "start_worker", "stop_worker", "to_canonical", "train", "train_data_parallel"]

check_backend(sys.modules[__name__])
