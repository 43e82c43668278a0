"""Rosetta in PyTorch: rosetta_common.interface's Backend, built from models.py, weights.py, train.py and
export.py."""

from rosetta_torch.export import export_native, export_onnx, load_native
from rosetta_torch.models import predict
from rosetta_torch.train import configure, train
from rosetta_torch.weights import build, canonical_weights

FRAMEWORK = "torch"

__all__ = ["FRAMEWORK", "build", "canonical_weights", "configure", "export_native", "export_onnx",
           "load_native", "predict", "train"]
