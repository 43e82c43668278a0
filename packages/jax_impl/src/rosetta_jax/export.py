"""The contract's native formats (Flax msgpack params + a serialized jax.export function) and ONNX.

Native formats, neither of them pickle:
- "flax_msgpack": the NNX variables (parameters and BatchNorm's running statistics) as flax.serialization
  msgpack (Flax's own checkpoint bytes when not using Orbax) plus config.json (the model's
  rosetta_common.spec.ModelConfig as pydantic JSON); reloaded by rebuilding the module and restoring the
  state into it.
- "jax_export": the forward pass with its weights baked in, lowered by jax.export to StableHLO with a
  symbolic batch dimension "b"; reloaded with jax.export.deserialize, no Python model code needed.

Every export is of inference_view(model): BatchNorm on its running statistics, dropout off, whatever mode
the caller left the model in (nnx.Module.train() flips both, and an export keeps the mode it was traced in).
The recurrent layers' lax.scan goes through jax.export as it is, and through jax2onnx as an ONNX Loop.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, serialization

from rosetta_common.errors import ArtifactError, ExportError, WeightsError, one_line
from rosetta_common.interface import Predict
from rosetta_common.io import atomic_path, write_bytes, write_text
from rosetta_common.onnx_conventions import BATCH_DIM, LENGTH_DIM, OPSETS, OUTPUT_NAME, conform
from rosetta_common.spec import CONFIG_FILE, ModelConfig
from rosetta_jax.models import Model, build, jax_ids, predict
from rosetta_jax.weights import VARIABLES, from_native

PARAMS_FILE = "params.msgpack"
EXPORT_FILE = "forward.jax_export"


def inference_view(model: Model) -> Model:
    """The model in inference mode, sharing its variables: running statistics, dropout off."""
    return nnx.view(model, use_running_average=True, deterministic=True, raise_if_not_found=False)


def _closed_forward(graphdef: nnx.GraphDef[Model], state: nnx.State, images: jax.Array) -> jax.Array:
    """The forward with the weights closed over, so that they become constants of the traced program. The
    model is rebuilt with copies of its variables inside the trace: nnx.RNN's nnx.scan refuses variables
    created outside the trace it runs in ("Cannot extract graph node from different trace level")."""
    return nnx.merge(graphdef, state, copy=True)(images)


def _check_example(config: ModelConfig, example: np.ndarray) -> None:
    if config.input.kind == "tokens":
        config.input.check(example, "example tokens")
    elif tuple(np.shape(example)[1:]) != config.image_shape:
        raise ValueError(f"example images {np.shape(example)} do not fit the model's {config.image_shape}")


def export_native(model: Model, out_dir: Path, example: np.ndarray) -> list[Path]:
    """Write config.json, params.msgpack and forward.jax_export into `out_dir` (each file atomically)."""
    config = model.config
    _check_example(config, example)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / CONFIG_FILE, out_dir / PARAMS_FILE, out_dir / EXPORT_FILE]
    write_text(paths[0], config.model_dump_json(indent=2) + "\n")
    model = inference_view(model)
    pure = nnx.to_pure_dict(nnx.state(model, VARIABLES))
    write_bytes(paths[1], serialization.msgpack_serialize(jax.tree.map(np.asarray, pure)))

    graphdef, state = nnx.split(model)
    forward = jax.jit(partial(_closed_forward, graphdef, state))
    exported = jax.export.export(forward)(input_struct(config))  # locations: see configure()
    write_bytes(paths[2], bytes(exported.serialize()))
    return paths


def token_shape(config: ModelConfig, batch: str, length: str) -> tuple[Any, ...]:
    """A token model's symbolic (batch, length), length at most max_length: without that constraint the
    positions sliced to the length, pos_embedding[:length], would be min(max_length, length) long."""
    return jax.export.symbolic_shape(f"{batch}, {length}", constraints=[f"{length} <= {config.max_length}"])


def input_struct(config: ModelConfig) -> jax.ShapeDtypeStruct:
    """The jax.export argument: images (b, height, width) float32, or token ids (b, length) int32: a token model's
    module has a symbolic length too, and takes JAX's integer (x64 stays off: a module taking int64 could be called
    only with x64 on); load_native's predict takes the contract's int64 ids, checks them and converts (exact).
    Defined after export_native, as the text model's code is after the image models': a jax.export module
    records the source line of every op, and the image models' exports keep their bytes."""
    if config.input.kind == "tokens":
        return jax.ShapeDtypeStruct(token_shape(config, "b", "length"), jnp.int32)
    height, width = config.image_shape
    return jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b, {height}, {width}"), jnp.float32)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ArtifactError(f"{path}: native export file is missing or unreadable ({error.strerror})") from None


