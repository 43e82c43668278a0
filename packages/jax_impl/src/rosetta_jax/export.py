"""predict(), the native formats (Flax msgpack params + a serialized jax.export function) and ONNX.

Native formats, neither of them pickle:
- "flax_msgpack": the NNX parameter state as flax.serialization msgpack (Flax's own checkpoint bytes when
  not using Orbax) plus config.json (arch, image shape, classes, the spec's architecture section); reloaded
  by rebuilding the module and restoring the state into it.
- "jax_export": the forward pass with its weights baked in, lowered by jax.export to StableHLO with a
  symbolic batch dimension "b"; reloaded with jax.export.deserialize, no Python model code needed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, serialization

from rosetta_common.interface import Predict
from rosetta_common.io import atomic_path, write_bytes, write_json
from rosetta_jax.models import Model, ModelConfig, create

CONFIG_FILE = "config.json"
PARAMS_FILE = "params.msgpack"
EXPORT_FILE = "forward.jax_export"
ONNX_SELF_CHECK_ABS = 1e-5  # params.yaml's tolerances.onnx_vs_native_abs; the validate stage checks it again


@partial(jax.jit, static_argnums=0)
def _forward(graphdef: nnx.GraphDef[Any], state: nnx.State, images: jax.Array) -> jax.Array:
    return nnx.merge(graphdef, state)(images)


def predict(model: Model, images: np.ndarray) -> np.ndarray:
    """Logits as float32 numpy; compiles once per new batch size (the graphdef is the static cache key)."""
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef, state, jnp.asarray(images, jnp.float32)), dtype=np.float32)


def _config_json(config: ModelConfig) -> dict[str, Any]:
    return {"framework": "jax", "arch": config.arch, "image_shape": list(config.image_shape),
            "num_classes": config.num_classes, "architecture": json.loads(config.architecture)}


def _config_from_json(raw: dict[str, Any]) -> ModelConfig:
    height, width = raw["image_shape"]
    return ModelConfig(raw["arch"], (int(height), int(width)), int(raw["num_classes"]),
                       json.dumps(raw["architecture"]))


def export_native(model: Model, out_dir: Path, example: np.ndarray) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    paths = [out_dir / CONFIG_FILE, out_dir / PARAMS_FILE, out_dir / EXPORT_FILE]
    write_json(paths[0], _config_json(config))
    pure = nnx.state(model, nnx.Param).to_pure_dict()
    write_bytes(paths[1], serialization.msgpack_serialize(jax.tree.map(np.asarray, pure)))

    graphdef, state = nnx.split(model)
    height, width = config.image_shape
    if tuple(np.shape(example)[1:]) != (height, width):
        raise ValueError(f"example images {np.shape(example)} do not fit the model's {config.image_shape}")
    # The weights are closed over, so they become constants of the exported StableHLO module.
    forward = jax.jit(lambda images: nnx.merge(graphdef, state)(images))
    batch = jax.export.symbolic_shape(f"b, {height}, {width}")
    exported = jax.export.export(forward)(jax.ShapeDtypeStruct(batch, jnp.float32))
    write_bytes(paths[2], bytes(exported.serialize()))
    return paths


def load_native(out_dir: Path) -> dict[str, Predict]:
    out_dir = Path(out_dir)
    config = _config_from_json(json.loads((out_dir / CONFIG_FILE).read_text()))
    model = create(config)
    state = nnx.state(model, nnx.Param)
    restored = serialization.msgpack_restore((out_dir / PARAMS_FILE).read_bytes())
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, restored))
    nnx.update(model, state)

    exported = jax.export.deserialize(bytearray((out_dir / EXPORT_FILE).read_bytes()))

    def jax_export_predict(images: np.ndarray) -> np.ndarray:
        return np.asarray(exported.call(jnp.asarray(images, jnp.float32)), dtype=np.float32)

    return {"flax_msgpack": partial(predict, model), "jax_export": jax_export_predict}


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """jax2onnx's IR library logs a harmless warning per shape constant it leaves untyped; hide them."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def export_onnx(model: Model, path: Path, example: np.ndarray) -> None:
    """ONNX via jax2onnx (jax2tf -> tf2onnx is dead), batch dimension "B", opset 23 (jax2onnx's default,
    which onnxruntime 1.32 runs). Checked with onnx.checker and on `example` under onnxruntime before the
    file appears at `path`."""
    import onnx
    import onnxruntime as ort
    from jax2onnx import to_onnx  # imported here: slow to import, and only this stage needs it

    config = model.config
    height, width = config.image_shape
    if tuple(np.shape(example)[1:]) != (height, width):
        raise ValueError(f"example images {np.shape(example)} do not fit the model's {config.image_shape}")
    with _quiet("onnx_ir"):
        proto = to_onnx(lambda images: model(images), [("B", height, width)],
                        model_name=f"rosetta_{config.arch}", input_names=["images"], output_names=["logits"])
    onnx.checker.check_model(proto, full_check=True)
    example = np.asarray(example, np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    error = float(np.abs(session.run(["logits"], {"images": example})[0] - predict(model, example)).max())
    if not error <= ONNX_SELF_CHECK_ABS:
        raise RuntimeError(f"jax2onnx export of {config.arch}: onnxruntime differs from JAX by {error:.3g}")
    with atomic_path(path) as tmp:
        onnx.save_model(proto, str(tmp))
