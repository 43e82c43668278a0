"""The one interface every framework package implements (as Keras 3 has one above its backends).

`rosetta_torch`, `rosetta_tf` and `rosetta_jax` each expose these names at package level, built from the
same modules (models.py, weights.py, train.py, export.py). Stage entry points in `pipelines/stages`
import the package by name and call only these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rosetta_common.data import Dataset
from rosetta_common.spec import Spec

Predict = Callable[[np.ndarray], np.ndarray]


@dataclass
class TrainResult:
    step_losses: list[float]  # training loss of every step, in order, as the framework computed it
    epoch_losses: list[float]  # mean of each epoch's step losses
    train_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    FRAMEWORK: str

    def configure(self, seed: int) -> None:
        """Seed the framework and switch on its deterministic mode; call once before anything else."""

    def build(self, arch: str, spec: Spec, weights: Mapping[str, np.ndarray]) -> Any:
        """The native model of `arch`, holding these canonical weights."""

    def canonical_weights(self, model: Any) -> dict[str, np.ndarray]:
        """The model's weights in canonical names and layout (exact inverse of build's mapping)."""

    def predict(self, model: Any, images: np.ndarray) -> np.ndarray:
        """Logits (batch, classes) float32 for images (batch, height, width) float32 in [0, 1]."""

    def train(self, model: Any, arch: str, spec: Spec, data: Dataset) -> tuple[Any, TrainResult]:
        """Train with the spec's optimizer on common's batches (epoch_batches), showing progress."""

    def export_native(self, model: Any, out_dir: Path, example: np.ndarray) -> list[Path]:
        """Write the framework's native format(s) into out_dir (no pickle); returns the files written."""

    def load_native(self, out_dir: Path) -> dict[str, Predict]:
        """Reload each native format written by export_native; format name -> predict function."""

    def export_onnx(self, model: Any, path: Path, example: np.ndarray) -> None:
        """Write an ONNX model with a dynamic batch dimension, with the framework's own converter."""


REQUIRED = (
    "FRAMEWORK",
    "configure",
    "build",
    "canonical_weights",
    "predict",
    "train",
    "export_native",
    "load_native",
    "export_onnx",
)


def check_backend(module: Any) -> None:
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise TypeError(f"{module.__name__} does not implement {', '.join(missing)}")
