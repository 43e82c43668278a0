"""One data-parallel worker of the conformance suite: trains every supported architecture on the tiny problem.

    RANK=... (the framework's own variables, rosetta_common.distributed) \
        python -m rosetta_common.conformance.dp_worker <framework> <out.npz>

Started N times by test_distributed.py; every worker saves its step losses and final weights.
"""

from __future__ import annotations

import sys

import numpy as np

from rosetta_common.distributed import UNSUPPORTED, Cluster
from rosetta_common.interface import load_backend
from rosetta_common.testing import ARCHS as UNDER_TEST
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan

ARCHS = [arch for arch in UNDER_TEST if arch not in UNSUPPORTED]


def main(framework: str, out: str) -> None:
    backend = load_backend(framework)
    backend.configure(0)
    cluster = Cluster.from_environment(framework)
    backend.start_worker(cluster)
    spec = small_spec()
    arrays: dict[str, np.ndarray] = {}
    for arch in ARCHS:
        config = small_config(arch)
        data = learnable_data(tokens=config.input.kind == "tokens")
        train_plan = plan(spec, arch, len(data.train_labels))
        model, result = backend.train_data_parallel(config, asymmetric_weights(config, 11), train_plan, data,
                                                    cluster)
        arrays[f"{arch}/step_losses"] = np.asarray(result.step_losses, np.float64)
        arrays[f"{arch}/workers"] = np.asarray(result.workers)
        for name, value in backend.to_canonical(model).items():
            arrays[f"{arch}/weights/{name}"] = value
    backend.stop_worker()
    with open(out, "wb") as f:
        np.savez(f, **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
