"""ONNX Runtime sessions as Rosetta opens every one: onnx.checker first, the runner's thread count, one inter-op
thread, idle threads that block, CUDA first where onnxruntime-gpu finds a GPU with TF32 off there.

Written once for the two places that run ONNX files: the validate stage's checks (pipelines/checks/sessions.py)
and the ONNX model server (pipelines/serving/onnx.py), so the server answers with the very settings whose logits
validate judged. It is one of pipelines' own modules and imports none of them: pipelines.checks imports pipelines'
own modules, so this cannot live in pipelines.checks without the ONNX server importing it back, a cycle between
the two packages (tests/unit/test_imports.py)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnxruntime as ort

from rosetta_common.errors import ArtifactError, one_line


def providers() -> list:
    """CPU, or CUDA first where onnxruntime-gpu finds a GPU; TF32 off there, since its ~1e-3 relative error
    would swamp fp32 parity (the CUDA provider enables TF32 by default)."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def session_options(threads: int | None = None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # The runner pins every runtime's threads (pipelines/environments.py): results must not depend on cores.
    # `threads`, where given, is the count an export recorded: a session of its file then computes what the
    # exporting stage's and its server's sessions computed, bit for bit, whatever this process's ROSETTA_THREADS.
    options.intra_op_num_threads = threads or int(os.environ.get("ROSETTA_THREADS", "2"))
    options.inter_op_num_threads = 1
    # Idle intra-op threads block instead of spinning (ONNX Runtime spins by default, between and after runs):
    # the validator interleaves short runs with numpy, and a server waits between requests, so a spinning thread
    # only takes the core the Python thread or another process needs. How threads wait changes no result. Measured
    # (the tiny run's validate stage, 876 checks, alone on 2 cores): 2.5 s and 3.3 CPU-s against 3.7 s and 6.4.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def open_checked(path: Path, threads: int | None = None) -> ort.InferenceSession:
    """onnx.checker (full check), then a session with these settings; ArtifactError naming the file when the file
    is missing or either refuses it."""
    if not path.is_file():
        raise ArtifactError(f"{path}: ONNX file is missing")
    try:
        onnx.checker.check_model(str(path), full_check=True)
        return ort.InferenceSession(str(path), session_options(threads), providers=providers())
    except Exception as error:  # onnx and onnxruntime raise several unrelated types
        raise ArtifactError(f"{path}: not a valid ONNX model ({type(error).__name__}: "
                            f"{one_line(str(error))})") from None