def _flatten(tree: object, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """Nested msgpack dicts -> (path, leaf) pairs; a damaged file may restore to a bare leaf: path ()."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flatten(value, (*prefix, str(key)))
    else:
        yield prefix, tree


def _load_flax(out_dir: Path) -> Model:
    config_path, params_path = out_dir / CONFIG_FILE, out_dir / PARAMS_FILE
    try:
        config = ModelConfig.model_validate_json(_read(config_path))
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        raise ArtifactError(f"{config_path}: not a valid model config ({one_line(str(error))})") from None
    try:
        restored = serialization.msgpack_restore(_read(params_path))
    except ArtifactError:
        raise
    except Exception as error:  # msgpack raises several unrelated types for damaged bytes
        raise ArtifactError(f"{params_path}: not readable Flax msgpack ({one_line(str(error))})") from None
    try:
        # Back to canonical names so that build() checks names, shapes and dtype.
        flat = {".".join(path): np.asarray(value) for path, value in _flatten(restored)}
        return build(config, from_native(config, flat))
    except WeightsError as error:
        raise ArtifactError(f"{params_path}: {error}") from None


def load_native(out_dir: Path) -> dict[str, Predict]:
    """{"flax_msgpack": predict of the rebuilt model, "jax_export": the deserialized module}; ArtifactError
    (one line, naming the file) if a file is missing or damaged."""
    out_dir = Path(out_dir)
    model = _load_flax(out_dir)
    export_path = out_dir / EXPORT_FILE
    try:
        exported = jax.export.deserialize(bytearray(_read(export_path)))
    except ArtifactError:
        raise
    except Exception as error:  # flatbuffers/StableHLO errors for damaged bytes
        raise ArtifactError(f"{export_path}: not a readable jax.export module ({one_line(str(error))})") from None

    config = model.config

    def jax_export_predict(images: np.ndarray) -> np.ndarray:
        if config.input.kind == "tokens":
            return np.asarray(exported.call(jnp.asarray(jax_ids(config.input.check(images, "jax_export")))),
                              dtype=np.float32)
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


def _static_dims(info: Any) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]


def drop_contradicted_shapes(proto: Any) -> Any:
    """Remove the intermediate shape annotations (value_info) that contradict ONNX's own shape inference.

    jax2onnx 0.17.1 moves an elementwise op (the ReLU after a Conv + BatchNorm) across the NCHW <-> NHWC
    Transposes it cancels out, but leaves the op's output annotated with the old NHWC shape, which the
    checker rejects ("Inferred shape and existing shape differ"); the graph itself computes the right thing
    (ONNX Runtime is compared with JAX at every batch size). Annotations are optional, so the stale ones go
    and every other one stays (models without the pattern keep their bytes). Returns the same ModelProto."""
    import onnx

    bare = onnx.ModelProto()
    bare.CopyFrom(proto)
    del bare.graph.value_info[:]
    inferred = {v.name: _static_dims(v) for v in onnx.shape_inference.infer_shapes(bare).graph.value_info}

    def contradicted(info: Any) -> bool:
        ours, theirs = _static_dims(info), inferred.get(info.name)
        if theirs is None or not info.type.tensor_type.HasField("shape"):
            return False
        return len(ours) != len(theirs) or any(a is not None and b is not None and a != b
                                               for a, b in zip(ours, theirs, strict=True))

    kept = [v for v in proto.graph.value_info if not contradicted(v)]
    if len(kept) != len(proto.graph.value_info):
        copies = [type(v)() for v in kept]
        for copy, info in zip(copies, kept, strict=True):
            copy.CopyFrom(info)
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(copies)
    return proto


def int64_tokens_input(proto: Any) -> Any:
    """Make the graph's int32 token input (jax2onnx traces with x64 off: JAX's int is int32) the convention's int64
    one: the input keeps its name and dims, becomes int64, and one Cast to int32 feeds what read it (exact: ids
    are below the vocabulary size). Returns the same ModelProto."""
    import onnx

    graph = proto.graph
    tokens = graph.input[0]
    if tokens.type.tensor_type.elem_type == onnx.TensorProto.INT64:
        return proto
    inner = f"{tokens.name}_int32"
    for node in graph.node:
        node.input[:] = [inner if name == tokens.name else name for name in node.input]
    graph.node.insert(0, onnx.helper.make_node("Cast", [tokens.name], [inner], name=f"{tokens.name}_to_int32",
                                               to=onnx.TensorProto.INT32))
    tokens.type.tensor_type.elem_type = onnx.TensorProto.INT64
    return proto


# The jax2onnx plugin packages our models convert with: jax's primitives and flax.nnx's modules.
PLUGIN_PACKAGES = ("jax2onnx.plugins.jax", "jax2onnx.plugins.flax.nnx")


def _load_plugins() -> None:
    """Import only jax2onnx's jax and flax.nnx plugins, once per process.

    On its first conversion jax2onnx imports every plugin it ships (plugin_system.import_all_plugins), equinox's,
    dm_pix's and its examples too, and several of those build equinox modules at import: about 70 eager XLA
    compilations. With these two packages alone a train_export stage's 14 exports (two per model) took 3.1 s
    instead of 9.6 s (medians of 5 alternated processes on 2 threads), every file byte for byte the same (all
    seven models). The packages are imported through importlib and pkgutil; the private part is the flag that
    tells jax2onnx its plugins are imported (plugin_system._already_imported_plugins): jax2onnx 0.17 has no public
    way to choose its plugins or skip importing them all (its import_all_plugins reads only that flag). Guarded:
    if a release moves the flag, the converter imports every plugin again (slower, the same bytes) and
    test_export's test of this internal fails."""
    try:
        from jax2onnx.plugins import plugin_system
    except ImportError:
        return
    if getattr(plugin_system, "_already_imported_plugins", None) is not False:
        return  # imported already, or the flag moved: jax2onnx imports its plugins itself
    for name in PLUGIN_PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(module.name)
    plugin_system._already_imported_plugins = True


