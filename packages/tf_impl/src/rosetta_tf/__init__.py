"""Rosetta's models, training and export in TensorFlow / Keras 3 (the rosetta_common.interface Backend)."""

import os

# Keras 3 picks its backend on first import; this package is the TensorFlow one.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras

if keras.backend.backend() != "tensorflow":
    raise ImportError(f"rosetta_tf needs KERAS_BACKEND=tensorflow, not {keras.backend.backend()!r}")

from rosetta_tf.export import export_native, export_onnx, load_native, predict
from rosetta_tf.train import configure, train
from rosetta_tf.weights import build, canonical_weights

FRAMEWORK = "tf"

__all__ = ["FRAMEWORK", "build", "canonical_weights", "configure", "export_native", "export_onnx",
           "load_native", "predict", "train"]
