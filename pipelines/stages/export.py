"""Stage `export@<framework>-<model>`: native formats, model.onnx and init.onnx, plus the native logits
the validate stage compares ONNX Runtime against (it has no framework of its own)."""

from __future__ import annotations

import time

import numpy as np

from pipelines import paths
from pipelines.stages import framework_stage_args, stage_main
from pipelines.stages.backend import load_backend, model_config
from rosetta_common.data import load_prepared
from rosetta_common.io import atomic_path, write_json
from rosetta_common.metrics import max_abs_diff
from rosetta_common.weights import load_weights


def main(argv: list[str]) -> int:
    fw, arch, spec = framework_stage_args(argv, __doc__)
    backend = load_backend(fw, spec.seed)
    data = load_prepared(paths.PREPARED)
    batch = data.validation_batch(spec.export.validation_batch_size)
    config = model_config(spec, arch, data)
    record: dict[str, object] = {"framework": fw, "model": arch}

    # The untrained model, from the shared init: the forward-parity witness.
    initial = backend.build(config, load_weights(paths.init_weights(arch), config))
    with atomic_path(paths.init_onnx(arch, fw)) as tmp:
        backend.export_onnx(initial, tmp, batch)
    init_logits = backend.predict(initial, batch)

    model = backend.build(config, load_weights(paths.trained_weights(arch, fw), config))
    start = time.perf_counter()
    with atomic_path(paths.native_dir(arch, fw)) as tmp:
        files = backend.export_native(model, tmp, batch)
        record["native_files"] = sorted(str(p.relative_to(tmp)) for p in files)
    record["native_export_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    with atomic_path(paths.onnx_model(arch, fw)) as tmp:
        backend.export_onnx(model, tmp, batch)
    record["onnx_export_seconds"] = time.perf_counter() - start

    logits = backend.predict(model, batch)
    test_logits = backend.predict(model, data.test_images)
    # Round trip: every reloaded native format must reproduce the in-memory model.
    record["native_roundtrip_max_abs"] = {
        name: max_abs_diff(predict(batch), logits)
        for name, predict in backend.load_native(paths.native_dir(arch, fw)).items()
    }
    with atomic_path(paths.native_outputs(arch, fw)) as tmp, open(tmp, "wb") as f:
        np.savez(f, validation_logits=logits, init_validation_logits=init_logits, test_logits=test_logits)
    write_json(paths.export_record(arch, fw), record)
    print(f"export: {fw}/{arch} -> {paths.run_dir(arch, fw)} (round trip {record['native_roundtrip_max_abs']})")
    return 0


if __name__ == "__main__":
    stage_main(main)
