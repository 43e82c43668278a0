"""Native export (.keras and SavedModel), reload without pickle, and ONNX via tf2onnx: the contract's
export_native(), load_native() and export_onnx()."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from pydantic import ValidationError
from tensorflow.core.protobuf import fingerprint_pb2

from rosetta_common.errors import ArtifactError, ExportError, one_line
from rosetta_common.interface import Predict
from rosetta_common.io import atomic_path, write_json
from rosetta_common.onnx_conventions import OPSETS, OUTPUT_NAME, canonical_names, conform
from rosetta_common.spec import CONFIG_FILE, ModelConfig
from rosetta_tf.models import attach_config, image_spec, model_config, model_input, predict, tokens_spec

KERAS_FILE, SAVED_MODEL_DIR = "model.keras", "saved_model"


def export_native(model: keras.Model, out_dir: Path, example: np.ndarray) -> list[Path]:
    """Write model.keras (Keras' own zip: config JSON + weights .h5, no pickle), a TF SavedModel with a
    `serve` endpoint, and config.json naming them and holding the model's ModelConfig (model.keras records
    layers, not the spec). The caller passes a fresh directory.

    Every file is a pure function of the model and of the calling process' code path (DVC hashes them):
    two fresh processes doing the same export write the same bytes (tests/test_export.py)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _save_keras(model, out_dir / KERAS_FILE)
    _save_saved_model(model, out_dir / SAVED_MODEL_DIR)
    write_json(out_dir / CONFIG_FILE, {
        "framework": "tf",
        "model": model_config(model).model_dump(mode="json"),
        "formats": {"keras": KERAS_FILE, "saved_model": SAVED_MODEL_DIR},
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    })
    return sorted(p for p in out_dir.rglob("*") if p.is_file())


# The earliest date a zip entry can hold (MS-DOS epoch), as reproducible-builds tools use.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_ZIP_FILE_MODE, _ZIP_DIR_MODE = 0o100644, 0o040755
_ZIP_UNIX = 3  # create_system: zipfile writes 0 on Windows, 3 elsewhere; pinned so the host does not show


def _save_keras(model: keras.Model, path: Path) -> None:
    """model.save, then the zip rewritten byte-stable. Keras' own zip differs on every save:
    - metadata.json has `date_saved` (now, to the second): dropped, Keras' loader never reads it;
    - config.json has `shared_object_id` = id() of each object serialized more than once (the layers'
      shared DTypePolicy), a memory address: renumbered 1, 2, ... in order of appearance (the ids only pair
      up occurrences within this one file at load time, so any one-to-one renumbering loads the same);
    - model.weights.h5 gets the current local time as its zip entry date (written with a bare name).
    The h5 itself is already stable: h5py does not record object times (track_times off by default) and
    Keras writes it in memory in a fixed order; the byte-identity test would catch it if that changed.
    The entries are rewritten in name order, dated 1980-01-01, mode 0644, stored uncompressed (as Keras
    stores them: deflate output could vary with the zlib build)."""
    with atomic_path(path) as staged:
        model.save(staged)  # staged keeps the name model.keras: Keras requires the .keras suffix
        with zipfile.ZipFile(staged) as archive:
            entries = {info.filename: archive.read(info) for info in archive.infolist()}
        if "metadata.json" in entries:
            metadata = json.loads(entries["metadata.json"])
            metadata.pop("date_saved", None)
            entries["metadata.json"] = json.dumps(metadata).encode()
        if "config.json" in entries:
            config = json.loads(entries["config.json"])
            _renumber_shared_objects(config, {})
            entries["config.json"] = json.dumps(config).encode()  # Keras' own json.dumps format
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_STORED) as archive:
            for name in sorted(entries):
                info = zipfile.ZipInfo(name, date_time=_ZIP_DATE_TIME)
                info.compress_type = zipfile.ZIP_STORED
                info.create_system = _ZIP_UNIX
                info.external_attr = (_ZIP_DIR_MODE << 16) | 0x10 if name.endswith("/") else _ZIP_FILE_MODE << 16
                archive.writestr(info, entries[name])


