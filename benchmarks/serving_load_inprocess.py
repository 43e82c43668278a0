"""The in-process half of benchmarks/serving_load.py: one server's own model, loaded as that server loads it, called
in this process on the same batches.

    python -m pipelines.runner torch -- python -m benchmarks.serving_load_inprocess JOB.json RESULT.json

JOB.json names the server (a key of pipelines.serving.servers.SERVERS), its module, the artifacts folder it serves, the
model and the batches (.npy). This process imports the server's module (rosetta_torch.serve, rosetta_tf.serve,
rosetta_jax.serve or pipelines.serving.onnx), configures the framework as that module's main does (its `configure`,
where it has one), loads the model with the module's own ServedModel class (the same export, the same loader,
the same `forward` the server calls per request) and times `np.asarray(forward(images))`: WARMUP calls first (JAX
compiles per batch shape), then calls until MIN_SECONDS have passed (at least MIN_CALLS, at most MAX_CALLS), each
timed with time.perf_counter. Only the raw call times (ms) go to RESULT.json.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rosetta_common.serving import server as serving

WARMUP = 5
MIN_SECONDS, MIN_CALLS, MAX_CALLS = 1.0, 20, 500


# The class of a served export, the `model=` each server's main hands to rosetta_common.serving.server.main:
# NativeModel in the framework servers (beside it, InitModel serves the init weights: not what is measured),
# OnnxModel in ONNX's.
EXPORT_CLASSES = ("NativeModel", "OnnxModel")


def served_model_class(module: Any) -> type:
    """The module's class of a served export."""
    (found,) = [getattr(module, name) for name in EXPORT_CLASSES if hasattr(module, name)]
    if not issubclass(found, serving.ServedModel):
        raise TypeError(f"{module.__name__}.{found.__name__}: not a rosetta_common.serving.server.ServedModel")
    return found


def time_calls(forward: Any, images: np.ndarray) -> list[float]:
    """Call times in ms of np.asarray(forward(images)): as the server takes the answer (check_logits), so a lazy
    result (a JAX array still computing) is waited for."""
    for _ in range(WARMUP):
        np.asarray(forward(images))
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < MAX_CALLS and (len(times) < MIN_CALLS or time.perf_counter() - started < MIN_SECONDS):
        t0 = time.perf_counter()
        np.asarray(forward(images))
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    module = importlib.import_module(job["module"])
    if hasattr(module, "configure"):  # the framework servers' main runs configure(0) before loading (see there)
        module.configure(0)
    model = served_model_class(module)(job["model"], Path(job["artifacts"]) / job["model"])
    model.load()
    result = {}
    for size, path in job["batches"].items():
        images = np.ascontiguousarray(np.load(path, allow_pickle=False), dtype=np.float32)
        result[size] = {"times_ms": time_calls(model.forward, images), "warmup": WARMUP}
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
