"""The lockstep checkpoints: two frameworks' whole training state while their runs still agree, held to float32.

A porting mistake that never touches a training loss (BatchNorm's momentum convention, its unbiased running
variance, a weight decay on a weight with no gradient) shows only in the state. So at each step of
tolerances.lockstep_checkpoints, inside the lockstep window and before the runs part and chaos hides it, every pair
of frameworks is compared, for every model, on the weights, BatchNorm's running statistics and the eval-mode logits
of the validation batch (checkpoints.npz). Within tolerances.lockstep_state_rel a figure passes; beyond it, it is
judged against the same checkpoints of each framework's replicates (replicate_null), and so are the window's step
losses when train_lockstep_loss_rel fails. The checks, their tolerances and why Adam makes the null needed even
here: docs/judge.md, 'Training parity, for each pair of frameworks' and 'The measured null'; why the weights and
the logits are compared by norm: weights_diff."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Ledger
from pipelines.checks.replicate_null import pooled_null
from rosetta_common.metrics import max_abs_diff, relative_diff
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.weights import canonical_shapes, is_statistic

LOGITS = "validation_logits"
# Each figure of a checkpoint: the check that judges its worst, and what it covers.
KINDS = {"weights": names.LOCKSTEP_WEIGHTS_REL, "running_statistics": names.LOCKSTEP_RUNNING_STATS_REL,
         "logits": names.LOCKSTEP_LOGITS_REL}

State = dict[str, np.ndarray]


@dataclass(frozen=True)
class Checkpoints:
    """One framework's lockstep checkpoints: the run's state at each step, its replicates', and the replicates'
    step losses through the lockstep window (the run's own are in its train log)."""

    run: dict[int, State]
    replicates: list[dict[int, State]]
    replicate_losses: list[np.ndarray]


def scaled_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the larger of the two tensors' largest magnitudes (0 where both are all zero)."""
    scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)))
    return max_abs_diff(a, b) / scale if scale > 0 else 0.0


def read_checkpoints(ledger: Ledger, arch: str, fw: str, steps: list[int], config: ModelConfig,
                     classes: tuple[int, int], count: int, window: int) -> Checkpoints | None:
    """The run's state at each checkpoint step and its `count` replicates' (each {step: {canonical name or
    LOGITS: array}}, every name and shape checked), and each replicate's step losses through the lockstep
    `window`; a missing or malformed file fails CHECKPOINTS_READABLE and gives None."""
    path = paths.run_dir(arch, fw) / paths.CHECKPOINTS_FILE
    shapes = {**canonical_shapes(config), LOGITS: classes}
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {key: f[key] for key in f.files}
        runs: list[dict[int, State]] = []
        for replicate in range(count + 1):
            prefix = "" if replicate == 0 else f"replicate{replicate}/"
            states: dict[int, State] = {}
            for step in steps:
                state = {name: arrays[f"{prefix}step{step}/{name}"] for name in shapes}
                for name, shape in shapes.items():
                    if tuple(state[name].shape) != tuple(shape):
                        raise ValueError(f"{prefix}step{step}/{name} has shape {state[name].shape}, "
                                         f"expected {tuple(shape)}")
                states[step] = state
            runs.append(states)
        losses = [arrays[f"replicate{r}/step_losses"] for r in range(1, count + 1)]
        for r, values in enumerate(losses, 1):
            if values.shape != (window,) or not np.isfinite(values).all():
                raise ValueError(f"replicate{r}/step_losses has shape {values.shape}, expected ({window},), finite")
    except (OSError, KeyError, ValueError) as error:
        ledger.add(arch, fw, names.CHECKPOINTS_READABLE, None, None, False, f"{path}: {type(error).__name__}: {error}")
        return None
    return Checkpoints(runs[0], runs[1:], losses)