def export_onnx(model: Model, path: Path, example: np.ndarray) -> None:
    """ONNX via jax2onnx (jax2tf -> tf2onnx is dead) at the pinned opset, meeting
    rosetta_common.onnx_conventions (conform() checks it); written atomically. Whether onnxruntime agrees
    with JAX is checked by the validate stage and the conformance suite, against params.yaml's tolerances."""
    import onnx
    from jax2onnx import to_onnx  # imported here: slow to import, and only this stage needs it

    _load_plugins()

    config = model.config
    _check_example(config, example)
    tokens = config.input.kind == "tokens"
    if tokens:  # (batch, length) int32 ids: jax2onnx traces with x64 off, int64_tokens_input makes them int64
        inputs: list[Any] = [jax.ShapeDtypeStruct(token_shape(config, BATCH_DIM, LENGTH_DIM), jnp.int32)]
    else:
        height, width = config.image_shape
        inputs = [(BATCH_DIM, height, width)]
    model = inference_view(model)
    try:
        with _quiet("onnx_ir"):
            proto = to_onnx(partial(_closed_forward, *nnx.split(model)), inputs,
                            model_name=f"rosetta_{config.arch}", opset=OPSETS["jax"],
                            input_names=[config.input.name], output_names=[OUTPUT_NAME])
        if tokens:
            int64_tokens_input(proto)
        drop_contradicted_shapes(proto)
        onnx.checker.check_model(proto, full_check=True)
    except Exception as error:  # the converter's own failures come as many types; one line for the stage
        raise ExportError(f"jax2onnx export of {config.arch}: {type(error).__name__}: "
                          f"{one_line(str(error))}") from error
    conform(proto, "jax")
    with atomic_path(path) as tmp:
        onnx.save_model(proto, str(tmp))
