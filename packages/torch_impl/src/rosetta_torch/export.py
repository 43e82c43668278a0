"""Export: the state dict as safetensors, the program as torch.export's .pt2, and ONNX through the
dynamo-based torch.onnx exporter; every format keeps a dynamic batch dimension (and for the token model a dynamic
length, 1 to max_length, on an int64 input "tokens") and none holds a pickle.

Every export is made from an eval() twin of the model (_cpu_copy), so it runs in inference mode: BatchNorm on
its running statistics (folded into the convolutions in ONNX), dropout the identity (absent from ONNX).
nn.LSTM and nn.GRU come out as one ONNX LSTM / GRU op each (GRU with linear_before_reset=1, torch's formula),
with no Loop, Scan or unrolled steps."""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from rosetta_common.errors import ArtifactError, ExportError, one_line
from rosetta_common.inputs import PAD_ID
from rosetta_common.interface import Predict
from rosetta_common.io import atomic_path
from rosetta_common.onnx_conventions import BATCH_DIM, LENGTH_DIM, OPSETS, OUTPUT_NAME, conform
from rosetta_common.spec import ModelConfig
from rosetta_torch.models import create, predict

STATE_FILE = "model.safetensors"
PROGRAM_FILE = "model.pt2"
FORMAT = "rosetta-torch-state-dict"
METADATA_KEY = "rosetta"


def _cpu_copy(model: nn.Module) -> nn.Module:
    """A CPU twin of the model in eval mode: exports must not move or mutate the caller's model, and a
    program traced on a GPU would only run there."""
    twin = create(model.config)
    twin.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()}, strict=True)
    return twin.eval()


def _example(config: ModelConfig, example: np.ndarray) -> tuple[torch.Tensor]:
    """The traced example: torch.export specialises a size-1 dimension, and the batch (and a token model's length)
    must stay symbolic, so a single example is repeated to two rows and a one-token sequence padded to two."""
    if config.input.kind == "tokens":
        x = torch.as_tensor(config.input.check(np.asarray(example), "example"))
        if x.shape[1] < 2 <= config.input.max_length:  # one more position of padding: the same sequences
            x = torch.cat([x, torch.full((x.shape[0], 1), PAD_ID, dtype=x.dtype)], dim=1)
    else:
        x = torch.as_tensor(np.asarray(example, np.float32))
    if x.shape[0] < 2:
        x = x.expand(2, *x.shape[1:]).contiguous()
    return (x,)


def _dynamic_shapes(config: ModelConfig) -> dict[str, dict[int, torch.export.Dim]]:
    """The batch dynamic, and a token model's length too, from 1 to max_length (the positions it has); keyed by
    forward()'s argument, named as the ONNX input (`images` / `tokens`)."""
    dims = {0: torch.export.Dim(BATCH_DIM)}
    if config.input.kind == "tokens":
        dims[1] = torch.export.Dim(LENGTH_DIM, max=config.input.max_length)
    return {config.input.name: dims}


def export_native(model: nn.Module, out_dir: Path, example: np.ndarray) -> list[Path]:
    """model.safetensors (state dict + the ModelConfig as JSON, which rebuilds the module) and model.pt2
    (torch.export); each written atomically."""
    out_dir = Path(out_dir)
    twin = _cpu_copy(model)
    # One metadata key holding sorted JSON: safetensors keeps metadata in a hash map, so several keys come out in a
    # different order from one process to the next and the file's bytes would not repeat.
    metadata = {METADATA_KEY: json.dumps({"format": FORMAT, "config": twin.config.model_dump(mode="json"),
                                          "torch_version": torch.__version__}, sort_keys=True)}
    try:
        with _quiet_tracing():
            program = torch.export.export(twin, _example(twin.config, example),
                                             dynamic_shapes=_dynamic_shapes(twin.config))
    except Exception as error:  # torch.export raises many types; the user needs the first line of one
        raise ExportError(f"torch.export of {twin.config.arch}: {one_line(str(error))}") from error
    program.example_inputs = None  # else they are saved with torch.save, a pickle
    for node in program.graph_module.graph.nodes:
        # Python stack traces name our source files by absolute path: no path of this machine in an artifact, and
        # the same bytes wherever the checkout lives.
        node.meta.pop("stack_trace", None)
    with atomic_path(out_dir / STATE_FILE) as tmp:
        save_file({k: v.contiguous() for k, v in twin.state_dict().items()}, str(tmp), metadata)
    with atomic_path(out_dir / PROGRAM_FILE) as tmp:
        torch.export.save(program, str(tmp))
    return [out_dir / STATE_FILE, out_dir / PROGRAM_FILE]


