"""torch's own export details: the state dict and ModelConfig inside model.safetensors, a .pt2 that never
unpickles (and the refusal of one that would), a batch kept dynamic from a single example image, exports
that leave the caller's model alone, damaged files named in one line, exports in inference mode (and a
training-mode one caught), the ONNX form of each new layer, and ONNX Runtime at the largest parity batch."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors import safe_open

import rosetta_torch
from rosetta_common.errors import ArtifactError
from rosetta_common.interface import Predict
from rosetta_common.metrics import inference_mode_problems, max_abs_diff
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


def _onnx_predict(path: Path, optimized: bool = True) -> Predict:
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"images": x})[0]


def test_a_training_mode_export_is_caught(images: np.ndarray, tmp_path: Path) -> None:
    """inference_mode_problems tells a training-mode export from the outputs alone: torch.export of a ResNet
    left in train() mode (dropout and batch statistics both live), and the TorchScript exporter asked for
    TrainingMode.TRAINING (BatchNormalization with training_mode=1; its Dropout is removed by ONNX Runtime's
    default graph optimizations, and shows with them off). Ours, from the same model in train() mode, are clean.
    torch.onnx's dynamo exporter (export_onnx's) writes an inference graph even from a train() model."""
    config = small_config("resnet")
    model = rosetta_torch.build(config, asymmetric_weights(config, 3)).cpu().train()
    x = torch.from_numpy(images)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both exporters comment at length on a training-mode export
        batch = {"images": {0: torch.export.Dim("batch")}}
        program = torch.export.export(model, (x,), dynamic_shapes=batch).module()
        torch.onnx.export(model, (x,), str(tmp_path / "training.onnx"), dynamo=False,
                          training=torch.onnx.TrainingMode.TRAINING, input_names=["images"], output_names=["logits"],
                          dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17)
    atol = TOLERANCES.native_roundtrip_abs
    problems = inference_mode_problems(lambda a: program(torch.from_numpy(a)).detach().numpy(), images, atol)
    assert len(problems) == 2 and "dropout" in problems[0] and "batch statistics" in problems[1], problems
    problems = inference_mode_problems(_onnx_predict(tmp_path / "training.onnx"), images, atol)
    assert len(problems) == 1 and "batch statistics" in problems[0], problems
    assert len(inference_mode_problems(_onnx_predict(tmp_path / "training.onnx", False), images, atol)) == 2

    model.train()
    rosetta_torch.export_onnx(model, tmp_path / "model.onnx", images)
    rosetta_torch.export_native(model, tmp_path / "native", images)
    assert model.training  # the caller's model is left as it was
    runs = {**rosetta_torch.load_native(tmp_path / "native"), "onnx": _onnx_predict(tmp_path / "model.onnx"),
            "onnx_unoptimized": _onnx_predict(tmp_path / "model.onnx", False)}
    for name, predict in runs.items():
        assert inference_mode_problems(predict, images, atol) == [], name


@pytest.mark.parametrize(("arch", "op", "absent"), [("lstm", "LSTM", {"Loop", "Scan"}),
                                                    ("gru", "GRU", {"Loop", "Scan"}),
                                                    ("resnet", "Conv", {"BatchNormalization", "Dropout"})])
def test_onnx_form_of_the_new_layers(arch: str, op: str, absent: set[str], images: np.ndarray,
                                     tmp_path: Path) -> None:
    """nn.LSTM / nn.GRU become one ONNX LSTM / GRU op (no Loop, Scan or unrolled steps); the ResNet's
    BatchNorms are folded into its convolutions and its Dropout, an identity in inference, is gone."""
    config = small_config(arch)
    rosetta_torch.export_onnx(rosetta_torch.build(config, asymmetric_weights(config, 4)), tmp_path / "m.onnx", images)
    ops = [node.op_type for node in onnx.load(str(tmp_path / "m.onnx")).graph.node]
    assert op in ops and not absent & set(ops), ops
    if arch == "gru":  # torch's formula: the reset gate applies after the recurrent matmul and bias
        (gru,) = [n for n in onnx.load(str(tmp_path / "m.onnx")).graph.node if n.op_type == "GRU"]
        assert {a.name: a.i for a in gru.attribute}["linear_before_reset"] == 1


@pytest.mark.parametrize("arch", ["resnet", "lstm", "gru"])
def test_onnx_agrees_at_the_largest_parity_batch(arch: str, images: np.ndarray, tmp_path: Path) -> None:
    """The conformance suite checks batches 1, 7 and 64; the pipeline compares at 1024 too."""
    batch = max(Spec().export.parity_batch_sizes)
    config = small_config(arch, NON_SQUARE)
    model = rosetta_torch.build(config, asymmetric_weights(config, 5))
    x = np.random.default_rng(6).random((batch, *NON_SQUARE), dtype=np.float32)
    rosetta_torch.export_onnx(model, tmp_path / "m.onnx", x[:7])
    expected = rosetta_torch.predict(model, x)
    bound = TOLERANCES.onnx_vs_native_abs + TOLERANCES.onnx_vs_native_rel * float(np.abs(expected).max())
    assert max_abs_diff(_onnx_predict(tmp_path / "m.onnx")(x), expected) <= bound


def test_onnx_exports_share_one_registry_and_match_torchs_own(images: np.ndarray, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    """export.py's one registry per process (_registry_built_once): a registry is kept, built without the
    torchvision notices, the exporter's own entry point is back in place afterwards, and the files are the bytes
    torch.onnx gives when it builds its own registry for every export."""
    from torch.onnx._internal.exporter import _registration

    from rosetta_torch import export

    before = _registration.ONNXRegistry.__dict__["from_torchlib"]
    export._REGISTRIES.clear()
    config = small_config("cnn")
    model = rosetta_torch.build(config, asymmetric_weights(config, 3))
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    capfd.readouterr()
    rosetta_torch.export_onnx(model, first, images)
    assert "torchvision" not in capfd.readouterr().err
    assert len(export._REGISTRIES) == 1, "no registry kept: a torch release moved the internal export.py patches"
    rosetta_torch.export_onnx(model, second, images)
    assert len(export._REGISTRIES) == 1
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is before
    monkeypatch.setattr(export, "_registry_built_once", contextlib.nullcontext)  # torch.onnx on its own
    own = tmp_path / "own.onnx"
    rosetta_torch.export_onnx(model, own, images)
    assert first.read_bytes() == second.read_bytes() == own.read_bytes()


def test_the_registry_internal_export_py_reuses_is_where_it_was() -> None:
    """_registry_built_once relies on torch.onnx internals with no public route (its docstring): a classmethod
    ONNXRegistry.from_torchlib(cls, opset_version) that torch.onnx.export calls, and the registry module's logger.
    A torch release that moves them fails this test instead of quietly making every export build its own registry."""
    from torch.onnx._internal.exporter import _compat, _registration

    method = _registration.ONNXRegistry.__dict__.get("from_torchlib")
    assert isinstance(method, classmethod), method
    assert list(inspect.signature(method.__func__).parameters) == ["cls", "opset_version"]
    assert isinstance(_registration.logger, logging.Logger)
    assert "from_torchlib(" in inspect.getsource(_compat)  # torch.onnx.export's path builds it there
