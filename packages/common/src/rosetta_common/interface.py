"""The backend contract: what every framework package provides, in which module, under which name.

As Keras 3 keeps one interface above `backend/{jax,tensorflow,torch}/`, `rosetta_torch`, `rosetta_tf` and
`rosetta_jax` each have the same six modules with the same functions and signatures:

- `models.build(config, weights) -> model`: the native model of `config` holding copies of these canonical
  weights, in inference mode;
- `models.predict(model, images) -> logits`: float32 (batch, classes) for float32 images (batch, height,
  width) in [0, 1];
- `models.model_config(model) -> ModelConfig`: the validated config the model was built from;
- `models.forward_train(model, images, dropout_mask) -> logits`: one forward in training mode, as a training
  step runs it (no gradient): BatchNorm normalizes with the batch's statistics and updates its running
  statistics in place (rosetta_common.spec.ResNetSpec's convention), dropout multiplies by `dropout_mask`
  (rosetta_common.training.dropout_masks; None: no dropout); the model is back in inference mode after;
- `weights.from_canonical(model, weights) -> None`: assign canonical weights (names and shapes checked:
  WeightsError);
- `weights.to_canonical(model) -> Weights`: the weights in canonical names, order and layout (exact inverse);
- `train.configure(seed) -> None`: seed the framework and switch on its deterministic mode (call first);
- `train.make_optimizer(model, optimizer, num_steps)`: the framework's optimizer, computing
  rosetta_common.optim's formula;
- `train.apply_optimizer(optimizer, params, grads) -> [Weights]`: that real optimizer run on given
  gradients; the parameters after each step (what the conformance suite checks against the formula);
- `train.train(model, plan, data, hook=None) -> TrainResult`: train in place on the plan's batches in the plan's
  order, showing progress; a rosetta_common.training.StepHook is called with the model after each of its steps;
  a model trained before, its weights put back by `from_canonical`, trains exactly as a fresh build would;
- `export.export_native(model, out_dir, example) -> [Path]`: the framework's native format(s), no pickle;
- `export.load_native(out_dir) -> {format: predict}`: reload each native format (ArtifactError if missing
  or unsafe);
- `export.export_onnx(model, path, example) -> None`: ONNX with the framework's own converter, meeting
  rosetta_common.onnx_conventions;
- `taps.forward_with_taps(model, images) -> {tap: array}`: every tap of rosetta_common.taps, in its names,
  order, shapes and layouts (NHWC, heads split, per-step recurrent states), float32, in inference mode, read
  from the model's own forward with the framework's own mechanism (torch's forward hooks, a Keras model over
  the layers' outputs, Flax NNX method interception); `logits` is what `predict` returns;
- `distributed.start_worker(cluster) -> None`: start the framework's own distributed engine as this worker of
  a rosetta_common.distributed.Cluster (one-line DistributedError for an unreachable coordinator or a port in
  use, within the cluster's timeout);
- `distributed.train_data_parallel(config, weights, plan, data, cluster) -> (model, TrainResult)`: the plan's
  training, each worker on its rows of every batch (Cluster.rows), gradients averaged by the engine; the
  global batch's loss at every step, the same on every rank; a model `predict` and `to_canonical` take;
- `distributed.stop_worker() -> None`: leave the engine.

Plus `FRAMEWORK` (the name in params.yaml) at package level. Failures raise the types of
`rosetta_common.errors`. The package's `__init__` re-exports every name and calls `check_backend`, so a
package missing a function fails at import, naming it. The conformance suite (`rosetta_common.conformance`)
runs the same tests against each package.
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


def architectures(package: ModuleType) -> tuple[str, ...]:
    """The architectures `package` implements: every image model, and the token models it lists in its
    `TOKEN_MODELS` (the text model is being added package by package; the conformance suite tests what a package
    says it implements, and a stage refuses a token model its framework lacks)."""
    from rosetta_common.spec import ARCHITECTURES, TOKEN_ARCHITECTURES

    token = set(getattr(package, "TOKEN_MODELS", ()))
    return tuple(a for a in ARCHITECTURES if a not in TOKEN_ARCHITECTURES or a in token)


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