def _require(path: Path) -> None:
    if not path.is_file():
        raise ArtifactError(f"{path}: native export file is missing")


def load_state_file(path: Path) -> nn.Module:
    """The module rebuilt from model.safetensors alone (safetensors never unpickles)."""
    _require(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = json.loads((f.metadata() or {}).get(METADATA_KEY, "{}"))
        tensors = load_file(str(path))
    except Exception as error:  # safetensors raises its own SafetensorError for a damaged header
        raise ArtifactError(f"{path}: not a readable safetensors file ({one_line(str(error))})") from None
    if metadata.get("format") != FORMAT:
        raise ArtifactError(f"{path}: format {metadata.get('format')!r} is not {FORMAT!r}")
    try:
        config = ModelConfig.model_validate(metadata.get("config"))
    except ValueError as error:  # pydantic's ValidationError
        raise ArtifactError(f"{path}: metadata 'config' is not a valid ModelConfig ({one_line(str(error))})") from None
    model = create(config)
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as error:  # names or shapes that do not fit the config
        raise ArtifactError(f"{path}: state dict does not fit its config ({one_line(str(error))})") from None
    return model.eval()


def check_program_has_no_pickle(path: Path) -> None:
    """Raise ArtifactError for a .pt2 that would make torch.export.load unpickle anything.

    torch.export.save writes the graph as JSON and plain tensors as raw bytes; pickles appear only for
    tensor subclasses, script objects and opaque constants, and for the example inputs (which
    torch.export.load reads with torch.load, falling back to weights_only=False). export_native drops the
    example inputs, and our models hold none of the others, so a file of ours passes.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name, leaf = info.filename, info.filename.rsplit("/", 1)[-1]
                if "/data/sample_inputs/" in name and info.file_size == 0:
                    continue  # example inputs dropped: an empty payload
                if ("/data/sample_inputs/" in name or leaf.startswith(("custom_obj", "opaque_obj"))
                        or leaf.endswith(".pt")):
                    raise ArtifactError(f"{path}: {name} would be unpickled on load; refusing to load it")
                if leaf.endswith("_config.json") and "/data/" in name:
                    config = json.loads(archive.read(info))
                    if any(entry.get("use_pickle") for entry in config.get("config", {}).values()):
                        raise ArtifactError(f"{path}: {name} lists pickled payloads; refusing to load it")
    except (zipfile.BadZipFile, ValueError) as error:  # not a zip archive, or a config that is not JSON
        raise ArtifactError(f"{path}: not a readable torch.export archive ({one_line(str(error))})") from None


def load_program(path: Path) -> nn.Module:
    _require(path)
    check_program_has_no_pickle(path)
    try:
        return torch.export.load(str(path)).module()
    except Exception as error:  # a damaged archive fails anywhere in torch's deserializer
        raise ArtifactError(f"{path}: torch.export.load failed ({one_line(str(error))})") from None


def load_native(out_dir: Path) -> dict[str, Predict]:
    """{"safetensors": ..., "torch_export": ...}: each native file reloaded on the CPU, without unpickling."""
    out_dir = Path(out_dir)
    state_model = load_state_file(out_dir / STATE_FILE)
    program = load_program(out_dir / PROGRAM_FILE)

    spec = state_model.config.input  # the program's config: the state file beside it is the same model's

    @torch.inference_mode()
    def run_program(x: np.ndarray) -> np.ndarray:
        if spec.kind == "tokens":  # an id outside the vocabulary would fail deep inside the program's gather
            return program(torch.as_tensor(spec.check(x, spec.name))).numpy()
        return program(torch.as_tensor(np.asarray(x, np.float32))).numpy()

    return {"safetensors": lambda images: predict(state_model, images), "torch_export": run_program}


@contextlib.contextmanager
def _quiet_tracing() -> Iterator[None]:
    """Hide torch 2.13's harmless notices while it traces our models: nn.LSTM / nn.GRU refresh their
    `_flat_weights` list (plain attributes) on every call, which torch.export reports as "tensor attributes
    ... assigned during export" though they only alias the registered parameters; and torch's own dynamic-shape
    RNN decomposition (torch.export._patches, tried by torch.onnx) calls the deprecated `_check_is_size`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*_flat_weights.*assigned during export.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=r".*_check_is_size will be removed.*", category=FutureWarning)
        yield


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """_quiet_tracing, and a harmless FutureWarning of torch 2.13's ONNX exporter about LeafSpec, raised inside
    torch.export's own decompositions."""
    with _quiet_tracing(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        yield


# torch.onnx's registries of aten -> ONNX decompositions, by the arguments they were built with, one per process.
_REGISTRIES: dict[tuple[Any, ...], Any] = {}


@contextlib.contextmanager
def _registry_built_once() -> Iterator[None]:
    """While exporting, torch.onnx builds its registry of aten -> ONNX decompositions once per process, quietly.

    torch.onnx.export(dynamo=True) builds the registry from torchlib on every call, and a train_export stage
    exports 14 ONNX files (two per model): with one registry the stage's exports took 13.9 s instead of 19.1 s
    (medians of 5 alternated processes on 2 threads), every file byte for byte the same (all seven models). The
    exporter adds to a registry only for a custom_translation_table, which we never pass. Building it logs
    "torchvision is not installed" once per torchvision op: its module's logger is quieted while it builds.

    No public route: the registry comes from torch.onnx's private ONNXRegistry.from_torchlib, and
    torch.onnx.export takes none since the public OnnxRegistry and ExportOptions were removed with the legacy
    dynamo_export (upstream pytorch/pytorch#149745); no public API reuses one. Guarded:
    should a torch release move from_torchlib or its module's logger, exports build their own registry again
    (slower, the same bytes, the torchvision notices back) and test_export's test of this internal fails."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        yield
        return
    original = _registration.ONNXRegistry.__dict__.get("from_torchlib")
    logger = getattr(_registration, "logger", None)
    if not isinstance(original, classmethod) or not isinstance(logger, logging.Logger):
        yield
        return
    build = original.__func__

    def built_once(cls: type, *args: Any, **kwargs: Any) -> Any:
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _REGISTRIES:
            level = logger.level
            logger.setLevel(logging.ERROR)
            try:
                _REGISTRIES[key] = build(cls, *args, **kwargs)
            finally:
                logger.setLevel(level)
        return _REGISTRIES[key]

    _registration.ONNXRegistry.from_torchlib = classmethod(built_once)
    try:
        yield
    finally:
        _registration.ONNXRegistry.from_torchlib = original


def export_onnx(model: nn.Module, path: Path, example: np.ndarray) -> None:
    """ONNX with the dynamo-based exporter (torch.export underneath), meeting rosetta_common.onnx_conventions:
    one file (weights inside, no external .data file to lose), written atomically."""
    import onnx  # only exports need it

    twin = _cpu_copy(model)
    try:
        with _quiet_exporter(), _registry_built_once():
            program = torch.onnx.export(
                twin, _example(twin.config, example), dynamo=True, dynamic_shapes=_dynamic_shapes(twin.config),
                input_names=[twin.config.input.name], output_names=[OUTPUT_NAME], opset_version=OPSETS["torch"],
                external_data=False, verbose=False,
            )
    except Exception as error:  # the exporter wraps its failures in several types
        raise ExportError(f"torch.onnx.export of {twin.config.arch}: {one_line(str(error))}") from error
    proto = conform(program.model_proto, "torch")
    with atomic_path(path) as tmp:
        onnx.save(proto, str(tmp))
