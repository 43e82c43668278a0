"""ONNX Runtime sessions as every check opens them (pipelines/onnx_sessions.py: onnx.checker first, the runner's
thread count, TF32 off on a GPU; the ONNX model server opens its own with the same module). The validate stage
runs in an environment with no framework: these sessions are all it executes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipelines.checks.ledger import CheckError
from pipelines.onnx_sessions import open_checked
from rosetta_common.errors import ArtifactError


def open_session(path: Path, threads: int | None = None) -> ort.InferenceSession:
    """onnx.checker then an ONNX Runtime session (on `threads`, where given: the count the file's export
    recorded); any problem becomes a CheckError naming the file."""
    try:
        return open_checked(path, threads)
    except ArtifactError as error:
        raise CheckError(str(error)) from None


def run_onnx(session: ort.InferenceSession, inputs: np.ndarray) -> np.ndarray:
    """The session's logits for images (float32) or token ids (int64: passed as they are)."""
    name = session.get_inputs()[0].name
    return session.run(None, {name: inputs if inputs.dtype == np.int64 else inputs.astype(np.float32)})[0]
