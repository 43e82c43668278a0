"""The ONNX Runtime model server: every model.onnx of an artifacts folder, in the validation environment.

    python -m pipelines.runner validation -- python -m pipelines.serve_onnx --artifacts artifacts/torch \
        --init artifacts/init --http-port 8506 --grpc-port 8507

KServe's ModelServer, V1 and V2 over REST and V2 over gRPC on 127.0.0.1, one line on stdout when ready, a clean
stop on SIGTERM or SIGINT; the same command line, names and answers as rosetta_torch.serve, rosetta_tf.serve and
rosetta_jax.serve (rosetta_common.serving). It lives here because the validation environment has no framework
package: rosetta_common and the repository root are what it can import. Beside each model.onnx it serves the run
folder's init.onnx as <model>-init: the framework's model of the canonical init weights (`--init`'s file, checked
to be there as every server checks it), as train_export exported it. Its sessions are opened by
pipelines/onnx_sessions.py, as the validate stage opens its own (onnx.checker first, the runner's thread count, one
inter-op thread, TF32 off on a GPU), so it serves the logits that stage judged; tests/test_serving.py checks them
bit for bit against sessions opened by pipelines/checks/sessions.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.onnx_sessions import open_checked
from rosetta_common import serving
from rosetta_common.errors import ArtifactError
from rosetta_common.onnx_conventions import BATCH_DIM, INPUT_NAME, OUTPUT_NAME

kserve = serving.import_kserve()  # not `import kserve`: it would parse our command line

SERVER = "onnx"
SERVED_FILE = Path("model.onnx")
INIT_FILE = Path("init.onnx")  # train_export's export of the model built from the canonical init weights


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
    """One ONNX file of a run folder (model.onnx; init.onnx for <model>-init) in an ONNX Runtime session, opened
    once."""

    def __init__(self, name: str, run_dir: Path, file: Path = SERVED_FILE) -> None:
        super().__init__(name)
        self.run_dir, self.file = run_dir, file

    def load(self) -> bool:
        path = self.run_dir / self.file
        session = open_checked(path)
        self.signature = signature_of(session, path)
        self.forward = lambda images: session.run(None, {INPUT_NAME: np.asarray(images, np.float32)})[0]
        self.ready = True
        return self.ready


def init_model(name: str, run_dir: Path, init_file: Path) -> OnnxModel:
    """<model>-init: the run folder's init.onnx. `init_file` (the canonical weights it was exported from) is not
    read here: ONNX Runtime runs the graph, which holds those weights already."""
    return OnnxModel(name, run_dir, INIT_FILE)


def main(argv: list[str] | None = None) -> int:
    return serving.main(argv, server=SERVER, served_file=SERVED_FILE, model=OnnxModel, init_model=init_model)


if __name__ == "__main__":
    raise SystemExit(main())
