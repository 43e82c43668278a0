"""Native export (.keras and SavedModel), reload without pickle, and ONNX via tf2onnx: the contract's
export_native(), load_native() and export_onnx()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from pydantic import ValidationError

from rosetta_common.errors import ArtifactError, ExportError, one_line
from rosetta_common.interface import Predict
from rosetta_common.io import atomic_path, write_json
from rosetta_common.onnx_conventions import OPSETS, OUTPUT_NAME, conform
from rosetta_common.spec import ModelConfig
from rosetta_tf.models import attach_config, image_spec, model_config, predict

KERAS_FILE, SAVED_MODEL_DIR, CONFIG_FILE = "model.keras", "saved_model", "config.json"


def export_native(model: keras.Model, out_dir: Path, example: np.ndarray) -> list[Path]:
    """Write model.keras (Keras' own zip: config JSON + weights .h5, no pickle), a TF SavedModel with a
    `serve` endpoint, and config.json naming them and holding the model's ModelConfig (model.keras records
    layers, not the spec). The caller passes a fresh directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save(out_dir / KERAS_FILE)
    model.export(str(out_dir / SAVED_MODEL_DIR), format="tf_saved_model", verbose=False,
                 input_signature=[image_spec(model)])
    write_json(out_dir / CONFIG_FILE, {
        "framework": "tf",
        "model": model_config(model).model_dump(mode="json"),
        "formats": {"keras": KERAS_FILE, "saved_model": SAVED_MODEL_DIR},
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    })
    return sorted(p for p in out_dir.rglob("*") if p.is_file())


def _read_config(out_dir: Path) -> tuple[ModelConfig, dict[str, str]]:
    path = out_dir / CONFIG_FILE
    try:
        meta = json.loads(path.read_text())
        return ModelConfig.model_validate(meta["model"]), dict(meta["formats"])
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing (not a rosetta_tf native export)") from None
    except (ValueError, KeyError, TypeError) as error:  # bad JSON, a missing key, an invalid ModelConfig
        detail = one_line(error.errors()[0]["msg"]) if isinstance(error, ValidationError) else one_line(repr(error))
        raise ArtifactError(f"{path}: damaged ({detail})") from None


def load_keras(out_dir: Path) -> keras.Model:
    """The .keras model of an export, with safe_mode on (our layers are registered on import of rosetta_tf,
    a Lambda layer or other arbitrary code is refused), carrying its ModelConfig again."""
    out_dir = Path(out_dir)
    config, formats = _read_config(out_dir)
    path = out_dir / formats["keras"]
    if not path.is_file():
        raise ArtifactError(f"{path}: missing")
    try:
        model = keras.models.load_model(path, safe_mode=True, compile=False)
    except Exception as error:  # Keras raises ValueError, OSError, zipfile errors, ... for damaged files
        raise ArtifactError(f"{path}: cannot be loaded safely ({one_line(str(error))})") from None
    if tuple(model.input_shape[1:]) != config.image_shape:
        raise ArtifactError(f"{path}: input shape {model.input_shape[1:]}, {CONFIG_FILE} says {config.image_shape}")
    return attach_config(model, config)


def load_native(out_dir: Path) -> dict[str, Predict]:
    """Reload each native format: .keras (load_keras), the SavedModel with tf.saved_model.load (a graph, no
    Python classes needed). ArtifactError naming the file when one is missing or damaged."""
    out_dir = Path(out_dir)
    keras_model = load_keras(out_dir)
    saved_path = out_dir / _read_config(out_dir)[1]["saved_model"]
    if not saved_path.is_dir():
        raise ArtifactError(f"{saved_path}: missing")
    try:
        saved = tf.saved_model.load(str(saved_path))
    except Exception as error:  # TF raises OSError, DecodeError, ... for damaged protos
        raise ArtifactError(f"{saved_path}: cannot be loaded ({one_line(str(error))})") from None

    def predict_keras(images: np.ndarray) -> np.ndarray:
        return predict(keras_model, images)

    def predict_saved_model(images: np.ndarray) -> np.ndarray:
        return np.asarray(saved.serve(tf.constant(np.asarray(images, np.float32))), dtype=np.float32)

    return {"keras": predict_keras, "saved_model": predict_saved_model}


def export_onnx(model: keras.Model, path: Path, example: np.ndarray) -> None:
    """tf2onnx.convert.from_function on a tf.function of the model (from_keras fails on Keras 3 models),
    at the opset pinned for tf; the TensorSpec names the input, the dict output names the output, and
    conform() names the batch dimension on both (tf2onnx leaves the output's unnamed). ExportError on failure."""
    import onnx
    import tf2onnx  # imported here: it is slow to import and only this function needs it

    signature = [image_spec(model)]

    @tf.function(input_signature=signature)
    def serve(images: Any) -> dict[str, Any]:
        return {OUTPUT_NAME: model(images, training=False)}

    arch = model_config(model).arch
    try:
        proto, _ = tf2onnx.convert.from_function(serve, input_signature=signature, opset=OPSETS["tf"])
    except Exception as error:  # tf2onnx raises whatever its handlers raise
        raise ExportError(f"tf2onnx could not convert the {arch} model: {one_line(str(error))}") from error
    conform(proto, "tf")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        raise ExportError(f"tf2onnx wrote an invalid {arch} model: {one_line(str(error))}") from None
    with atomic_path(path) as tmp:
        onnx.save(proto, str(tmp))
