"""Stage `bench@<framework>-<model>`: inference latency of the trained model, natively and in ONNX Runtime.

Runs inside the framework's environment (onnxruntime is installed in each). Loads the trained weights
through the backend (build + predict, as the pipeline uses them) and model.onnx into an ONNX Runtime
session with the same number of intra-op threads, then times both (benchmarks/latency.py).
Writes reports/latency/<model>/<framework>.json (pipelines/paths.py); the report stage reads it as a file.
Numbers, not checks.
"""

from __future__ import annotations

import time

from benchmarks import latency
from pipelines import paths
from pipelines.environments import ENVIRONMENTS
from pipelines.stages import StageError, framework_stage_args, stage_main
from pipelines.stages.backend import load_backend, model_config
from rosetta_common.data import load_prepared
from rosetta_common.io import write_json
from rosetta_common.weights import load_weights


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    fw, arch, spec = framework_stage_args(argv, __doc__)

    for path in (paths.trained_weights(arch, fw), paths.onnx_model(arch, fw)):
        if not path.is_file():
            raise StageError(f"{path}: missing; run the train and export stages first (dvc repro)")
    backend = load_backend(fw, spec.seed)
    data = load_prepared(paths.PREPARED)
    images = data.test_images
    config = model_config(spec, arch, data)
    model = backend.build(config, load_weights(paths.trained_weights(arch, fw), config))

    threads = latency.framework_threads(fw)
    ort_threads = threads["intra_op"] or latency.available_cores()
    session = latency.onnx_session(paths.onnx_model(arch, fw), ort_threads)
    settings = latency.Settings()
    ready = time.perf_counter()
    results = latency.measure(lambda x: backend.predict(model, x), latency.onnx_predict(session), images, settings)
    measured = time.perf_counter()

    write_json(
        paths.latency_record(arch, fw),
        {
            "framework": fw,
            "model": arch,
            "native": f"{backend.__name__}.predict (numpy in, numpy out)",
            "onnx": str(paths.onnx_model(arch, fw)),
            "results": results,
            "settings": latency.settings_dict(settings),
            "environment": latency.environment(threads, ort_threads),
            # What ran, as installed (the report shows these next to the locks' pins): pyproject's distributions.
            "versions": latency.versions([*ENVIRONMENTS[fw].distributions, "onnxruntime", "numpy"]),
            # Framework import, model build and session creation vs the measuring itself.
            "setup_seconds": ready - started,
            "measure_seconds": measured - ready,
        },
    )
    summary = ", ".join(
        f"batch {r['batch']}: native {r['native_median_ms']:.3f} ms, onnx {r['onnx_median_ms']:.3f} ms "
        f"(x{r['native_over_onnx']:.2f})"
        for r in results
    )
    print(f"bench: {fw}/{arch} {summary}")
    return 0


if __name__ == "__main__":
    stage_main(main)
