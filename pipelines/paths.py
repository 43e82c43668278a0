"""Where every stage reads and writes: the artifact layout in one place.

Lineage (DVC outputs, each stage's published as one folder or file): data/prepared/, artifacts/<model>/init.safetensors,
artifacts/<model>/<framework>/ (train_export), reports/validation.json (validate), reports/comparison/ (report).
Not lineage: measurements/ (timings; pipelines/measurements.py) and .rosetta/ (scratch; rosetta_common.io).
"""

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
    """Test accuracy and loss as the train_export stage measured them (the validate stage recomputes its own)."""
    return run_dir(model, framework) / "metrics.json"


# Files that cannot be made to repeat byte for byte: kept out of the hashed lineage (.dvcignore lists the same
# pattern, export.json does not hash them, and the README says why).
UNHASHED: tuple[str, ...] = ()


def unhashed(relative: Path) -> bool:
    """Whether a file of a run folder (path relative to it) is outside the hashed lineage."""
    return any(str(relative).startswith(prefix) for prefix in UNHASHED)


VALIDATION = REPORTS / "validation.json"
REPORT = REPORTS / "comparison"  # the report stage's one output folder
SUMMARY = REPORT / "summary"  # one headline-metrics file per model, for `dvc metrics show`
PLOTS = REPORT / "plots"


def summary(model: str) -> Path:
    return SUMMARY / f"{model}.json"
