"""Prediction, native export (.keras and SavedModel), reload without pickle, and ONNX via tf2onnx."""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from rosetta_common.interface import Predict
from rosetta_common.io import atomic_path

KERAS_FILE, SAVED_MODEL_DIR, CONFIG_FILE = "model.keras", "saved_model", "config.json"
# tf2onnx's default is 15; 17 is what ONNX Runtime >= 1.11 runs and is pinned so exports are reproducible.
ONNX_OPSET = 17


def _image_spec(model: keras.Model) -> tf.TensorSpec:
    """Dynamic batch, the model's static (height, width): the one signature every export uses."""
    _, height, width = model.input_shape
    return tf.TensorSpec([None, height, width], tf.float32, name="images")


# One traced forward per model. A graph (not an eager call), so predict gets the same graph rewrites as
# the SavedModel's serve endpoint; a dynamic-batch signature, so no batch size retraces (Keras'
# predict_on_batch retraces for each new size, and model.predict splits into batches of 32).
_FORWARDS: weakref.WeakKeyDictionary[keras.Model, Any] = weakref.WeakKeyDictionary()


def _forward(model: keras.Model) -> Any:
    if model not in _FORWARDS:
        _FORWARDS[model] = tf.function(lambda images: model(images, training=False),
                                       input_signature=[_image_spec(model)])
    return _FORWARDS[model]


def predict(model: keras.Model, images: np.ndarray) -> np.ndarray:
    return np.asarray(_forward(model)(tf.convert_to_tensor(np.asarray(images, np.float32))), dtype=np.float32)


def export_native(model: keras.Model, out_dir: Path, example: np.ndarray) -> list[Path]:
    """Write model.keras (Keras' own zip: config JSON + weights .h5, no pickle) and a TF SavedModel
    with a `serve` endpoint, plus config.json naming them. The caller passes a fresh directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save(out_dir / KERAS_FILE)
    model.export(str(out_dir / SAVED_MODEL_DIR), format="tf_saved_model", verbose=False,
                 input_signature=[_image_spec(model)])
    _, height, width = model.input_shape
    config = {
        "framework": "tf",
        "architecture": model.name,
        "image_shape": [int(height), int(width)],
        "num_classes": int(model.output_shape[-1]),
        "formats": {"keras": KERAS_FILE, "saved_model": SAVED_MODEL_DIR},
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    }
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return sorted(p for p in out_dir.rglob("*") if p.is_file())


def load_native(out_dir: Path) -> dict[str, Predict]:
    """Reload each native format: .keras with safe_mode on (our layers are registered on import of
    rosetta_tf), the SavedModel with tf.saved_model.load (a graph, no Python classes needed)."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / CONFIG_FILE).read_text())
    keras_model = keras.models.load_model(out_dir / config["formats"]["keras"], safe_mode=True, compile=False)
    saved = tf.saved_model.load(str(out_dir / config["formats"]["saved_model"]))

    def predict_keras(images: np.ndarray) -> np.ndarray:
        return predict(keras_model, images)

    def predict_saved_model(images: np.ndarray) -> np.ndarray:
        return np.asarray(saved.serve(tf.constant(np.asarray(images, np.float32))), dtype=np.float32)

    return {"keras": predict_keras, "saved_model": predict_saved_model}


def _name_batch_dim(graph: Any) -> None:
    """tf2onnx calls the dynamic batch dimension "unk__<n>"; call it "batch" (a name only, no behaviour)."""
    old = graph.input[0].type.tensor_type.shape.dim[0].dim_param
    if not old:
        return
    for info in (*graph.input, *graph.output, *graph.value_info):
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param == old:
                dim.dim_param = "batch"


def export_onnx(model: keras.Model, path: Path, example: np.ndarray) -> None:
    """tf2onnx.convert.from_function on a tf.function of the model (from_keras fails on Keras 3 models);
    the dict output names the ONNX output "logits", the TensorSpec names the input "images"."""
    import onnx
    import tf2onnx  # imported here: it is slow to import and only this function needs it

    signature = [_image_spec(model)]

    @tf.function(input_signature=signature)
    def serve(images: Any) -> dict[str, Any]:
        return {"logits": model(images, training=False)}

    proto, _ = tf2onnx.convert.from_function(serve, input_signature=signature, opset=ONNX_OPSET)
    onnx.checker.check_model(proto)
    _name_batch_dim(proto.graph)
    names = ([i.name for i in proto.graph.input], [o.name for o in proto.graph.output])
    if names != (["images"], ["logits"]):
        raise RuntimeError(f"tf2onnx named the graph inputs/outputs {names}, expected images/logits")
    with atomic_path(path) as tmp:
        onnx.save(proto, str(tmp))
