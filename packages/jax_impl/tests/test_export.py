"""JAX specifics of the exports: the jax.export module's symbolic batch, the files and config.json, damaged
files named in one-line ArtifactErrors, and a training-mode trace told apart from export_onnx's."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pytest

import rosetta_jax
from rosetta_common.errors import ArtifactError
from rosetta_common.metrics import inference_mode_problems
from rosetta_common.spec import CONFIG_FILE, ModelConfig, Spec
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_jax.export import EXPORT_FILE, PARAMS_FILE

NATIVE_ABS = Spec().tolerances.native_roundtrip_abs
IMAGE_SHAPE = (6, 10)  # not square: the export's static dimensions must be (height, width), in that order


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    config = small_config("cnn", IMAGE_SHAPE)
    model = rosetta_jax.build(config, asymmetric_weights(config, 1))
    out = tmp_path_factory.mktemp("cnn") / "native"
    example = np.zeros((2, *IMAGE_SHAPE), np.float32)
    files = rosetta_jax.export_native(model, out, example)
    assert sorted(f.name for f in files) == sorted(p.name for p in out.iterdir())
    return model, out


def test_files_and_config_json(exported: tuple[object, Path]) -> None:
    model, out = exported
    assert sorted(p.name for p in out.iterdir()) == sorted([CONFIG_FILE, PARAMS_FILE, EXPORT_FILE])
    assert ModelConfig.model_validate_json((out / CONFIG_FILE).read_text()) == rosetta_jax.model_config(model)


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_jax_export_has_a_symbolic_batch(exported: tuple[object, Path], batch: int) -> None:
    model, out = exported
    module = jax.export.deserialize(bytearray((out / EXPORT_FILE).read_bytes()))
    first, *rest = module.in_avals[0].shape
    assert not isinstance(first, int) and tuple(rest) == IMAGE_SHAPE  # one module serves every batch size
    images = np.random.default_rng(batch).random((batch, *IMAGE_SHAPE), dtype=np.float32)
    got = rosetta_jax.load_native(out)["jax_export"](images)
    assert got.shape == (batch, 10)
    assert np.abs(got - rosetta_jax.predict(model, images)).max() <= NATIVE_ABS


@pytest.mark.parametrize("name", [CONFIG_FILE, PARAMS_FILE, EXPORT_FILE])
@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage"])
def test_a_damaged_file_is_a_one_line_artifact_error(exported: tuple[object, Path], tmp_path: Path, name: str,
                                                      damage: str) -> None:
    _, out = exported
    copy = tmp_path / "native"
    copy.mkdir()
    for path in out.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    target = copy / name
    if damage == "missing":
        target.unlink()
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.write_bytes(b"\x01 not a Rosetta export")
    with pytest.raises(ArtifactError) as raised:
        rosetta_jax.load_native(copy)
    message = str(raised.value)
    assert "\n" not in message and name in message, message


def _unoptimized(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """ONNX Runtime with its graph optimizations off: by default it deletes every Dropout node, even one whose
    training_mode input is a constant True, so a training-mode Dropout would look like inference mode."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"images": x})[0]


@pytest.fixture
def training_resnet() -> tuple[object, np.ndarray]:
    """A resnet switched to Flax's training mode: nnx.Module.train() sets use_running_average=False (batch
    statistics) and deterministic=False (nnx.Dropout on) in every submodule, and a trace keeps that mode."""
    config = small_config("resnet", IMAGE_SHAPE)
    model = rosetta_jax.build(config, asymmetric_weights(config, 3))
    model.train()
    return model, np.random.default_rng(4).random((8, *IMAGE_SHAPE), dtype=np.float32)


def test_an_onnx_export_traced_in_training_mode_is_caught(training_resnet: tuple[object, np.ndarray],
                                                          tmp_path: Path) -> None:
    """jax2onnx on the training-mode model writes a Dropout with training_mode on (its BatchNorm it turns to
    inference mode by itself, with a warning): inference_mode_problems sees the dropout. export_onnx of the same
    model exports an inference view: nothing to see."""
    from flax import nnx
    from jax2onnx import to_onnx

    from rosetta_common.onnx_conventions import OPSETS

    model, images = training_resnet

    def forward(x: jax.Array) -> jax.Array:
        return nnx.merge(*nnx.split(model), copy=True)(x)

    proto = to_onnx(forward, [("batch", *IMAGE_SHAPE)], opset=OPSETS["jax"], input_names=["images"])
    (tmp_path / "train.onnx").write_bytes(proto.SerializeToString())
    problems = inference_mode_problems(_unoptimized(tmp_path / "train.onnx"), images, NATIVE_ABS)
    assert problems and "dropout" in problems[0], problems  # random masks also make images depend on the batch

    rosetta_jax.export_onnx(model, tmp_path / "model.onnx", images)
    assert inference_mode_problems(_unoptimized(tmp_path / "model.onnx"), images, NATIVE_ABS) == []


