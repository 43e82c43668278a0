"""What only the Keras exports need: model.keras records layers, not the spec, so the ModelConfig travels in
config.json beside it; .keras loads with safe_mode (no arbitrary code); each broken file is named; an export
traced in training mode would be caught, and the recurrent layers convert to the ONNX form stated here. Native
reload parity and the ONNX conventions are the conformance suite's (rosetta_common.conformance)."""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import pytest

import rosetta_tf
from rosetta_common.errors import ArtifactError, ExportError
from rosetta_common.metrics import inference_mode_problems
from rosetta_common.onnx_conventions import INPUT_NAME, OPSETS, OUTPUT_NAME
from rosetta_common.spec import CONFIG_FILE, ModelConfig, Spec
from rosetta_common.testing import ARCHS, asymmetric_weights, random_inputs, small_config
from rosetta_tf.export import KERAS_FILE, SAVED_MODEL_DIR, load_keras, load_native

NON_SQUARE = (6, 10)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelConfig, Path]:
    config = small_config("cnn", NON_SQUARE)
    out = tmp_path_factory.mktemp("export") / "native"
    example = np.random.default_rng(0).random((2, *NON_SQUARE), dtype=np.float32)
    rosetta_tf.export_native(rosetta_tf.build(config, asymmetric_weights(config, 0)), out, example)
    return config, out


def test_reloaded_keras_model_gets_its_config_back(exported: tuple[ModelConfig, Path]) -> None:
    config, out = exported
    assert ModelConfig.model_validate(json.loads((out / CONFIG_FILE).read_text())["model"]) == config
    assert rosetta_tf.model_config(load_keras(out)) == config


def _lambda_model(out: Path) -> None:
    # A Lambda layer holds arbitrary Python: Keras' safe_mode refuses to deserialize it.
    inputs = keras.Input(shape=NON_SQUARE)
    keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2.0)(inputs)).save(out / KERAS_FILE)


def _truncate_keras(out: Path) -> None:
    path = out / KERAS_FILE
    path.write_bytes(path.read_bytes()[:200])


def _damage_config(out: Path) -> None:
    (out / CONFIG_FILE).write_text("{")


def _drop_saved_model(out: Path) -> None:
    shutil.rmtree(out / SAVED_MODEL_DIR)


BREAKAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "unsafe_lambda": (_lambda_model, KERAS_FILE),
    "truncated_keras": (_truncate_keras, KERAS_FILE),
    "damaged_config": (_damage_config, CONFIG_FILE),
    "missing_saved_model": (_drop_saved_model, SAVED_MODEL_DIR),
}


@pytest.mark.parametrize("case", list(BREAKAGES))
def test_broken_exports_are_one_line_artifact_errors(case: str, exported: tuple[ModelConfig, Path],
                                                     tmp_path: Path) -> None:
    breaks, culprit = BREAKAGES[case]
    out = tmp_path / "native"
    shutil.copytree(exported[1], out)
    breaks(out)
    with pytest.raises(ArtifactError) as raised:
        rosetta_tf.load_native(out)
    message = str(raised.value)
    assert "\n" not in message and str(out / culprit) in message, message


def test_converter_failure_is_an_export_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tf2onnx

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unsupported op\nwith a long traceback-like message")

    monkeypatch.setattr(tf2onnx.convert, "from_function", fail)
    config = small_config("mlp")
    model = rosetta_tf.build(config, asymmetric_weights(config, 0))
    with pytest.raises(ExportError) as raised:
        rosetta_tf.export_onnx(model, tmp_path / "model.onnx", np.zeros((1, *config.image_shape), np.float32))
    assert str(raised.value) == "tf2onnx could not convert the mlp model: unsupported op"
    assert not (tmp_path / "model.onnx").exists()


