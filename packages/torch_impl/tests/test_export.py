"""torch's own export details: the state dict and ModelConfig inside model.safetensors, a .pt2 that never
unpickles (and the refusal of one that would), a batch kept dynamic from a single example image, exports
that leave the caller's model alone, and damaged files named in one line."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors import safe_open

import rosetta_torch
from rosetta_common.errors import ArtifactError
from rosetta_common.metrics import max_abs_diff
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_torch.export import PROGRAM_FILE, STATE_FILE, check_program_has_no_pickle

TOLERANCES = Spec().tolerances
NON_SQUARE = (6, 10)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A non-square CNN exported from a single example image (torch.export specialises size-1 dimensions)."""
    config = small_config("cnn", NON_SQUARE)
    model = rosetta_torch.build(config, asymmetric_weights(config, 8))
    out = tmp_path_factory.mktemp("cnn")
    example = np.random.default_rng(1).random((1, *NON_SQUARE), dtype=np.float32)
    files = rosetta_torch.export_native(model, out / "native", example)
    assert files == [out / "native" / STATE_FILE, out / "native" / PROGRAM_FILE]
    rosetta_torch.export_onnx(model, out / "model.onnx", example)
    return model, out


def test_state_file_holds_torch_names_and_the_model_config(exported: tuple[torch.nn.Module, Path]) -> None:
    model, out = exported
    with safe_open(str(out / "native" / STATE_FILE), framework="pt") as f:
        metadata = f.metadata()
        assert set(f.keys()) == set(model.state_dict())  # torch's own names and layouts, not canonical ones
    assert list(metadata) == ["rosetta"]  # one key: several would come out in a random order per process
    assert ModelConfig.model_validate(json.loads(metadata["rosetta"])["config"]) == rosetta_torch.model_config(model)
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "native"]  # no external .data, no temp left


def test_program_holds_no_pickle(exported: tuple[torch.nn.Module, Path]) -> None:
    _, out = exported
    check_program_has_no_pickle(out / "native" / PROGRAM_FILE)
    with zipfile.ZipFile(out / "native" / PROGRAM_FILE) as archive:  # no payload starts as a pickle does
        assert not [n for n in archive.namelist() if archive.read(n)[:1] == b"\x80"]


def test_program_with_pickled_example_inputs_is_refused(images: np.ndarray, tmp_path: Path) -> None:
    config = small_config("mlp")
    model = rosetta_torch.build(config, asymmetric_weights(config, 8)).cpu()
    program = torch.export.export(model, (torch.from_numpy(images),))  # keeps its example inputs
    torch.export.save(program, str(tmp_path / PROGRAM_FILE))
    with pytest.raises(ArtifactError, match="unpickled") as raised:
        check_program_has_no_pickle(tmp_path / PROGRAM_FILE)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("batch", [1, 2, 9])
def test_single_image_example_keeps_the_batch_dynamic(exported: tuple[torch.nn.Module, Path], batch: int) -> None:
    model, out = exported
    images = np.random.default_rng(batch).random((batch, *NON_SQUARE), dtype=np.float32)
    expected = rosetta_torch.predict(model, images)
    program = rosetta_torch.load_native(out / "native")["torch_export"]
    assert max_abs_diff(program(images), expected) <= TOLERANCES.native_roundtrip_abs
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"images": images})
    bound = TOLERANCES.onnx_vs_native_abs + TOLERANCES.onnx_vs_native_rel * float(np.abs(expected).max())
    assert max_abs_diff(logits, expected) <= bound


def test_export_leaves_the_model_alone(images: np.ndarray, tmp_path: Path) -> None:
    config = small_config("mlp")
    model = rosetta_torch.build(config, asymmetric_weights(config, 9))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rosetta_torch.export_onnx(model, tmp_path / "model.onnx", images)
    assert model.training  # exports work on a CPU copy in eval mode
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("damaged", [STATE_FILE, PROGRAM_FILE])
def test_damaged_native_file_is_an_artifact_error_naming_it(exported: tuple[torch.nn.Module, Path], damaged: str,
                                                            tmp_path: Path) -> None:
    for name in (STATE_FILE, PROGRAM_FILE):
        data = (exported[1] / "native" / name).read_bytes()
        (tmp_path / name).write_bytes(data[: len(data) // 3] if name == damaged else data)  # truncated
    with pytest.raises(ArtifactError) as raised:
        rosetta_torch.load_native(tmp_path)
    message = str(raised.value)
    assert damaged in message and "\n" not in message, message
