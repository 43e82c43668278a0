"""Export every architecture once (native formats and ONNX) and print each file's sha256 as JSON.

    python -m rosetta_common.conformance.export_worker <framework> <out_dir>

What each of test_export.py's two fresh processes does first (process_worker.py): the same weights must give the
same bytes, so that a pipeline output is a pure function of code, params, locks and data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rosetta_common.interface import load_backend
from rosetta_common.io import sha256
from rosetta_common.testing import ARCHS, asymmetric_weights, random_inputs, small_config

WEIGHTS_SEED = 40  # asymmetric_weights' seed of every exported model
IMAGES = np.random.default_rng(7).random((7, 8, 8), dtype=np.float32)  # the example batch of an image model


def example(arch: str) -> np.ndarray:
    """The example batch an architecture is exported with (and test_export.py checks its ONNX file on)."""
    config = small_config(arch)
    return random_inputs(config, 7, 7) if config.input.kind == "tokens" else IMAGES


def export_all(framework: str, out: Path) -> dict[str, str]:
    """Every architecture of `framework`, native and ONNX, into out/<arch>/; each file's sha256 by its path."""
    backend = load_backend(framework)
    backend.configure(0)
    digests = {}
    for arch in ARCHS:
        config = small_config(arch)
        model = backend.build(config, asymmetric_weights(config, WEIGHTS_SEED))
        folder = out / arch
        backend.export_native(model, folder / "native", example(arch))
        backend.export_onnx(model, folder / "model.onnx", example(arch))
        digests.update({str(p.relative_to(out)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()})
    return digests


def main(framework: str, out: str) -> None:
    print(json.dumps(export_all(framework, Path(out)), sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
