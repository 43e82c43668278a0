"""Where every stage reads and writes: the artifact layout in one place."""

from __future__ import annotations

from pathlib import Path

PARAMS = Path("params.yaml")
PREPARED = Path("data/prepared")
REPORTS = Path("reports")


def model_dir(model: str) -> Path:
    return Path("artifacts") / model


def init_weights(model: str) -> Path:
    return model_dir(model) / "init.safetensors"


def run_dir(model: str, framework: str) -> Path:
    return model_dir(model) / framework


def trained_weights(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "trained.safetensors"


def train_log(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "train_log.json"


def native_dir(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "native"


def onnx_model(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "model.onnx"


def init_onnx(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "init.onnx"


def native_outputs(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "native_outputs.npz"


def export_record(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "export.json"


def metrics(model: str, framework: str) -> Path:
    return Path("metrics") / model / f"{framework}.json"


LATENCY = REPORTS / "latency"
VALIDATION = REPORTS / "validation.json"
SUMMARY = REPORTS / "summary"  # one headline-metrics file per model, for `dvc metrics show`
PLOTS = REPORTS / "plots"


def latency_record(model: str, framework: str) -> Path:
    """What the bench stage measured (latencies, settings, threads, package versions); the report reads it."""
    return LATENCY / model / f"{framework}.json"


def summary(model: str) -> Path:
    return SUMMARY / f"{model}.json"
