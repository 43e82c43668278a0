"""Export: the state dict as safetensors, the program as torch.export's .pt2, and ONNX through the
dynamo-based torch.onnx exporter; every format keeps a dynamic batch dimension and none holds a pickle."""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from rosetta_common.interface import Predict
from rosetta_torch.models import make_module, predict

STATE_FILE = "model.safetensors"
PROGRAM_FILE = "model.pt2"
FORMAT = "rosetta-torch-state-dict"
ONNX_OPSET = 20  # the exporter's default in torch 2.13, named so that an upgrade cannot change it silently


def _cpu_copy(model: nn.Module) -> nn.Module:
    """A CPU twin of the model in eval mode: exports must not move or mutate the caller's model, and a
    program traced on a GPU would only run there."""
    twin = make_module(model.arch, model.config)
    twin.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()}, strict=True)
    return twin.eval()


def _example(example: np.ndarray) -> tuple[torch.Tensor]:
    x = torch.as_tensor(np.asarray(example, np.float32))
    if x.shape[0] < 2:  # torch.export specialises a size-1 dimension; the batch must stay symbolic
        x = x.expand(2, *x.shape[1:]).contiguous()
    return (x,)


def _dynamic_batch() -> dict[str, dict[int, torch.export.Dim]]:
    return {"images": {0: torch.export.Dim("batch")}}


def export_native(model: nn.Module, out_dir: Path, example: np.ndarray) -> list[Path]:
    """model.safetensors (state dict + the config that rebuilds the module) and model.pt2 (torch.export)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    twin = _cpu_copy(model)
    metadata = {"format": FORMAT, "architecture": twin.arch, "config": json.dumps(twin.config),
                "torch_version": torch.__version__}
    save_file({k: v.contiguous() for k, v in twin.state_dict().items()}, str(out_dir / STATE_FILE), metadata)
    program = torch.export.export(twin, _example(example), dynamic_shapes=_dynamic_batch())
    program.example_inputs = None  # else they are saved with torch.save, a pickle
    torch.export.save(program, str(out_dir / PROGRAM_FILE))
    return [out_dir / STATE_FILE, out_dir / PROGRAM_FILE]


def load_state_file(path: Path) -> nn.Module:
    """The module rebuilt from model.safetensors alone (safetensors never unpickles)."""
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path}: format {metadata.get('format')!r} is not {FORMAT!r}")
    model = make_module(metadata["architecture"], json.loads(metadata["config"]))
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.eval()


def check_program_has_no_pickle(path: Path) -> None:
    """Refuse a .pt2 that would make torch.export.load unpickle anything.

    torch.export.save writes the graph as JSON and plain tensors as raw bytes; pickles appear only for
    tensor subclasses, script objects and opaque constants, and for the example inputs (which
    torch.export.load reads with torch.load, falling back to weights_only=False). export_native drops the
    example inputs, and our models hold none of the others, so a file of ours passes.
    """
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name, leaf = info.filename, info.filename.rsplit("/", 1)[-1]
            if "/data/sample_inputs/" in name and info.file_size == 0:
                continue  # example inputs dropped: an empty payload
            if "/data/sample_inputs/" in name or leaf.startswith(("custom_obj", "opaque_obj")) or leaf.endswith(".pt"):
                raise ValueError(f"{path}: {name} would be unpickled on load; refusing to load it")
            if leaf.endswith("_config.json") and "/data/" in name:
                config = json.loads(archive.read(info))
                if any(entry.get("use_pickle") for entry in config.get("config", {}).values()):
                    raise ValueError(f"{path}: {name} lists pickled payloads; refusing to load it")


def load_program(path: Path) -> nn.Module:
    check_program_has_no_pickle(path)
    return torch.export.load(str(path)).module()


def load_native(out_dir: Path) -> dict[str, Predict]:
    out_dir = Path(out_dir)
    state_model = load_state_file(out_dir / STATE_FILE)
    program = load_program(out_dir / PROGRAM_FILE)

    @torch.inference_mode()
    def run_program(images: np.ndarray) -> np.ndarray:
        return program(torch.as_tensor(np.asarray(images, np.float32))).numpy()

    return {"safetensors": lambda images: predict(state_model, images), "torch_export": run_program}


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Hide two harmless notices of torch 2.13's exporter: "torchvision is not installed" (logged once per
    process) and a FutureWarning about LeafSpec raised inside torch.export's own decompositions."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            yield
    finally:
        registration.setLevel(level)


def export_onnx(model: nn.Module, path: Path, example: np.ndarray) -> None:
    """ONNX with the dynamo-based exporter (torch.export underneath): one file (weights inside, no external
    .data file to lose), input "images", output "logits", batch dimension "batch"."""
    with _quiet_exporter():
        program = torch.onnx.export(
            _cpu_copy(model), _example(example), dynamo=True, dynamic_shapes=_dynamic_batch(),
            input_names=["images"], output_names=["logits"], opset_version=ONNX_OPSET,
            external_data=False, verbose=False,
        )
    program.save(str(path), external_data=False)
