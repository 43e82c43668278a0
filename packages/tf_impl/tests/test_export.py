"""What only the Keras exports need: model.keras records layers, not the spec, so the ModelConfig travels in
config.json beside it; .keras loads with safe_mode (no arbitrary code); each broken file is named. Native
reload parity and the ONNX conventions are the conformance suite's (rosetta_common.conformance)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import pytest

import rosetta_tf
from rosetta_common.errors import ArtifactError, ExportError
from rosetta_common.spec import ModelConfig
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_tf.export import CONFIG_FILE, KERAS_FILE, SAVED_MODEL_DIR, load_keras

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
