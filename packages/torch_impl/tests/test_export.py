"""Export: native formats reload to the same logits without unpickling, ONNX under onnxruntime matches
native at any batch size."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors import safe_open

import rosetta_torch
from rosetta_common.metrics import max_abs_diff
from rosetta_common.spec import Spec
from rosetta_common.testing import ARCHS, IMAGE_SHAPE, NUM_CLASSES, asymmetric_weights
from rosetta_torch.export import check_program_has_no_pickle

NATIVE_ROUNDTRIP_ABS = 1e-6
ONNX_VS_NATIVE_ABS = 1e-5


@pytest.fixture(scope="module", params=ARCHS)
def exported(request: pytest.FixtureRequest, spec: Spec, images: np.ndarray,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    arch = request.param
    model = rosetta_torch.build(arch, spec, asymmetric_weights(arch, spec, 8))
    out = tmp_path_factory.mktemp(arch)
    files = rosetta_torch.export_native(model, out / "native", images)
    assert files == [out / "native" / "model.safetensors", out / "native" / "model.pt2"]
    rosetta_torch.export_onnx(model, out / "model.onnx", images)
    return model, out


def test_native_files_and_metadata(exported: tuple[torch.nn.Module, Path]) -> None:
    model, out = exported
    assert sorted(p.name for p in (out / "native").iterdir()) == ["model.pt2", "model.safetensors"]
    with safe_open(str(out / "native" / "model.safetensors"), framework="pt") as f:
        metadata = f.metadata()
        assert set(f.keys()) == set(model.state_dict())  # torch's own names and layouts
    assert metadata["architecture"] == model.arch
    assert json.loads(metadata["config"])["image_shape"] == list(IMAGE_SHAPE)


def test_program_holds_no_pickle(exported: tuple[torch.nn.Module, Path]) -> None:
    _, out = exported
    check_program_has_no_pickle(out / "native" / "model.pt2")
    with zipfile.ZipFile(out / "native" / "model.pt2") as archive:  # no payload starts as a pickle does
        assert not [n for n in archive.namelist() if archive.read(n)[:1] == b"\x80"]


def test_program_with_pickled_example_inputs_is_refused(spec: Spec, images: np.ndarray, tmp_path: Path) -> None:
    model = rosetta_torch.build("mlp", spec, asymmetric_weights("mlp", spec, 8)).cpu()
    program = torch.export.export(model, (torch.from_numpy(images),))  # keeps its example inputs
    torch.export.save(program, str(tmp_path / "model.pt2"))
    with pytest.raises(ValueError, match="unpickled"):
        check_program_has_no_pickle(tmp_path / "model.pt2")


@pytest.mark.parametrize("batch", [1, 7])
def test_native_round_trip(exported: tuple[torch.nn.Module, Path], images: np.ndarray, batch: int) -> None:
    model, out = exported
    expected = rosetta_torch.predict(model, images[:batch])
    loaded = rosetta_torch.load_native(out / "native")
    assert set(loaded) == {"safetensors", "torch_export"}
    for name, predict in loaded.items():
        got = predict(images[:batch])
        assert got.shape == (batch, NUM_CLASSES) and got.dtype == np.float32, name
        assert max_abs_diff(got, expected) <= NATIVE_ROUNDTRIP_ABS, name


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_onnx_matches_native(exported: tuple[torch.nn.Module, Path], batch: int) -> None:
    model, out = exported
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    assert [o.name for o in session.get_outputs()] == ["logits"]
    images = np.random.default_rng(batch).random((batch, *IMAGE_SHAPE), dtype=np.float32)
    (got,) = session.run(["logits"], {"images": images})
    assert got.shape == (batch, NUM_CLASSES)
    assert max_abs_diff(got, rosetta_torch.predict(model, images)) <= ONNX_VS_NATIVE_ABS


def test_onnx_checker_and_dynamic_batch(exported: tuple[torch.nn.Module, Path]) -> None:
    _, out = exported
    proto = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    batch_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param == "batch" and not batch_dim.HasField("dim_value")
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "native"]  # no external .data file


def test_export_from_a_single_image_keeps_the_batch_dynamic(spec: Spec, images: np.ndarray, tmp_path: Path) -> None:
    model = rosetta_torch.build("cnn", spec, asymmetric_weights("cnn", spec, 9))
    rosetta_torch.export_native(model, tmp_path / "native", images[:1])
    rosetta_torch.export_onnx(model, tmp_path / "model.onnx", images[:1])
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = rosetta_torch.predict(model, images)
    assert max_abs_diff(session.run(None, {"images": images})[0], expected) <= ONNX_VS_NATIVE_ABS
    program = rosetta_torch.load_native(tmp_path / "native")["torch_export"]
    assert max_abs_diff(program(images), expected) <= NATIVE_ROUNDTRIP_ABS


def test_export_leaves_the_model_alone(spec: Spec, images: np.ndarray, tmp_path: Path) -> None:
    model = rosetta_torch.build("mlp", spec, asymmetric_weights("mlp", spec, 9))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rosetta_torch.export_onnx(model, tmp_path / "model.onnx", images)
    assert model.training  # exports work on a CPU copy in eval mode
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