@pytest.fixture(scope="module")
def native_exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every architecture's native export (the same config and weights as the tests below), in this process.
    That two fresh processes write these files byte for byte is the conformance suite's
    test_exports_repeat_byte_for_byte_across_processes (every native and ONNX file of every architecture); two more
    processes here, exporting again only at another image shape, took about 20 s of this suite for nothing new."""
    out = tmp_path_factory.mktemp("native")
    example = np.zeros((2, *NON_SQUARE), np.float32)
    for arch in ARCHS:
        config = small_config(arch, NON_SQUARE)
        rosetta_tf.export_native(rosetta_tf.build(config, asymmetric_weights(config, 0)), out / arch, example)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_keras_zip_carries_no_time_or_address(arch: str, native_exports: Path) -> None:
    with zipfile.ZipFile(native_exports / arch / KERAS_FILE) as archive:
        infos = archive.infolist()
        assert [info.filename for info in infos] == sorted(info.filename for info in infos)
        assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}
        assert {info.compress_type for info in infos} == {zipfile.ZIP_STORED}
        assert "date_saved" not in json.loads(archive.read("metadata.json"))
        config = json.loads(archive.read("config.json"))
    # Layers share the global DTypePolicy, so Keras marks it shared: renumbered 1, 2, ..., not id() addresses.
    ids = sorted(set(_shared_object_ids(config)))
    assert ids and ids == list(range(1, len(ids) + 1)), ids


def _shared_object_ids(node: object) -> list[int]:
    if isinstance(node, dict):
        own = [node["shared_object_id"]] if "shared_object_id" in node else []
        return own + [i for value in node.values() for i in _shared_object_ids(value)]
    if isinstance(node, list):
        return [i for item in node for i in _shared_object_ids(item)]
    return []


@pytest.mark.parametrize("arch", ARCHS)
def test_normalized_export_loads_safely_and_predicts_identically(arch: str,
                                                                 native_exports: Path) -> None:
    config = small_config(arch, NON_SQUARE)
    model = rosetta_tf.build(config, asymmetric_weights(config, 0))
    images = random_inputs(config, 5, 1)  # images, or padded token ids
    expected = rosetta_tf.predict(model, images)
    out = native_exports / arch
    raw = keras.models.load_model(out / KERAS_FILE, safe_mode=True, compile=False)  # without our wrapper
    assert np.array_equal(np.asarray(raw(images, training=False)), np.asarray(model(images, training=False)))
    for name, predict in load_native(out).items():
        assert np.array_equal(predict(images), expected), name


INFERENCE_ABS = Spec().tolerances.native_roundtrip_abs


def _training_mode_onnx(model: keras.Model, path: Path) -> None:
    """The mistake: tf2onnx on a tf.function that calls the model with training=True (Keras' Dropout drawing
    its own masks, BatchNorm on the batch's statistics)."""
    import onnx
    import tensorflow as tf
    import tf2onnx

    signature = [rosetta_tf.models.image_spec(model)]

    @tf.function(input_signature=signature)
    def serve(images: tf.Tensor) -> dict[str, tf.Tensor]:
        return {OUTPUT_NAME: model(images, training=True)}

    proto, _ = tf2onnx.convert.from_function(serve, input_signature=signature, opset=OPSETS["tf"])
    onnx.save(proto, str(path))


def test_an_export_in_training_mode_is_caught(tmp_path: Path) -> None:
    import onnxruntime as ort

    config = small_config("resnet")
    model = rosetta_tf.build(config, asymmetric_weights(config, 0))
    images = np.random.default_rng(2).random((8, *config.image_shape), dtype=np.float32)
    # tf2onnx cannot convert Keras' training-mode Dropout (StatelessRandomUniformV2), so the ONNX mistake is
    # made on the same weights without dropout: BatchNorm on batch statistics is what must show there.
    settings = config.settings.model_copy(update={"dropout": 0.0})
    no_dropout = rosetta_tf.build(config.model_copy(update={"settings": settings}), rosetta_tf.to_canonical(model))
    _training_mode_onnx(no_dropout, tmp_path / "training.onnx")
    session = ort.InferenceSession(str(tmp_path / "training.onnx"), providers=["CPUExecutionProvider"])
    problems = inference_mode_problems(lambda x: session.run(None, {INPUT_NAME: x})[0], images, INFERENCE_ABS)
    assert any("batch statistics" in p for p in problems), problems
    # The native equivalent, Keras in training mode: its Dropout draws a new mask per call, so runs differ too.
    eager = inference_mode_problems(lambda x: np.asarray(model(x, training=True)), images, INFERENCE_ABS)
    assert any("dropout" in p for p in eager) and any("batch statistics" in p for p in eager), eager
    # What the package exports from the same model is in inference mode.
    rosetta_tf.export_onnx(model, tmp_path / "model.onnx", images)
    ours = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    assert inference_mode_problems(lambda x: ours.run(None, {INPUT_NAME: x})[0], images, INFERENCE_ABS) == []


# The ONNX form of each recurrent layer: tf2onnx rewrites Keras 3's LSTM loop to one LSTM op; it has no pattern for
# Keras 3's GRU cell, which models.GRUClassifier therefore unrolls into plain ops (a rolled one became a Loop whose
# bytes changed from one process to the next). BatchNorm folds into the convolutions.
ONNX_FORM = {"lstm": ({"LSTM"}, {"Loop", "Scan"}), "gru": ({"MatMul", "Sigmoid", "Tanh"}, {"Loop", "Scan", "GRU"}),
             "resnet": ({"Conv", "GlobalAveragePool"}, {"BatchNormalization", "Dropout", "RandomUniform"})}


@pytest.mark.parametrize("arch", list(ONNX_FORM))
def test_onnx_form_of_the_new_layers(arch: str, tmp_path: Path) -> None:
    import onnx

    config = small_config(arch)
    model = rosetta_tf.build(config, asymmetric_weights(config, 0))
    rosetta_tf.export_onnx(model, tmp_path / "model.onnx", np.zeros((1, *config.image_shape), np.float32))
    ops = {node.op_type for node in onnx.load(str(tmp_path / "model.onnx")).graph.node}
    present, absent = ONNX_FORM[arch]
    assert present <= ops and not absent & ops, sorted(ops)