def test_a_native_export_traced_in_training_mode_is_caught(training_resnet: tuple[object, np.ndarray],
                                                            tmp_path: Path) -> None:
    """jax.export of the training-mode model (dropout aside: it would need a key) keeps BatchNorm on batch
    statistics, and inference_mode_problems sees an image's logits change with its batch. export_native of the
    same model exports an inference view: nothing to see in either native format."""
    from flax import nnx

    model, images = training_resnet
    graphdef, state = nnx.split(nnx.view(model, deterministic=True))
    traced = jax.export.export(jax.jit(lambda x: nnx.merge(graphdef, state, copy=True)(x)))(
        jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b, {IMAGE_SHAPE[0]}, {IMAGE_SHAPE[1]}"), np.float32))
    problems = inference_mode_problems(lambda x: np.asarray(traced.call(x)), images, NATIVE_ABS)
    assert len(problems) == 1 and "batch statistics" in problems[0], problems

    rosetta_jax.export_native(model, tmp_path / "native", images)
    for name, predict in rosetta_jax.load_native(tmp_path / "native").items():
        assert inference_mode_problems(predict, images, NATIVE_ABS) == [], name


def _export_in_a_fresh_process(out: Path, every_plugin: bool) -> str:
    """Export the mlp and the attention model to ONNX in a fresh process (jax2onnx imports its plugins once per
    process): with export.py's two plugin packages, or (every_plugin) with every plugin, as jax2onnx does by
    itself. Prints the plugin trees imported and whether equinox was."""
    code = f"""
import importlib, sys
from pathlib import Path
import numpy as np
import rosetta_jax
from rosetta_common.testing import asymmetric_weights, small_config
export = importlib.import_module("rosetta_jax.export")
if {every_plugin!r}:
    export._load_plugins = lambda: None
for arch in ("mlp", "attention"):
    config = small_config(arch, {IMAGE_SHAPE!r})
    model = rosetta_jax.build(config, asymmetric_weights(config, 1))
    export.export_onnx(model, Path({str(out)!r}) / (arch + ".onnx"), np.zeros((2, *{IMAGE_SHAPE!r}), np.float32))
trees = sorted({{m.split(".")[2] for m in sys.modules if m.startswith("jax2onnx.plugins.") and m.count(".") >= 3}})
print(trees, "equinox" in sys.modules)
"""
    out.mkdir()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_onnx_export_imports_only_the_jax_and_flax_nnx_plugins_and_gives_the_same_bytes(tmp_path: Path) -> None:
    """Exporting converts with jax2onnx's jax and flax.nnx plugins alone (export._load_plugins): importing every
    plugin, jax2onnx's default, built equinox modules at import, seconds of XLA compilations per stage. The files
    are byte for byte those of jax2onnx with every plugin."""
    ours, everything = tmp_path / "ours", tmp_path / "every_plugin"
    printed = _export_in_a_fresh_process(ours, every_plugin=False)
    assert printed.split()[-1] == "False", printed  # equinox never imported
    assert printed.rsplit("]", 1)[0] + "]" == "['flax', 'jax']", printed  # no equinox, dm_pix, examples
    assert "equinox" in _export_in_a_fresh_process(everything, every_plugin=True)
    for name in ("mlp.onnx", "attention.onnx"):
        assert (ours / name).read_bytes() == (everything / name).read_bytes(), name


def test_the_plugin_flag_export_py_sets_is_the_one_jax2onnx_reads() -> None:
    """_load_plugins relies on one jax2onnx internal with no public route (its docstring): the module flag
    plugin_system._already_imported_plugins that import_all_plugins reads before importing every plugin. A
    jax2onnx release that moves it fails this test (and the one above) instead of quietly importing every plugin."""
    from jax2onnx.plugins import plugin_system

    assert isinstance(plugin_system._already_imported_plugins, bool)
    source = inspect.getsource(plugin_system.import_all_plugins)
    assert "global _already_imported_plugins" in source and "if _already_imported_plugins:" in source, source
