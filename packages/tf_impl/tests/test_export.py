"""Native formats reload (no pickle) to the same logits; ONNX under ONNX Runtime matches native."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import rosetta_tf
from rosetta_common.metrics import max_abs_diff
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES, asymmetric_weights

NATIVE_ABS = 1e-6  # reloaded native format vs the in-memory model
ONNX_ABS = 1e-5  # ONNX Runtime vs native predict


@pytest.fixture(scope="module", params=ARCHS)
def exported(request: pytest.FixtureRequest, spec: Spec, tmp_path_factory: pytest.TempPathFactory):
    arch = request.param
    model = rosetta_tf.build(arch, spec, asymmetric_weights(arch, spec, 5))
    out = tmp_path_factory.mktemp(arch)
    example = np.random.default_rng(0).random((2, *IMAGE_SHAPE), dtype=np.float32)
    files = rosetta_tf.export_native(model, out / "native", example)
    rosetta_tf.export_onnx(model, out / "model.onnx", example)
    return model, out, files


def _images(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).random((batch, *IMAGE_SHAPE), dtype=np.float32)


def test_native_round_trip(exported) -> None:
    model, out, files = exported
    assert files and all(Path(f).is_file() for f in files)
    predictors = rosetta_tf.load_native(out / "native")
    assert set(predictors) == {"keras", "saved_model"}
    for batch in (1, 7):
        expected = rosetta_tf.predict(model, _images(batch))
        for name, predict in predictors.items():
            got = predict(_images(batch))
            assert got.shape == (batch, NUM_CLASSES) and got.dtype == np.float32, name
            assert max_abs_diff(got, expected) <= NATIVE_ABS, name


def test_onnx_matches_native(exported) -> None:
    model, out, _ = exported
    proto = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(proto)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    assert [o.name for o in session.get_outputs()] == ["logits"]
    for batch in (1, 7):
        (logits,) = session.run(None, {"images": _images(batch)})
        assert logits.shape == (batch, NUM_CLASSES)
        assert max_abs_diff(logits, rosetta_tf.predict(model, _images(batch))) <= ONNX_ABS
