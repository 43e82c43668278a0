"""export.py of the contract: native formats that reload to the same logits, and ONNX that meets the conventions."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from rosetta_common.conformance import export_worker, process_worker
from rosetta_common.errors import ArtifactError
from rosetta_common.io import read_json
from rosetta_common.metrics import inference_mode_problems, max_abs_diff
from rosetta_common.onnx_conventions import BATCH_DIM, LENGTH_DIM, OUTPUT_NAME, violations
from rosetta_common.spec import Spec
from rosetta_common.testing import asymmetric_weights, random_inputs, small_config

TOLERANCES = Spec().tolerances  # the bounds the validate stage applies to the pipeline's own exports
ONNX_BATCHES = (1, 7, 64)


def test_native_formats_reload_to_the_same_logits(backend: ModuleType, arch: str, inputs: np.ndarray,
                                                   tmp_path: Path) -> None:
    config = small_config(arch)
    model = backend.build(config, asymmetric_weights(config, 20))
    out = tmp_path / "native"
    files = backend.export_native(model, out, inputs)
    assert files and all(Path(f).is_file() and out in Path(f).parents for f in files)
    assert not list(out.rglob("*.pkl")) and not list(out.rglob("*.pickle"))
    expected = backend.predict(model, inputs)
    reloaded = backend.load_native(out)
    assert reloaded
    for name, predict in reloaded.items():
        assert max_abs_diff(predict(inputs), expected) <= TOLERANCES.native_roundtrip_abs, name
    if config.input.kind == "tokens":  # every native format takes any length up to the maximum
        short = random_inputs(config, 3, 23, length=4)
        for name, predict in reloaded.items():
            assert max_abs_diff(predict(short), backend.predict(model, short)) <= TOLERANCES.native_roundtrip_abs, name


def test_load_native_of_a_missing_export_is_an_artifact_error(backend: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as raised:
        backend.load_native(tmp_path / "nothing-here")
    assert "\n" not in str(raised.value)


def test_onnx_meets_the_conventions_at_every_batch_size(backend: ModuleType, arch: str, two_processes: list[Path]
                                                         ) -> None:
    """The first fresh process's model.onnx (conftest.py's two_processes: export_worker's weights and example) is
    checked (onnx.checker, the conventions) and run at every batch size against the same model built here."""
    import onnx
    import onnxruntime as ort

    config = small_config(arch)
    model = backend.build(config, asymmetric_weights(config, export_worker.WEIGHTS_SEED))
    path = two_processes[0] / process_worker.EXPORTS / arch / "model.onnx"
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert violations(proto, backend.FRAMEWORK) == []
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = config.input.name
    assert [i.name for i in session.get_inputs()] == [name]
    assert [o.name for o in session.get_outputs()] == [OUTPUT_NAME]
    assert session.get_inputs()[0].shape[0] == BATCH_DIM == session.get_outputs()[0].shape[0]
    tokens = config.input.kind == "tokens"
    if tokens:
        assert session.get_inputs()[0].shape[1] == LENGTH_DIM and session.get_inputs()[0].type == "tensor(int64)"
    rng = np.random.default_rng(22)
    lengths = (1, 5, config.input.max_length) if tokens else (None,)  # a dynamic length: short, middle, longest
    for batch, length in ((b, n) for b in ONNX_BATCHES for n in lengths):
        x = random_inputs(config, batch, batch, length) if tokens else \
            rng.random((batch, *config.image_shape), dtype=np.float32)
        native = backend.predict(model, x)
        (onnx_logits,) = session.run([OUTPUT_NAME], {name: x})
        bound = TOLERANCES.onnx_vs_native_abs + TOLERANCES.onnx_vs_native_rel * float(np.abs(native).max())
        assert onnx_logits.shape == (batch, config.num_classes)
        assert max_abs_diff(onnx_logits, native) <= bound, batch


def test_exports_repeat_byte_for_byte_across_processes(two_processes: list[Path]) -> None:
    """Two fresh processes export the same weights: every native and ONNX file must have the same bytes (no
    save dates, no random metadata order, no process-global name counters), else DVC's hashes never repeat."""
    first, second = (read_json(out / process_worker.DIGESTS) for out in two_processes)
    assert first.keys() == second.keys() and first
    assert [name for name in first if first[name] != second[name]] == []
    # No path of this machine inside an artifact (a source file's, the environment's, the output folder's): it
    # would leak the machine into shared files and make their bytes depend on where the checkout lives.
    checkout = str(Path(__file__).resolve().parents[5])
    for out in two_processes:
        for path in (p for p in (out / process_worker.EXPORTS).rglob("*") if p.is_file()):
            data = path.read_bytes()
            for needle in {checkout, sys.prefix, str(out)}:
                assert needle.encode() not in data, f"{path.relative_to(out)} holds {needle}"


def test_exports_run_in_inference_mode(backend: ModuleType, arch: str, inputs: np.ndarray, tmp_path: Path) -> None:
    """No dropout and no batch statistics in any export, even of a model that was just training."""
    import onnxruntime as ort

    config = small_config(arch)
    model = backend.build(config, asymmetric_weights(config, 22))
    backend.forward_train(model, inputs, None)  # a model straight out of a training step
    backend.export_onnx(model, tmp_path / "model.onnx", inputs)
    # Unoptimized: ONNX Runtime's graph optimizations delete Dropout nodes even with training_mode set to a
    # constant True, which would hide the very mistake this looks for.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), options, providers=["CPUExecutionProvider"])
    runs = {name: predict for name, predict in backend.load_native(_native(backend, model, tmp_path, inputs)).items()}
    runs["onnx"] = lambda x: session.run(None, {config.input.name: x})[0]
    for name, predict in runs.items():
        assert inference_mode_problems(predict, inputs, TOLERANCES.native_roundtrip_abs) == [], name


def _native(backend: ModuleType, model: object, tmp_path: Path, images: np.ndarray) -> Path:
    backend.export_native(model, tmp_path / "native", images)
    return tmp_path / "native"
