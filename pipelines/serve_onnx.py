"""The ONNX Runtime model server: every model.onnx of an artifacts folder, in the validation environment.

    python -m pipelines.runner validation -- python -m pipelines.serve_onnx --artifacts artifacts/torch \
        --http-port 8506 --grpc-port 8507

KServe's ModelServer, V1 and V2 over REST and V2 over gRPC on 127.0.0.1, one line on stdout when ready, a clean
stop on SIGTERM or SIGINT; the same command line, names and answers as rosetta_torch.serve, rosetta_tf.serve and
rosetta_jax.serve (rosetta_common.serving). It lives here because the validation environment has no framework
package: rosetta_common and the repository root are what it can import. Its sessions are opened as the validate
stage opens its own (pipelines/checks/sessions.py: onnx.checker first, the runner's thread count, one inter-op
thread, TF32 off on a GPU), so it serves the logits that stage judged; tests/test_serving.py checks them bit for bit
against sessions opened by that module. Not imported from there: pipelines.checks imports pipelines' own modules,
and one of those importing it back would be a cycle between the two (tests/test_imports.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from rosetta_common import serving
from rosetta_common.errors import ArtifactError, one_line
from rosetta_common.onnx_conventions import BATCH_DIM, INPUT_NAME, OUTPUT_NAME

kserve = serving.import_kserve()  # not `import kserve`: it would parse our command line

SERVER = "onnx"
SERVED_FILE = Path("model.onnx")


def open_session(path: Path) -> ort.InferenceSession:
    """onnx.checker, then a session with the settings of pipelines/checks/sessions.py; ArtifactError naming the file
    when either refuses it."""
    if not path.is_file():
        raise ArtifactError(f"{path}: ONNX file is missing")
    try:
        onnx.checker.check_model(str(path), full_check=True)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # The runner pins every runtime's threads (pipelines/environments.py): results must not depend on cores.
        options.intra_op_num_threads = int(os.environ.get("ROSETTA_THREADS", "2"))
        options.inter_op_num_threads = 1
        # CUDA first where onnxruntime-gpu finds a GPU, TF32 off there (its ~1e-3 would swamp float32 parity).
        providers: list = ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"use_tf32": 0}))
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as error:  # onnx and onnxruntime raise several unrelated types
        raise ArtifactError(f"{path}: not a valid ONNX model ({type(error).__name__}: "
                            f"{one_line(str(error))})") from None


def signature_of(session: object, path: Path) -> serving.Signature:
    """The model's signature from the graph, by the ONNX conventions: input "images" (batch, height, width),
    output "logits" (batch, classes), the batch dynamic. ArtifactError naming the file when they are not met."""
    inputs, outputs = session.get_inputs(), session.get_outputs()  # type: ignore[attr-defined]
    shapes = [info.shape for info in (*inputs, *outputs)]
    if ([i.name for i in inputs], [o.name for o in outputs]) != ([INPUT_NAME], [OUTPUT_NAME]) or [
            len(s) for s in shapes] != [3, 2] or any(s[0] != BATCH_DIM for s in shapes) or not all(
            isinstance(d, int) for s in shapes for d in s[1:]):
        found = ", ".join(f"{info.name} {info.shape}" for info in (*inputs, *outputs))
        raise ArtifactError(f"{path}: graph {found} breaks the ONNX conventions; allowed: {INPUT_NAME} "
                            f"[{BATCH_DIM}, height, width], {OUTPUT_NAME} [{BATCH_DIM}, classes]")
    (_, height, width), (_, classes) = shapes
    return serving.Signature(height=height, width=width, classes=classes)


class OnnxModel(serving.ServedModel, kserve.Model):
    """One run folder's model.onnx in an ONNX Runtime session, opened once."""

    def __init__(self, name: str, run_dir: Path) -> None:
        super().__init__(name)
        self.run_dir = run_dir

    def load(self) -> bool:
        path = self.run_dir / SERVED_FILE
        session = open_session(path)
        self.signature = signature_of(session, path)
        self.forward = lambda images: session.run(None, {INPUT_NAME: np.asarray(images, np.float32)})[0]
        self.ready = True
        return self.ready


def main(argv: list[str] | None = None) -> int:
    return serving.main(argv, server=SERVER, served_file=SERVED_FILE, model=OnnxModel)


if __name__ == "__main__":
    raise SystemExit(main())