def weights_diff(a: State, b: State, names: list[str]) -> tuple[float, str]:
    """The weights as one vector: ||a - b|| over the larger of ||a||, ||b|| (float64), and the tensor holding the
    largest share of ||a - b||.

    Why the whole vector and not each tensor's largest element: Adam divides a step by sqrt(v) + epsilon, so a
    weight whose gradient nearly cancels to the size of epsilon (1e-8) in one batch moves by a share of the
    learning rate that its gradient's last bits decide. A few such weights put 1.0e-5 to 1.5e-5 of a tensor's
    largest value between frameworks after step 1 (mlp's hidden kernel, cnn's conv2 kernel, the tiny run's sizes:
    a per-element figure), and 4e-6 to 9e-6 of the norm of a small tensor that starts at zero (the text model's
    final LayerNorm bias, 16 values: a per-tensor norm). Both are the method's
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
    # size: 1.9e-5 of the largest |logit| at step 20, torch|tf and tf|jax, with the weights' norm at 1e-7, by a
    # per-element figure).
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


def worst(a: dict[int, State], b: dict[int, State], kind: str) -> float:
    """A kind's figure between two runs' checkpoints, the worst over the steps: the distance the null compares."""
    return max(checkpoint_figures(a[step], b[step])[kind]["max_rel"] for step in a)


def lockstep_checkpoints(spec: Spec, ledger: Ledger, arch: str, runs: dict[str, dict[str, Any]],
                         config: ModelConfig, batch_size: int) -> list[dict[str, Any]]:
    """Every pair's checkpoint figures into validation.json's records, and their checks into `ledger`: within
    tolerances.lockstep_state_rel they pass, beyond it they are judged against the replicates' null (docs/judge.md,
    'The measured null'); so is a lockstep window whose step losses failed train_lockstep_loss_rel. `runs`: each
    framework's run as validate read it (its "step_losses" from the train log, where training_parity read it)."""
    tol = spec.tolerances
    steps = list(tol.lockstep_checkpoints)
    if not steps:
        return []
    classes = (batch_size, config.num_classes)
    window = min(tol.lockstep_steps, min((len(r["step_losses"]) for r in runs.values() if "step_losses" in r),
                                         default=tol.lockstep_steps))
    states = {fw: s for fw in runs
              if (s := read_checkpoints(ledger, arch, fw, steps, config, classes, spec.replicates.count, window))
              is not None}
    # One pooled test per kind over every framework's run and window replicates, shared by the pairs it judges.
    nulls: dict[str, dict[str, Any] | None] = {}

    def null_of(key: str, groups: dict[str, list[Any]], distance: Any) -> dict[str, Any] | None:
        if key not in nulls:
            nulls[key] = (pooled_null(groups, distance, f"{arch} {key} {'|'.join(groups)}")
                          if all(len(g) > 1 for g in groups.values()) else None)
        return nulls[key]

    records = []
    for a, b in itertools.combinations(states, 2):
        pair, sa, sb = f"{a}|{b}", states[a], states[b]
        at = {step: checkpoint_figures(sa.run[step], sb.run[step]) for step in steps}
        records.append({"model": arch, "frameworks": pair, "tolerance": tol.lockstep_state_rel,
                        "checkpoints": [{"step": step, **at[step]} for step in steps]})
        for kind, check in KINDS.items():
            if kind not in at[steps[0]]:
                continue  # a model without BatchNorm has no running statistics
            top = max(steps, key=lambda step: at[step][kind]["max_rel"])
            value = at[top][kind]["max_rel"]
            per_step = ", ".join(f"step {step}: {at[step][kind]['max_rel']:.2g}" for step in steps)
            detail = f"worst at step {top}, {at[top][kind]['where']} ({per_step})"
            null = None
            if value > tol.lockstep_state_rel:
                null = null_of(check, {fw: [st.run, *st.replicates] for fw, st in states.items()},
                               lambda x, y, k=kind: worst(x, y, k))
            if null is None:
                ledger.add(arch, pair, check, value, tol.lockstep_state_rel, detail=detail)
                continue
            judge_by_null(ledger, arch, pair, check, value, tol.lockstep_state_rel, null,
                          f"{detail}; beyond the float32 bound")
        failed = [c for c in ledger.checks
                  if (c.model, c.subject, c.name) == (arch, pair, names.TRAIN_LOCKSTEP_LOSS_REL) and not c.passed]
        losses = {fw: np.asarray(runs[fw]["step_losses"][:window], np.float64) for fw in states
                  if runs[fw].get("step_losses") is not None}
        if failed and set(losses) == set(states):
            null = null_of(names.TRAIN_LOCKSTEP_LOSS_REL,
                           {fw: [losses[fw], *states[fw].replicate_losses] for fw in states},
                           lambda x, y: float(relative_diff(x, y).max()))
            if null is not None:
                ledger.checks.remove(failed[0])
                judge_by_null(ledger, arch, pair, names.TRAIN_LOCKSTEP_LOSS_REL, failed[0].value,
                              failed[0].tolerance, null, f"{failed[0].detail}; beyond the float32 bound")
    return records


def judge_by_null(ledger: Ledger, arch: str, pair: str, check: str, value: float, tolerance: float,
                  null: dict[str, Any], detail: str) -> None:
    sizes = ", ".join(f"{name} {n}" for name, n in null["groups"].items())
    ledger.add_null(arch, pair, check, value, tolerance, null,
                    f"{detail}: pooled permutation test over each run and its window replicates ({sizes}), "
                    f"pseudo-F {null['statistic'] or 0:.3g}, p = {null['p_value']:.3g}")