def _renumber_shared_objects(node: Any, numbers: dict[int, int]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "shared_object_id":
                node[key] = numbers.setdefault(value, len(numbers) + 1)
            else:
                _renumber_shared_objects(value, numbers)
    elif isinstance(node, list):
        for item in node:
            _renumber_shared_objects(item, numbers)


def _save_saved_model(model: keras.Model, path: Path) -> None:
    """A SavedModel with one `serve` endpoint (dynamic batch) and the model's variables, written with
    tf.saved_model.save on a tf.Module of our own rather than model.export: Keras' ExportArchive tracks
    the variables in the order of the traced function's watched-variable set, a set keyed by object
    identity, so the object graph, saved_model.pb, variables.index and variables.data came out permuted
    from one process to the next. Here they are tracked in model.variables order (build order).

    Function names in saved_model.pb carry TF's process-wide trace counter (__inference_serve_<n>), so the
    bytes also depend on how many functions the process traced before; the same code path gives the same
    counter. fingerprint.pb holds a random uuid per save (TF >= 2.15), cleared here: its hashes of the
    other files are kept, and TF reads the uuid only for its load metrics."""
    root = tf.Module()
    root.model_variables = list(model.variables)
    if model_config(model).input.kind == "tokens":  # int64 (batch, length), both dynamic; the argument "tokens"
        root.serve = tf.function(lambda tokens: model(tokens, training=False),
                                 input_signature=[tokens_spec()], autograph=False)
    else:
        root.serve = tf.function(lambda images: model(images, training=False),
                                 input_signature=[image_spec(model)], autograph=False)
    serve = root.serve.get_concrete_function()
    with atomic_path(path) as staged:
        # "serving_default" as well, as model.export does: TF-Serving looks for that key.
        tf.saved_model.save(root, str(staged), signatures={"serve": serve, "serving_default": serve})
        fingerprint_path = staged / "fingerprint.pb"
        if fingerprint_path.is_file():
            fingerprint = fingerprint_pb2.FingerprintDef.FromString(fingerprint_path.read_bytes())
            if "uuid" in fingerprint.DESCRIPTOR.fields_by_name:
                fingerprint.ClearField("uuid")
            fingerprint_path.write_bytes(fingerprint.SerializeToString(deterministic=True))


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
    # Per example: (height, width), or a token model's dynamic length (None,).
    expected = (None,) if config.input.kind == "tokens" else config.image_shape
    if tuple(model.input_shape[1:]) != expected:
        raise ArtifactError(f"{path}: input shape {model.input_shape[1:]}, {CONFIG_FILE} says {expected}")
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

    config = model_config(keras_model)

    def predict_saved_model(images: np.ndarray) -> np.ndarray:
        # Checked as predict checks (a graph would fail on a bad id far less clearly, or not at all on a GPU).
        return np.asarray(saved.serve(model_input(config, images, f"{saved_path}")), dtype=np.float32)

    return {"keras": predict_keras, "saved_model": predict_saved_model}


def export_onnx(model: keras.Model, path: Path, example: np.ndarray) -> None:
    """tf2onnx.convert.from_function on a tf.function of the model (from_keras fails on Keras 3 models),
    at the opset pinned for tf; the TensorSpec names the input ("images", or "tokens" int64 for a token model),
    the dict output names the output, and conform() names the batch dimension on both (tf2onnx leaves the output's
    unnamed), and a token input's length dimension. ExportError on failure."""
    import onnx
    import tf2onnx  # imported here: it is slow to import and only this function needs it

    tokens = model_config(model).input.kind == "tokens"
    signature = [tokens_spec() if tokens else image_spec(model)]  # tokens: int64, dynamic batch and length

    @tf.function(input_signature=signature)
    def serve(images: Any) -> dict[str, Any]:
        return {OUTPUT_NAME: model(images, training=False)}

    arch = model_config(model).arch
    tf2onnx.utils.INTERNAL_NAME = 1  # its process-global name counter: every conversion starts from the same one
    try:
        proto, _ = tf2onnx.convert.from_function(serve, input_signature=signature, opset=OPSETS["tf"])
    except Exception as error:  # tf2onnx raises whatever its handlers raise
        raise ExportError(f"tf2onnx could not convert the {arch} model: {one_line(str(error))}") from error
    canonical_names(proto)  # byte-stable files: no converter counter survives in a name
    conform(proto, "tf")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        raise ExportError(f"tf2onnx wrote an invalid {arch} model: {one_line(str(error))}") from None
    with atomic_path(path) as tmp:
        onnx.save(proto, str(tmp))
