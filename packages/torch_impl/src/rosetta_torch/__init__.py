"""Rosetta in PyTorch: the backend contract of rosetta_common.interface, from models.py, weights.py, train.py
and export.py; data-parallel training from distributed.py."""

import sys

from rosetta_common.interface import check_backend
from rosetta_torch.distributed import start_worker, stop_worker, train_data_parallel
from rosetta_torch.export import export_native, export_onnx, load_native
from rosetta_torch.models import build, forward_train, model_config, predict
from rosetta_torch.taps import forward_with_taps
from rosetta_torch.train import apply_optimizer, configure, make_optimizer, train
from rosetta_torch.weights import from_canonical, to_canonical

FRAMEWORK = "torch"

__all__ = ["FRAMEWORK", "apply_optimizer", "build", "configure", "export_native", "export_onnx", "forward_train",
           "forward_with_taps", "from_canonical", "load_native", "make_optimizer", "model_config", "predict",
           "start_worker", "stop_worker", "to_canonical", "train", "train_data_parallel"]

check_backend(sys.modules[__name__])  # a missing or misplaced contract function fails here, named
