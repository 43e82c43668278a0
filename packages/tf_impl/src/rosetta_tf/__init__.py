"""Rosetta's models, training and export in TensorFlow / Keras 3: the backend contract of
rosetta_common.interface."""

import os
import sys

# Keras 3 picks its backend on first import; this package is the TensorFlow one.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras

if keras.backend.backend() != "tensorflow":
    raise ImportError(f"rosetta_tf needs KERAS_BACKEND=tensorflow, not {keras.backend.backend()!r}")

from rosetta_common.interface import check_backend
from rosetta_tf.distributed import start_worker, stop_worker, train_data_parallel
from rosetta_tf.export import export_native, export_onnx, load_native
from rosetta_tf.models import build, forward_train, model_config, predict
from rosetta_tf.taps import forward_with_taps
from rosetta_tf.train import apply_optimizer, configure, make_optimizer, train
from rosetta_tf.weights import from_canonical, to_canonical

FRAMEWORK = "tf"

__all__ = [
    "FRAMEWORK",
    "apply_optimizer",
    "build",
    "configure",
    "export_native",
    "export_onnx",
    "forward_train",
    "forward_with_taps",
    "from_canonical",
    "load_native",
    "make_optimizer",
    "model_config",
    "predict",
    "start_worker",
    "stop_worker",
    "to_canonical",
    "train",
    "train_data_parallel",
]

check_backend(sys.modules[__name__])  # a missing or misplaced contract function fails here, by name
