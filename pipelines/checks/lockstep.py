"""The lockstep checkpoints: two frameworks' whole training state while their runs still agree, held to float32.

Each train_export run records its state after every step of tolerances.lockstep_checkpoints (all inside the
lockstep window that every model's runs must keep, tolerances.lockstep_steps): every canonical weight, BatchNorm's
running mean and variance, and the eval-mode logits of the validation batch (checkpoints.npz, tied to the run by
export.json's hashes). Every pair of frameworks is compared there at tolerances.lockstep_state_rel, for every
model, with no exception: what the frameworks compute alike agrees to float32 while the losses do. A porting
mistake that never touches a training loss (BatchNorm's momentum convention, its unbiased running variance, a
weight decay on a weight whose gradient is zero) shows here, before the runs part and chaos hides it.

Three checks per pair: the weights (as one vector, by norm: weights_diff says why), the logits of the validation
batch (by norm, likewise) and the running statistics (worst layer, max |a - b| over its largest magnitude; models
with BatchNorm); each the worst over the checkpoints, each checkpoint's figures in validation.json's "lockstep"."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Ledger
from rosetta_common.metrics import max_abs_diff
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.weights import canonical_shapes, is_statistic

LOGITS = "validation_logits"
# Each figure of a checkpoint: the check that judges its worst, and what it covers.
KINDS = {"weights": names.LOCKSTEP_WEIGHTS_REL, "running_statistics": names.LOCKSTEP_RUNNING_STATS_REL,
         "logits": names.LOCKSTEP_LOGITS_REL}

State = dict[str, np.ndarray]


def scaled_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the larger of the two tensors' largest magnitudes (0 where both are all zero)."""
    scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)))
    return max_abs_diff(a, b) / scale if scale > 0 else 0.0


def read_checkpoints(ledger: Ledger, arch: str, fw: str, steps: list[int], config: ModelConfig,
                     classes: tuple[int, int]) -> dict[int, State] | None:
    """The run's state at each checkpoint step: {step: {canonical name or LOGITS: array}}, every name and shape
    checked; a missing or malformed file fails CHECKPOINTS_READABLE and gives None."""
    path = paths.run_dir(arch, fw) / paths.CHECKPOINTS_FILE
    shapes = {**canonical_shapes(config), LOGITS: classes}
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {key: f[key] for key in f.files}
        states: dict[int, State] = {}
        for step in steps:
            state = {name: arrays[f"step{step}/{name}"] for name in shapes}
            for name, shape in shapes.items():
                if tuple(state[name].shape) != tuple(shape):
                    raise ValueError(f"step{step}/{name} has shape {state[name].shape}, expected {tuple(shape)}")
            states[step] = state
    except (OSError, KeyError, ValueError) as error:
        ledger.add(arch, fw, names.CHECKPOINTS_READABLE, None, None, False, f"{path}: {type(error).__name__}: {error}")
        return None
    return states


def weights_diff(a: State, b: State, names: list[str]) -> tuple[float, str]:
    """The weights as one vector: ||a - b|| over the larger of ||a||, ||b|| (float64), and the tensor holding the
    largest share of ||a - b||.

    Why the whole vector and not each tensor's largest element: Adam divides a step by sqrt(v) + epsilon, so a
    weight whose gradient nearly cancels to the size of epsilon (1e-8) in one batch moves by a share of the
    learning rate that its gradient's last bits decide. A few such weights put 1.0e-5 to 1.5e-5 of a tensor's
    largest value between frameworks after step 1 (mlp's hidden kernel, cnn's conv2 kernel: the tiny run, the
    per-element figure first chosen here), and 4e-6 to 9e-6 of the norm of a small tensor that starts at zero
    (the text model's final LayerNorm bias, 16 values; the per-tensor norm tried next). Both are the method's
    (Adam's epsilon), not a port's. Over the whole vector they weigh by their number, and a mistake that moves a
    share of the weights (a weight decay moving every weight with no gradient, an always-blank pixel's, by the
    learning rate a step) still moves it by 1e-3 or more."""
    squares = {n: float(np.sum((a[n].astype(np.float64) - b[n].astype(np.float64)) ** 2)) for n in names}
    norm_a = float(np.sqrt(sum(float(np.sum(a[n].astype(np.float64) ** 2)) for n in names)))
    norm_b = float(np.sqrt(sum(float(np.sum(b[n].astype(np.float64) ** 2)) for n in names)))
    scale = max(norm_a, norm_b)
    worst = max(squares, key=lambda n: squares[n])
    return (float(np.sqrt(sum(squares.values()))) / scale if scale > 0 else 0.0), worst


def checkpoint_figures(a: State, b: State) -> dict[str, Any]:
    """One checkpoint of a pair: each kind's figure and where it is worst (tensor or layer statistic)."""
    weights = [n for n in a if n != LOGITS and not is_statistic(n)]
    value, worst = weights_diff(a, b, weights)
    figures: dict[str, Any] = {"weights": {"max_rel": value, "where": worst}}
    # The logits by norm over the batch too, for the same reason: a rarely seen token's embedding row is such a
    # weight, and the snippets holding it carry its free last bits into their logits (text model, params.yaml's
    # size: 1.9e-5 of the largest |logit| at step 20, torch|tf and tf|jax, with the weights' norm at 1e-7; the
    # per-element figure first chosen here).
    value, _ = weights_diff(a, b, [LOGITS])
    figures["logits"] = {"max_rel": value, "where": LOGITS}
    groups = {"running_statistics": [n for n in a if is_statistic(n)]}
    for kind, members in groups.items():
        if not members:
            continue
        diffs = {name: scaled_diff(a[name], b[name]) for name in members}
        worst = max(diffs, key=lambda name: diffs[name])
        figures[kind] = {"max_rel": diffs[worst], "where": worst}
    return figures


def lockstep_checkpoints(spec: Spec, ledger: Ledger, arch: str, frameworks: list[str], config: ModelConfig,
                         batch_size: int) -> list[dict[str, Any]]:
    """Every pair's checkpoint figures into validation.json's records, and their checks into `ledger`."""
    tol = spec.tolerances
    steps = list(tol.lockstep_checkpoints)
    if not steps:
        return []
    classes = (batch_size, config.num_classes)
    states = {fw: s for fw in frameworks
              if (s := read_checkpoints(ledger, arch, fw, steps, config, classes)) is not None}
    records = []
    for a, b in itertools.combinations(states, 2):
        pair = f"{a}|{b}"
        at = {step: checkpoint_figures(states[a][step], states[b][step]) for step in steps}
        records.append({"model": arch, "frameworks": pair, "tolerance": tol.lockstep_state_rel,
                        "checkpoints": [{"step": step, **at[step]} for step in steps]})
        for kind, check in KINDS.items():
            if kind not in at[steps[0]]:
                continue  # a model without BatchNorm has no running statistics
            worst = max(steps, key=lambda step: at[step][kind]["max_rel"])
            per_step = ", ".join(f"step {step}: {at[step][kind]['max_rel']:.2g}" for step in steps)
            ledger.add(arch, pair, check, at[worst][kind]["max_rel"], tol.lockstep_state_rel,
                       detail=f"worst at step {worst}, {at[worst][kind]['where']} ({per_step})")
    return records
