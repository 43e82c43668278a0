"""One cold start of one export format: the in-process half of benchmarks/deployment.py.

    <env>/bin/python benchmarks/deployment_worker.py FORMAT PATH IMAGES.npy CALLS RESULT.json LOGITS.npy

Started by benchmarks/deployment.py as a fresh process of the format's own environment (the runner's variables:
thread and instruction-set pins, PYTHONPATH), so everything a deployment pays before its first answer is paid
here: the interpreter, the imports the format needs (nothing else: this file imports only the standard library
before its clock starts), loading the file, the first request at batch 1. Then the first request at batch 64
(JAX and TF trace per input shape) and CALLS more at each batch size, for steady latency.

The clock is time.monotonic (CLOCK_MONOTONIC on Linux: one clock for every process), so the parent's reading
just before it spawned this process and this process' first reading give the interpreter's start-up. RESULT.json
holds the raw readings and the modules found loaded; LOGITS.npy the batch-64 logits (a sanity figure: every
format of one framework computed the same model).
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # first: everything before this line is the interpreter's own start-up

import json  # noqa: E402  (after the clock on purpose)
import resource  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

# The modules whose presence after the run says what the format pulled in (rosetta_*: the model's own code).
WATCHED = ("torch", "tensorflow", "keras", "jax", "flax", "onnxruntime", "onnx", "rosetta_common", "rosetta_torch",
           "rosetta_tf", "rosetta_jax", "kserve")


def load(name: str, path: Path) -> Callable[[Any], Any]:
    """Import what the format needs, load the file, and return a numpy-in, numpy-out forward: each as the package's
    own load_native and server run it, minus our checks (deployment code would not repeat them)."""
    import numpy as np

    if name == "torch_export":
        import torch

        program = torch.export.load(str(path)).module()

        def forward(x: Any) -> Any:
            with torch.inference_mode():
                return program(torch.as_tensor(x)).numpy()

        return forward
    if name == "saved_model":
        import tensorflow as tf

        saved = tf.saved_model.load(str(path))
        return lambda x: np.asarray(saved.serve(tf.constant(x)))
    if name == "keras":
        import keras
        import tensorflow as tf

        import rosetta_tf.models  # noqa: F401  (registers the classes the file names: pipelines.deployment_formats)

        model = keras.models.load_model(str(path), safe_mode=True, compile=False)
        # One traced graph for every batch size, as rosetta_tf.models.predict runs it (eager calls cost more).
        spec = tf.TensorSpec([None, *model.input_shape[1:]], tf.float32)
        graph = tf.function(lambda images: model(images, training=False), input_signature=[spec])
        return lambda x: np.asarray(graph(tf.constant(x)))
    if name == "jax_export":
        import jax
        import jax.numpy as jnp

        exported = jax.export.deserialize(bytearray(path.read_bytes()))
        return lambda x: np.asarray(exported.call(jnp.asarray(x)))
    if name == "onnx":
        import os

        import onnxruntime as ort

        options = ort.SessionOptions()  # as pipelines/checks/sessions.py and pipelines/serving/onnx.py open theirs
        options.log_severity_level = 3
        options.intra_op_num_threads = int(os.environ.get("ROSETTA_THREADS", "2"))
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        input_name = session.get_inputs()[0].name
        return lambda x: session.run(None, {input_name: x})[0]
    raise SystemExit(f"error: format {name!r} is unknown")


# What each format imports before it loads its file (load() imports the same again: free, they are cached).
IMPORTS = {"torch_export": ("torch",), "saved_model": ("tensorflow",),
           "keras": ("tensorflow", "keras", "rosetta_tf.models"), "jax_export": ("jax", "jax.numpy"),
           "onnx": ("onnxruntime",)}


def timed(forward: Callable[[Any], Any], x: Any) -> tuple[float, Any]:
    start = time.monotonic()
    out = forward(x)
    return time.monotonic() - start, out


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        raise SystemExit("error: usage: deployment_worker.py FORMAT PATH IMAGES.npy CALLS RESULT.json LOGITS.npy")
    name, path, images_path, calls, result_path, logits_path = argv
    if name not in IMPORTS:
        raise SystemExit(f"error: format {name!r} is unknown; allowed: {', '.join(IMPORTS)}")
    import importlib

    import numpy as np  # the request's own import, as a server's

    for module in IMPORTS[name]:
        importlib.import_module(module)
    imports_done = time.monotonic()
    forward = load(name, Path(path))
    load_done = time.monotonic()
    images = np.load(images_path, allow_pickle=False)  # after the clock: the request's bytes, not the deployment's
    one = np.ascontiguousarray(images[:1])
    first_request, _ = timed(forward, one)
    batch = np.ascontiguousarray(images[:64])
    first_batch64, logits = timed(forward, batch)
    steady = {"1": [timed(forward, one)[0] for _ in range(int(calls))],
              "64": [timed(forward, batch)[0] for _ in range(int(calls))]}
    np.save(logits_path, np.asarray(logits, np.float32), allow_pickle=False)
    Path(result_path).write_text(json.dumps({
        "format": name, "started": STARTED, "imports_done": imports_done, "load_done": load_done,
        "first_request_seconds": first_request, "first_batch64_seconds": first_batch64, "steady_seconds": steady,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "modules": sorted(m for m in WATCHED if m in sys.modules),
        "python": sys.version.split()[0],
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
