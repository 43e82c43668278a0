"""Export every architecture once (native formats and ONNX) and print each file's sha256 as JSON.

    python -m rosetta_common.conformance.export_worker <framework> <out_dir>

Run as a separate process (twice) by test_export.py: the same weights must give the same bytes, so that a
pipeline output is a pure function of code, params, locks and data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rosetta_common.interface import architectures, load_backend
from rosetta_common.io import sha256
from rosetta_common.testing import asymmetric_weights, random_inputs, small_config


def main(framework: str, out: str) -> None:
    backend = load_backend(framework)
    backend.configure(0)
    images = np.random.default_rng(7).random((7, 8, 8), dtype=np.float32)
    digests = {}
    for arch in architectures(backend):
        config = small_config(arch)
        model = backend.build(config, asymmetric_weights(config, 40))
        folder = Path(out) / arch
        example = random_inputs(config, 7, 7) if config.input.kind == "tokens" else images
        backend.export_native(model, folder / "native", example)
        backend.export_onnx(model, folder / "model.onnx", example)
        digests.update({str(p.relative_to(out)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()})
    print(json.dumps(digests, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
