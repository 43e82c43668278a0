"""ONNX Runtime sessions as every check opens them: onnx.checker first, the runner's thread count, TF32 off on a
GPU. The validate stage runs in an environment with no framework: these sessions are all it executes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from pipelines.checks.ledger import CheckError


def providers() -> list:
    """CPU, or CUDA first where onnxruntime-gpu finds a GPU; TF32 off there, since its ~1e-3 relative error
    would swamp fp32 parity (the CUDA provider enables TF32 by default)."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def open_session(path: Path) -> ort.InferenceSession:
    """onnx.checker then an ONNX Runtime session; any problem becomes a CheckError naming the file."""
    if not path.is_file():
        raise CheckError(f"{path}: ONNX file is missing")
    try:
        onnx.checker.check_model(str(path), full_check=True)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # The runner pins every runtime's threads (pipelines/environments.py): results must not depend on cores.
        options.intra_op_num_threads = int(os.environ.get("ROSETTA_THREADS", "2"))
        options.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), options, providers=providers())
    except Exception as error:  # onnx and onnxruntime raise several unrelated types
        raise CheckError(
            f"{path}: not a valid ONNX model ({type(error).__name__}: {str(error).splitlines()[0]})"
        ) from None


def run_onnx(session: ort.InferenceSession, images: np.ndarray) -> np.ndarray:
    name = session.get_inputs()[0].name
    return session.run(None, {name: images.astype(np.float32)})[0]
