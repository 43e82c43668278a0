"""The backend contract: what every framework package provides, in which module, under which name.

The pipeline's stages and the conformance suite drive the three frameworks' packages alike, never asking which one
they hold. So, as Keras 3 keeps one interface above `backend/{jax,tensorflow,torch}/`, `rosetta_torch`, `rosetta_tf`
and `rosetta_jax` have the same six modules with the same functions (`CONTRACT`), plus `FRAMEWORK`, the framework's
name in params.yaml; `load_backend` picks a package by that name. Each package's `__init__` re-exports every name
and calls `check_backend`, so a package missing a function fails at import, naming it, rather than halfway through a
stage. Failures raise the types of `rosetta_common.errors`, and the conformance suite (`rosetta_common.conformance`)
runs the same tests against each package.

What each function takes, returns and promises: docs/contract.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

Predict = Callable[[np.ndarray], np.ndarray]

# Framework (as params.yaml names it) -> the Python package implementing the contract for it.
BACKEND_MODULES = {"torch": "rosetta_torch", "tf": "rosetta_tf", "jax": "rosetta_jax"}

# Module -> the functions it must define (not merely import), in the contract's order.
CONTRACT: dict[str, tuple[str, ...]] = {
    "models": ("build", "predict", "model_config", "forward_train"),
    "weights": ("from_canonical", "to_canonical"),
    "train": ("configure", "make_optimizer", "apply_optimizer", "train"),
    "export": ("export_native", "load_native", "export_onnx"),
    "distributed": ("start_worker", "train_data_parallel", "stop_worker"),
    "taps": ("forward_with_taps",),
}


@dataclass
class TrainResult:
    step_losses: list[float]  # training loss of every step, in order, as the framework computed it
    epoch_losses: list[float]  # mean of each epoch's step losses
    train_seconds: float
    epoch_seconds: list[float] = field(default_factory=list)  # wall time of each epoch
    workers: int = 1  # how many workers trained it (data-parallel: more than one)
    engine: str = ""  # the distributed engine that ran it, in words ("" for a single process)


def check_backend(package: ModuleType) -> None:
    """Raise ImportError naming every contract function `package` lacks, or defines in the wrong module."""
    problems = []
    if not isinstance(getattr(package, "FRAMEWORK", None), str):
        problems.append(f"{package.__name__}.FRAMEWORK")
    for module, names in CONTRACT.items():
        where = f"{package.__name__}.{module}"
        for name in names:
            function = getattr(package, name, None)
            if not callable(function):
                problems.append(f"{where}.{name} (missing)")
            elif getattr(function, "__module__", None) != where:
                problems.append(f"{where}.{name} (defined in {function.__module__})")
    if problems:
        raise ImportError(f"{package.__name__} does not implement the backend contract: {', '.join(problems)}")


def load_backend(framework: str) -> ModuleType:
    """Import the package for `framework` (its __init__ checks the contract)."""
    if framework not in BACKEND_MODULES:
        raise ValueError(f"framework = {framework!r}: unknown; allowed: {', '.join(BACKEND_MODULES)}")
    return importlib.import_module(BACKEND_MODULES[framework])
