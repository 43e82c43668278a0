"""Train every architecture once on the conformance suite's tiny problem and save losses and weights.

    python -m rosetta_common.conformance.train_worker <framework> <out.npz>

Run as a separate process (twice) by test_training.py: two processes must agree bit for bit.
"""

from __future__ import annotations

import sys

import numpy as np

from rosetta_common.interface import architectures, load_backend
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan


def main(framework: str, out: str) -> None:
    backend = load_backend(framework)
    backend.configure(0)
    spec = small_spec()
    arrays: dict[str, np.ndarray] = {}
    for arch in architectures(backend):
        config = small_config(arch)
        data = learnable_data(tokens=config.input.kind == "tokens")
        model = backend.build(config, asymmetric_weights(config, 11))
        train_plan = plan(spec, arch, len(data.train_labels))
        result = backend.train(model, train_plan, data)
        arrays[f"{arch}/step_losses"] = np.asarray(result.step_losses, np.float64)
        arrays[f"{arch}/epoch_losses"] = np.asarray(result.epoch_losses, np.float64)
        arrays[f"{arch}/epoch_seconds"] = np.asarray(result.epoch_seconds, np.float64)
        arrays[f"{arch}/num_steps"] = np.asarray(train_plan.num_steps)
        arrays[f"{arch}/logits"] = backend.predict(model, data.test_inputs)
        for name, value in backend.to_canonical(model).items():
            arrays[f"{arch}/weights/{name}"] = value
    with open(out, "wb") as f:
        np.savez(f, **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
