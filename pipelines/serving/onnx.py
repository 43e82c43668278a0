"""The ONNX Runtime model server: every model.onnx of an artifacts folder, in the validation environment.

    python -m pipelines.runner validation -- python -m pipelines.serving.onnx --artifacts artifacts/torch \
        --init artifacts/init --http-port 8506 --grpc-port 8507

The same command line, names and answers as rosetta_torch.serve, rosetta_tf.serve and rosetta_jax.serve
(rosetta_common.serving); in `pipelines` because the validation environment has no framework package. Beside each
model.onnx it serves the run folder's init.onnx as <model>-init (the framework's model of the canonical init
weights, as train_export exported it). Its sessions are opened by pipelines/onnx_sessions.py, as the validate
stage opens its own, so it serves the logits that stage judged. The graph holds no ModelConfig, so a model's
signature is read from the graph by the ONNX conventions, and a token model's bounds from its canonical weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.onnx_sessions import open_checked
from rosetta_common.errors import ArtifactError, RosettaError, one_line
from rosetta_common.onnx_conventions import BATCH_DIM, INPUT_NAME, LENGTH_DIM, OUTPUT_NAME, TOKENS_NAME
from rosetta_common.serving import server
from rosetta_common.serving.requests import RAW, AnySignature, Signature, TokenSignature
from rosetta_common.spec import TOKEN_ARCHITECTURES
from rosetta_common.weights import load_weights, read_metadata

SERVER = "onnx"
SERVED_FILE = Path("model.onnx")
INIT_FILE = Path("init.onnx")  # train_export's export of the model built from the canonical init weights
# The run's trained weights in the canonical layout (pipelines/paths.py trained_weights), the same model as
# model.onnx: where a token model's vocabulary, maximum length and classes are read (the graph has neither bound).
TRAINED_FILE = Path("trained.safetensors")
# A token model's canonical tensors that fix its input's bounds (rosetta_common.weights.canonical_shapes):
# embed.embedding (vocab_size, e), pos_embedding (max_length, e), head.bias (classes,).
VOCAB_TENSOR, POSITIONS_TENSOR, CLASSES_TENSOR = "embed.embedding", "pos_embedding", "head.bias"


def token_bounds(weights_file: Path) -> tuple[int, int, int]:
    """(vocab_size, max_length, classes) of a token model from its canonical weights (the run's trained weights
    for model.onnx, the canonical init weights for init.onnx): the ModelConfig the graph was exported from lives
    in each framework's native format, which this environment cannot read, and those tensors' shapes are its
    vocab_size, max_length and num_classes by the canonical layout. ArtifactError naming the file otherwise."""
    try:
        arch = read_metadata(weights_file).get("architecture")
        weights = load_weights(weights_file)
    except RosettaError as error:
        raise ArtifactError(f"{weights_file}: the token model's canonical weights are not readable "
                            f"({one_line(str(error))})") from None
    shapes = {name: tuple(weights[name].shape) for name in (VOCAB_TENSOR, POSITIONS_TENSOR, CLASSES_TENSOR)
              if name in weights}
    if arch not in TOKEN_ARCHITECTURES or len(shapes) != 3 or len(shapes[VOCAB_TENSOR]) != 2 or len(
            shapes[POSITIONS_TENSOR]) != 2 or len(shapes[CLASSES_TENSOR]) != 1:
        raise ArtifactError(f"{weights_file}: not a token model's canonical weights (architecture {arch!r}, "
                            f"{shapes}); allowed: {', '.join(TOKEN_ARCHITECTURES)} with {VOCAB_TENSOR}, "
                            f"{POSITIONS_TENSOR}, {CLASSES_TENSOR}")
    return shapes[VOCAB_TENSOR][0], shapes[POSITIONS_TENSOR][0], shapes[CLASSES_TENSOR][0]


def signature_of(session: object, path: Path, weights_file: Path | None = None) -> AnySignature:
    """The model's signature from the graph, by the ONNX conventions: input "images" (batch, height, width) float,
    or "tokens" (batch, length) int64 with both dynamic, output "logits" (batch, classes), the batch dynamic. A
    token model's bounds come from `weights_file` (token_bounds), its classes checked against the graph's.
    ArtifactError naming the file when the conventions are not met."""
    inputs, outputs = session.get_inputs(), session.get_outputs()  # type: ignore[attr-defined]
    shapes = [info.shape for info in (*inputs, *outputs)]
    names = ([i.name for i in inputs], [o.name for o in outputs])
    if names == ([TOKENS_NAME], [OUTPUT_NAME]):
        (batch, length), logits = shapes
        if (inputs[0].type != "tensor(int64)" or batch != BATCH_DIM or length != LENGTH_DIM or len(logits) != 2
                or logits[0] != BATCH_DIM or not isinstance(logits[1], int)):
            raise ArtifactError(f"{path}: graph {TOKENS_NAME} {inputs[0].type} {inputs[0].shape}, {OUTPUT_NAME} "
                                f"{logits} breaks the ONNX conventions; allowed: {TOKENS_NAME} tensor(int64) "
                                f"[{BATCH_DIM}, {LENGTH_DIM}], {OUTPUT_NAME} [{BATCH_DIM}, classes]")
        if weights_file is None:
            raise ArtifactError(f"{path}: a token model, and no canonical weights to read its bounds from")
        vocab_size, max_length, classes = token_bounds(weights_file)
        if classes != logits[1]:
            raise ArtifactError(f"{path}: {logits[1]} classes, but {weights_file} has {classes}; allowed: the "
                                "weights of the same model")
        return TokenSignature(max_length=max_length, vocab_size=vocab_size, classes=classes)
    if names != ([INPUT_NAME], [OUTPUT_NAME]) or [len(s) for s in shapes] != [3, 2] or any(
            s[0] != BATCH_DIM for s in shapes) or not all(isinstance(d, int) for s in shapes for d in s[1:]):
        found = ", ".join(f"{info.name} {info.shape}" for info in (*inputs, *outputs))
        raise ArtifactError(f"{path}: graph {found} breaks the ONNX conventions; allowed: {INPUT_NAME} "
                            f"[{BATCH_DIM}, height, width] or {TOKENS_NAME} [{BATCH_DIM}, {LENGTH_DIM}], "
                            f"{OUTPUT_NAME} [{BATCH_DIM}, classes]")
    (_, height, width), (_, classes) = shapes
    return Signature(height=height, width=width, classes=classes)


class OnnxModel(server.ServedModel):
    """One ONNX file of a run folder (model.onnx; init.onnx for <model>-init) in an ONNX Runtime session, opened
    once; `weights` is the canonical weights file of the same model (read only for a token model's bounds)."""

    def __init__(self, name: str, run_dir: Path, file: Path = SERVED_FILE, weights: Path | None = None) -> None:
        super().__init__(name)
        self.run_dir, self.file = run_dir, file
        self.weights = run_dir / TRAINED_FILE if weights is None else weights

    def load(self) -> bool:
        path = self.run_dir / self.file
        session = open_checked(path)
        self.signature = signature_of(session, path, self.weights)
        name, dtype = self.signature.name, np.dtype(RAW[self.signature.datatype])
        self.forward = lambda inputs: session.run(None, {name: np.asarray(inputs, dtype)})[0]
        self.ready = True
        return self.ready


def init_model(name: str, run_dir: Path, init_file: Path) -> OnnxModel:
    """<model>-init: the run folder's init.onnx. `init_file` (the canonical weights it was exported from) is read
    only for a token model's bounds: ONNX Runtime runs the graph, which holds those weights already."""
    return OnnxModel(name, run_dir, INIT_FILE, init_file)


def main(argv: list[str] | None = None) -> int:
    return server.main(argv, server=SERVER, served_file=SERVED_FILE, model=OnnxModel, init_model=init_model)


if __name__ == "__main__":
    raise SystemExit(main())
