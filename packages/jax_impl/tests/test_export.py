"""Export: native formats reload to the same logits, ONNX under onnxruntime matches native."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import rosetta_jax
from rosetta_common.metrics import max_abs_diff
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES
from rosetta_common.weights import canonical_shapes, random_weights

NATIVE_ROUNDTRIP_ABS = 1e-6
ONNX_VS_NATIVE_ABS = 1e-5


@pytest.fixture(scope="module", params=ARCHS)
def exported(request: pytest.FixtureRequest, spec: Spec, images: np.ndarray,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    arch = request.param
    weights = random_weights(canonical_shapes(arch, spec, IMAGE_SHAPE, NUM_CLASSES), 8)
    model = rosetta_jax.build(arch, spec, weights)
    out = tmp_path_factory.mktemp(arch)
    rosetta_jax.export_native(model, out / "native", images)
    rosetta_jax.export_onnx(model, out / "model.onnx", images)
    return model, out


def test_native_files_and_config(exported: tuple[object, Path]) -> None:
    model, out = exported
    names = sorted(p.name for p in (out / "native").iterdir())
    assert names == ["config.json", "forward.jax_export", "params.msgpack"]
    config = json.loads((out / "native" / "config.json").read_text())
    assert config["arch"] == model.config.arch and config["image_shape"] == list(IMAGE_SHAPE)


@pytest.mark.parametrize("batch", [1, 7])
def test_native_round_trip(exported: tuple[object, Path], images: np.ndarray, batch: int) -> None:
    model, out = exported
    expected = rosetta_jax.predict(model, images[:batch])
    loaded = rosetta_jax.load_native(out / "native")
    assert set(loaded) == {"flax_msgpack", "jax_export"}
    for name, predict in loaded.items():
        got = predict(images[:batch])
        assert got.shape == (batch, NUM_CLASSES) and got.dtype == np.float32, name
        assert max_abs_diff(got, expected) <= NATIVE_ROUNDTRIP_ABS, name


@pytest.mark.parametrize("batch", [1, 7])
def test_onnx_matches_native(exported: tuple[object, Path], images: np.ndarray, batch: int) -> None:
    model, out = exported
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    assert [o.name for o in session.get_outputs()] == ["logits"]
    (got,) = session.run(["logits"], {"images": images[:batch]})
    assert got.shape == (batch, NUM_CLASSES)
    assert max_abs_diff(got, rosetta_jax.predict(model, images[:batch])) <= ONNX_VS_NATIVE_ABS


def test_onnx_checker_and_dynamic_batch(exported: tuple[object, Path]) -> None:
    _, out = exported
    proto = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    batch_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.HasField("dim_value")
    assert not list(out.glob("*.tmp"))  # written atomically, nothing left behind
