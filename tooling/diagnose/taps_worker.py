"""The framework side of tooling.diagnose.where_they_part, run in that framework's environment by the runner:

    python -m pipelines.runner <framework> -- python -m tooling.diagnose.taps_worker <framework> <arch> <weights> \
        <images.npz> <taps.npz> <height> <width> <classes>

builds the framework's model of <arch> (params.yaml's architecture settings, the given image shape and classes)
from the canonical weights, and writes every tap of its forward on the images (rosetta_common.taps) to
<taps.npz> with np.savez (no pickle). A failure is one line on stderr and exit status 2."""

from __future__ import annotations

import sys

import numpy as np

from pipelines import paths
from rosetta_common.errors import RosettaError
from rosetta_common.interface import load_backend
from rosetta_common.spec import ModelConfig, load_spec
from rosetta_common.weights import load_weights


def main(argv: list[str]) -> int:
    framework, arch, weights_path, images_path, out_path, height, width, classes = argv
    config = ModelConfig.of(load_spec(paths.PARAMS), arch, (int(height), int(width)), int(classes))
    weights = load_weights(weights_path, config)
    with np.load(images_path, allow_pickle=False) as f:
        images = f["images"]
    backend = load_backend(framework)
    backend.configure(0)  # deterministic mode; an inference forward draws no random numbers
    taps = backend.forward_with_taps(backend.build(config, weights), images)
    with open(out_path, "wb") as f:
        np.savez(f, **taps)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (RosettaError, OSError, ValueError, KeyError) as error:
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(2)
