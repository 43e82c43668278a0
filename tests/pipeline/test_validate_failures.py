"""The failure path of the validate stage, for real: a copy of the session's finished TINY run gets one figure
pushed past its tolerance (or to just inside it), then the real stage runs under ONNX Runtime through the runner.

Each case perturbs the artifacts so that exactly one kind of check moves. The shift is computed from the
tolerance and the baseline figure that the unperturbed copy's own reports/validation.json gives:
- "beyond": the figure lands at 2x the bound (or further): validate must exit non-zero, print
  `FAILED <model>/<framework> <check>` and mark exactly the expected rows failed in reports/validation.json;
- "inside": the figure lands at most half-way from the baseline to the bound (test accuracy, which moves in
  whole test images, as near to that as a whole number of images lands, and within the bound): validate must
  pass, and the row must have moved (else the perturbation was not read and the case proves nothing).
validate first checks every file of a run against the sha256 export.json records (`artifacts_intact`), and
judges nothing else of a run that fails it. So a figure case re-records the hashes of the files it perturbed
(`rehash`), as an export that had produced those bytes would have: the check that fails is then the figure's
own. The integrity check itself has its own cases (`test_validate_refuses_altered_artifacts`), as does the
ONNX checker on a corrupt model.onnx whose hash was re-recorded.
Nothing is mocked; every case's files are restored after its run, so cases do not depend on their order. Cases
that edit different models' files share one run of the stage (validate judges model by model; see `ROUNDS`),
each still judged on exactly its own model's rows.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import pytest
import yaml
from onnx import helper, numpy_helper
from safetensors import safe_open
from safetensors.numpy import load_file
from safetensors.numpy import save as save_safetensors

from pipelines import paths
from pipelines.checks.ledger import PREDICTION_DISAGREEMENT
from rosetta_common.data import Dataset, load_prepared
from rosetta_common.io import losses_sha256, sha256
from rosetta_common.metrics import softmax_cross_entropy
from support import VALIDATE, SavedEdits, TinyRun, replace_file, sh

Side = Literal["beyond", "inside"]
Key = tuple[str, str, str]  # (model, framework or "a|b" pair, check), as in reports/validation.json
REPORT = "reports/validation.json"


def key(row: dict[str, Any]) -> Key:
    return row["model"], row["framework"], row["check"]


@dataclass(frozen=True)
class FinishedRun:
    """This module's private copy of the session's finished run, with the figures it validates to."""

    root: Path
    env: dict[str, str]
    baseline: dict[Key, dict[str, Any]]


@dataclass
class Workspace(SavedEdits):
    """The cases' view of the copy: every write saves the original first, and `restore` puts it back."""

    run: FinishedRun
    saved: dict[Path, bytes | None] = field(default_factory=dict)  # None: the file did not exist
    touched: set[Path] = field(default_factory=set)  # every file written or removed since this was last cleared

    def keep(self, rel: str | Path) -> Path:
        path = super().keep(rel)
        self.touched.add(path)
        return path

    def restore_only(self, paths: Iterable[Path]) -> None:
        """Put back these files alone (a case whose edit failed half-way)."""
        for path in paths:
            data = self.saved.pop(path)
            if data is None:
                path.unlink(missing_ok=True)
            else:
                replace_file(path, data)

    def row(self, model: str, framework: str, check: str) -> dict[str, Any]:
        return self.run.baseline[(model, framework, check)]

    def rows(self, model: str, check: str, framework: str | None = None) -> list[dict[str, Any]]:
        """Baseline rows of `check` for `model`; with `framework`, only its own row or the pairs it is in."""
        return [
            r
            for (m, f, c), r in self.run.baseline.items()
            if m == model and c == check and (framework is None or framework in f.split("|"))
        ]

    def read_json(self, rel: str | Path) -> Any:
        return json.loads((self.run.root / rel).read_text())

    def write_json(self, rel: str | Path, value: Any) -> None:
        # json writes floats by repr, so every figure below reaches validate bit for bit
        self.write(rel, json.dumps(value, indent=2).encode())

    def params(self) -> dict[str, Any]:
        return yaml.safe_load((self.run.root / paths.PARAMS).read_text())

    def data(self) -> Dataset:
        return load_prepared(self.run.root / paths.PREPARED)

    def validation_batch_size(self) -> int:
        return int(self.params()["export"]["validation_batch_size"])

    def validation_batch(self) -> np.ndarray:
        return self.data().validation_batch(self.validation_batch_size())

    def read_npz(self, rel: str | Path) -> dict[str, np.ndarray]:
        with np.load(self.run.root / rel, allow_pickle=False) as npz:
            return dict(npz)

    def write_npz(self, rel: str | Path, arrays: dict[str, np.ndarray]) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        self.write(rel, buffer.getvalue())



def rehash(ws: Workspace, run_dir: Path) -> None:
    """Re-record in the run's export.json the sha256 of every file it lists, as an export that had written these
    bytes would have: after a figure case perturbs a run file, the check that fails is the figure's own, not
    artifacts_intact (which has cases of its own)."""
    rel = run_dir / "export.json"
    record = ws.read_json(rel)
    record["sha256"] = {name: sha256(ws.run.root / run_dir / name) for name in record["sha256"]}
    ws.write_json(rel, record)


def retie_replicates(ws: Workspace, model: str, framework: str, losses: list[float]) -> None:
    """Re-record in the model's end-of-training replicates (where the null plan gave it some: the replicates
    stage's, and the replicates_more stage's where the interim look sent it on) the digest of its run's step
    losses, as replicates trained from that run would: a case that moves a step loss fails its own check, not
    replicates_readable."""
    for folder in (paths.replicates_run(model, framework), paths.replicates_more_run(model, framework)):
        rel = folder / paths.REPLICATES_RECORD
        if (ws.run.root / rel).is_file():
            record = ws.read_json(rel)
            record["run_step_losses_sha256"] = losses_sha256(losses)
            ws.write_json(rel, record)


# A perturbation edits the workspace for one side and returns the rows it pushes: the rows that must fail
# ("beyond") or must pass having moved ("inside"). Every other row must pass either way.
Perturb = Callable[[Workspace, Side], list[Key]]


def shift(side: Side, baseline: float, bound: float) -> float:
    """An offset added to one operand of a max-abs figure. The test does not know the sign of the baseline
    error it lands on, so the figure ends within +-baseline of the offset: beyond, at least 2x the bound;
    inside, at most half-way from the baseline to the bound."""
    return 2 * bound + baseline if side == "beyond" else (bound - baseline) / 2


def aim(side: Side, baseline: float, bound: float) -> float:
    """The figure itself, where the test can set it exactly: 2x the bound, or half-way to it."""
    return 2 * bound if side == "beyond" else (baseline + bound) / 2


def worst(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """The largest baseline figure of some rows and their (shared) tolerance."""
    (bound,) = {r["tolerance"] for r in rows}
    return max(r["value"] for r in rows), bound


def native_logits(model: str, framework: str, check: str, array: str) -> Perturb:
    """The framework's own logits that the ONNX model must reproduce (validation or init) move by an offset."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        row = ws.row(model, framework, check)
        rel = paths.native_outputs(model, framework)
        arrays = ws.read_npz(rel)
        logits = arrays[array].copy()
        # the smallest logit: its float32 spacing is the finest, so the offset lands as computed, and the
        # largest |logit| (which sets the tolerance) stays where it is
        at = np.unravel_index(np.abs(logits).argmin(), logits.shape)
        logits[at] += shift(side, row["value"], row["tolerance"])
        arrays[array] = logits
        ws.write_npz(rel, arrays)
        rehash(ws, paths.run_dir(model, framework))
        return [(model, framework, check)]

    return perturb


def reference_weights(model: str) -> Perturb:
    """init.safetensors' head bias moves, so the float64 reference's logits all move by the offset; the
    exported init.onnx files and the recorded taps do not, so every framework's init_onnx_vs_reference and
    init_taps_vs_reference rows move."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, "init_onnx_vs_reference")
        rel = paths.init_weights(model)
        path = ws.run.root / rel
        # whatever metadata the current writer puts there goes back unchanged: the test stays format-agnostic
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata()
        tensors = load_file(str(path))
        tensors["head.bias"] = tensors["head.bias"] + np.float32(shift(side, *worst(rows)))
        ws.write(rel, save_safetensors(tensors, metadata=metadata))
        # the reference's logits tap moves with them: each framework's init taps against the reference move too
        return [key(r) for r in rows + ws.rows(model, "init_taps_vs_reference")]

    return perturb


def input_gated_offset(model: str, framework: str) -> Perturb:
    """One framework's init.onnx computes logits + delta * x[p], where pixel p is 0 on every image of the
    validation batch: the ONNX-vs-native and ONNX-vs-reference checks (validation batch only) see exactly the
    same logits, while forward parity (which also feeds uniform random inputs) sees the offset. The offset is a
    new initializer in the graph; perturbing an existing weight instead would move all three checks at once."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, "forward_parity_init_onnx", framework)
        baseline, bound = worst(rows)
        # random inputs are uniform in [0, 1): over >1000 of them, max x[p] is near 1; 2x covers down to 0.5
        delta = 2 * shift(side, baseline, bound) if side == "beyond" else shift(side, baseline, bound)
        batch = ws.validation_batch()
        pixel = int(np.flatnonzero((batch.reshape(len(batch), -1) == 0).all(axis=0))[0])
        rel = paths.init_onnx(model, framework)
        onnx_model = onnx.load(str(ws.run.root / rel))
        graph = onnx_model.graph
        images, logits = graph.input[0].name, graph.output[0].name
        for node in graph.node:  # the old output becomes an inner value that the new Add consumes
            node.output[:] = [f"{logits}_unshifted" if name == logits else name for name in node.output]
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([pixel], np.int64), "test_offset_pixel"),
                numpy_helper.from_array(np.array([delta], np.float32), "test_offset_delta"),
            ]
        )
        graph.node.extend(
            [
                helper.make_node("Flatten", [images], ["test_offset_flat"], axis=1),
                helper.make_node("Gather", ["test_offset_flat", "test_offset_pixel"], ["test_offset_x"], axis=1),
                helper.make_node("Mul", ["test_offset_x", "test_offset_delta"], ["test_offset"]),
                helper.make_node("Add", [f"{logits}_unshifted", "test_offset"], [logits]),
            ]
        )
        onnx.checker.check_model(onnx_model, full_check=True)  # validate must judge parity, not a broken file
        ws.write(rel, onnx_model.SerializeToString())
        rehash(ws, paths.run_dir(model, framework))
        return [key(r) for r in rows]

    return perturb


def moved_value(side: Side, others: list[float], target: float, relative: bool) -> float:
    """A value for one framework whose figure against each of `others` is >= target (beyond) or <= target
    (inside; equal against the nearest). Relative figures (|a-b| / max(|a|, |b|) of losses, all positive): the
    value moves up from the largest or the smallest other; points of accuracy: down from the smallest or the
    largest other."""
    if relative:
        return (max(others) if side == "beyond" else min(others)) / (1 - target)
    return (min(others) if side == "beyond" else max(others)) - target / 100


# The data-parallel check that compares the same figure with this framework's own data-parallel run.
DATA_PARALLEL_CHECK = {"train_step1_loss_rel": "dp_step1_loss_rel",
                       "train_lockstep_loss_rel": "dp_lockstep_loss_rel"}


def move_replicate_losses(ws: Workspace, model: str, framework: str, step: int, factor: float) -> None:
    rel = paths.run_dir(model, framework) / paths.CHECKPOINTS_FILE
    with np.load(ws.run.root / rel, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    keys = [k for k in arrays if k.endswith("/step_losses")]
    assert keys, f"{rel}: no replicate step losses"
    for k in keys:
        arrays[k] = arrays[k].copy()
        arrays[k][step] *= factor
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    ws.write(rel, buffer.getvalue())


def step_loss(model: str, framework: str, check: str, step: int) -> Perturb:
    """One framework's training log reports a different loss at one step (index 0 for step 1): every pair with
    the other frameworks moves, and so does the pair with its own data-parallel run where there is one."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, check, framework)
        pairs = {f for r in rows for f in r["framework"].split("|")}
        logs = {f: ws.read_json(paths.train_log(model, f)) for f in pairs}
        assert step < logs[framework]["steps_per_epoch"], "the step must lie in the first epoch"
        others = [log["step_losses"][step] for f, log in logs.items() if f != framework]
        own_dp = f"{framework}-dp|{framework}"
        dp_rows = [r for r in ws.rows(model, DATA_PARALLEL_CHECK[check]) if r["framework"] == own_dp]
        if dp_rows:
            dp_log = ws.read_json(paths.data_parallel_run(model, framework) / "train_log.json")
            others.append(dp_log["step_losses"][step])
        before = logs[framework]["step_losses"][step]
        logs[framework]["step_losses"][step] = moved_value(side, others, aim(side, *worst(rows)), relative=True)
        ws.write_json(paths.train_log(model, framework), logs[framework])
        retie_replicates(ws, model, framework, logs[framework]["step_losses"])
        if check == "train_lockstep_loss_rel":
            # A lockstep window beyond its float32 bound is judged against the replicates' losses
            # (checks/lockstep.py): the framework's replicates move as its run does, as under a porting mistake.
            move_replicate_losses(ws, model, framework, step, logs[framework]["step_losses"][step] / before)
        rehash(ws, paths.run_dir(model, framework))
        return [key(r) for r in rows + dp_rows]

    return perturb


# Test loss and accuracy: validate computes them from native_outputs.npz's test_logits (and ONNX Runtime's accuracy
# from model.onnx on the same images), so these cases perturb test_logits. Rows of the validation batch (the first
# export.validation_batch_size test images, whose logits validation_logits holds too) are never touched.
MARGIN = 1e-3  # a flipped image's top-two logits lie at least this far apart: far above ONNX-vs-native error


def margins(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """|true class's logit - the best other class's|, per image."""
    others = logits.astype(np.float64).copy()
    others[np.arange(len(labels)), labels] = -np.inf
    return np.abs(logits[np.arange(len(labels)), labels] - others.max(axis=1))


def flip(logits: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Swap each row's true-class logit with the best other class's: a right prediction turns wrong, a wrong
    one right (the row's logits stay the same values, permuted)."""
    out = logits.copy()
    for i in rows:
        others = out[i].astype(np.float64).copy()
        others[labels[i]] = -np.inf
        j = int(others.argmax())
        out[i, labels[i]], out[i, j] = out[i, j], out[i, labels[i]]
    return out


def rescale_to_loss(logits: np.ndarray, labels: np.ndarray, rows: np.ndarray, target: float) -> np.ndarray:
    """`logits` with `rows` (all predicted right) multiplied by one factor c > 0, found by bisection so that the
    mean cross-entropy is `target`. A right row's loss falls monotonically from log(classes) (c -> 0) to 0
    (c -> inf), and a positive factor keeps every row's argmax."""

    def scaled(log_c: float) -> tuple[np.ndarray, float]:
        out = logits.copy()
        out[rows] = (logits[rows].astype(np.float64) * math.exp(log_c)).astype(np.float32)
        return out, softmax_cross_entropy(out, labels)

    lo, hi = -20.0, 20.0  # the loss at lo is above the target, at hi below it
    assert scaled(hi)[1] < target < scaled(lo)[1], f"test loss {target} out of reach by scaling {len(rows)} rows"
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if scaled(mid)[1] > target else (lo, mid)
    out, loss = scaled((lo + hi) / 2)
    assert abs(loss - target) <= 1e-7 * target, (loss, target)  # float32 logits: the loss moves in tiny steps
    assert (out[rows].argmax(axis=1) == logits[rows].argmax(axis=1)).all(), "scaling changed a prediction"
    return out


def unique_images(images: np.ndarray) -> np.ndarray:
    """Whether each test image occurs exactly once in the test set (an ONNX gate keyed on it then hits only it)."""
    flat = images.reshape(len(images), -1)
    _, inverse, counts = np.unique(flat, axis=0, return_inverse=True, return_counts=True)
    return counts[inverse.ravel()] == 1


def flip_predictions(ws: Workspace, model: str, framework: str, change: int) -> tuple[np.ndarray, np.ndarray]:
    """Change the number of right test predictions of one framework by `change` (negative: right ones turn
    wrong), on images past the validation batch, each unique in the test set, with the smallest margins above
    MARGIN; then scale its other right rows so that the test loss stays what it was (test_loss_rel does not
    move). Writes native_outputs.npz; returns the flipped rows and their logit change."""
    data = ws.data()
    labels = data.test_labels
    rel = paths.native_outputs(model, framework)
    arrays = ws.read_npz(rel)
    logits = arrays["test_logits"]
    right = logits.argmax(axis=1) == labels
    margin = margins(logits, labels)
    past_batch = np.arange(len(labels)) >= ws.validation_batch_size()
    flippable = past_batch & (right == (change < 0)) & (margin > MARGIN) & unique_images(data.test_inputs)
    candidates = np.flatnonzero(flippable)
    rows = candidates[np.argsort(margin[candidates], kind="stable")][: abs(change)]
    assert len(rows) == abs(change), f"only {len(candidates)} images can flip, {abs(change)} needed"
    flipped = flip(logits, labels, rows)
    others = np.flatnonzero(past_batch & right & ~np.isin(np.arange(len(labels)), rows))
    flipped = rescale_to_loss(flipped, labels, others, softmax_cross_entropy(logits, labels))
    assert np.count_nonzero(flipped.argmax(axis=1) == labels) == np.count_nonzero(right) + change
    arrays["test_logits"] = flipped
    ws.write_npz(rel, arrays)
    return rows, flipped[rows] - logits[rows]


def gate_onnx(ws: Workspace, rel: Path, images: np.ndarray, offsets: np.ndarray) -> None:
    """model.onnx adds offsets[i] to its logits exactly when its input image equals images[i] (every pixel);
    for any other image it adds 0.0, which leaves every logit bit for bit as it was."""
    onnx_model = onnx.load(str(ws.run.root / rel))
    graph = onnx_model.graph
    x, logits = graph.input[0].name, graph.output[0].name
    for node in graph.node:
        node.output[:] = [f"{logits}_ungated" if name == logits else name for name in node.output]
    graph.initializer.extend(
        [
            numpy_helper.from_array(images.reshape(len(images), -1).astype(np.float32), "gate_images"),
            numpy_helper.from_array(offsets.astype(np.float32), "gate_offsets"),
            numpy_helper.from_array(np.array([1], np.int64), "gate_axis1"),
            numpy_helper.from_array(np.array([2], np.int64), "gate_axis2"),
            numpy_helper.from_array(np.array(0.0, np.float32), "gate_zero"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Flatten", [x], ["gate_flat"], axis=1),  # (batch, pixels)
            helper.make_node("Unsqueeze", ["gate_flat", "gate_axis1"], ["gate_x"]),  # (batch, 1, pixels)
            helper.make_node("Sub", ["gate_x", "gate_images"], ["gate_diff"]),  # (batch, k, pixels)
            helper.make_node("Abs", ["gate_diff"], ["gate_abs"]),
            helper.make_node("ReduceSum", ["gate_abs", "gate_axis2"], ["gate_distance"], keepdims=0),  # (batch, k)
            helper.make_node("Equal", ["gate_distance", "gate_zero"], ["gate_hit"]),
            helper.make_node("Cast", ["gate_hit"], ["gate_mask"], to=onnx.TensorProto.FLOAT),
            helper.make_node("MatMul", ["gate_mask", "gate_offsets"], ["gate_offset"]),  # (batch, classes)
            helper.make_node("Add", [f"{logits}_ungated", "gate_offset"], [logits]),
        ]
    )
    onnx.checker.check_model(onnx_model, full_check=True)
    ws.write(rel, onnx_model.SerializeToString())


def native_test_figures(ws: Workspace, model: str, frameworks: set[str]) -> dict[str, dict[str, float]]:
    """Each framework's test accuracy and loss, computed as validate computes them."""
    labels = ws.data().test_labels
    out = {}
    for f in frameworks:
        logits = ws.read_npz(paths.native_outputs(model, f))["test_logits"]
        out[f] = {
            "accuracy": float((logits.argmax(axis=1) == labels).mean()),
            "loss": softmax_cross_entropy(logits, labels),
            "n": float(len(labels)),
        }
    return out


def loss_scale(model: str, framework: str) -> Perturb:
    """One framework's test loss moves to the target: its right test predictions past the validation batch get
    more or less confident (their logits scaled by one factor), no prediction changes, so test accuracy (native
    and ONNX Runtime's) stays what it was."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, "test_loss_rel", framework)
        figures = native_test_figures(ws, model, {f for r in rows for f in r["framework"].split("|")})
        others = [fig["loss"] for f, fig in figures.items() if f != framework]
        target = moved_value(side, others, aim(side, *worst(rows)), relative=True)
        labels = ws.data().test_labels
        rel = paths.native_outputs(model, framework)
        arrays = ws.read_npz(rel)
        logits = arrays["test_logits"]
        past_batch = np.arange(len(labels)) >= ws.validation_batch_size()
        right = np.flatnonzero((logits.argmax(axis=1) == labels) & past_batch)
        arrays["test_logits"] = rescale_to_loss(logits, labels, right, target)
        ws.write_npz(rel, arrays)
        rehash(ws, paths.run_dir(model, framework))
        return [key(r) for r in rows]

    return perturb


def accuracy_change(
    side: Side,
    figures: dict[str, dict[str, float]],
    framework: str,
    bound: float,
    target: float,
    choices: tuple[int, ...] = (-3, -2, -1, 1, 2, 3),
) -> int:
    """The signed number of test images whose prediction must flip for `framework`: "beyond", the fewest that put
    its accuracy `target` points below every other framework's; "inside", the change among `choices` (accuracy
    moves in steps of 100/n points) that keeps it nearest the others, strictly within `bound`."""
    acc, n = figures[framework]["accuracy"], figures[framework]["n"]
    others = [fig["accuracy"] for f, fig in figures.items() if f != framework]

    def spread(change: int) -> float:
        return max(100 * abs(acc + change / n - o) for o in others)

    if side == "beyond":
        change = -math.ceil((acc - moved_value(side, others, target, relative=False)) * n - 1e-9)
        assert spread(change) >= target - 1e-9, (change, spread(change))
        return change
    changes = [c for c in choices if spread(c) < bound]
    assert changes, f"no whole number of images keeps {framework}'s test accuracy within {bound} points"
    return min(changes, key=lambda c: (spread(c), abs(c)))


def accuracy_flips(model: str, framework: str) -> Perturb:
    """One framework's test accuracy moves by whole images: right predictions turn wrong (beyond), or the
    nearest change that stays within the bound (inside). The test loss is held where it was (rescale_to_loss),
    and model.onnx is gated to make the same flips on exactly those images, so ONNX Runtime's accuracy moves with
    the native one: onnx_test_accuracy_equals_native (tolerance 0) stays honest and passing, and the only check
    that moves is test_accuracy_points (min_test_accuracy reads the same figure and stays above its floor).
    (Leaving model.onnx alone would fail that zero-tolerance check on every
    inside case too; raising the tolerance instead would prove nothing about the figure. The native-only flip
    is its own case below, `onnx_accuracy`.)"""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, "test_accuracy_points", framework)
        figures = native_test_figures(ws, model, {f for r in rows for f in r["framework"].split("|")})
        baseline, bound = worst(rows)
        change = accuracy_change(side, figures, framework, bound, aim(side, baseline, bound))
        flipped, offsets = flip_predictions(ws, model, framework, change)
        gate_onnx(ws, paths.onnx_model(model, framework), ws.data().test_inputs[flipped], offsets)
        rehash(ws, paths.run_dir(model, framework))
        return [key(r) for r in rows]

    return perturb


def onnx_accuracy(model: str, framework: str) -> Perturb:
    """The framework's own test logits predict one image differently (right to wrong or the reverse, whichever
    keeps test_accuracy_points within its bound; the test loss held), model.onnx unchanged: ONNX Runtime's test
    accuracy no longer equals the native one. Tolerance 0: there is no "inside"."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        assert side == "beyond", "a zero tolerance has no inside"
        rows = ws.rows(model, "test_accuracy_points", framework)
        figures = native_test_figures(ws, model, {f for r in rows for f in r["framework"].split("|")})
        bound = worst(rows)[1]
        change = accuracy_change("inside", figures, framework, bound, bound, choices=(-1, 1))
        flip_predictions(ws, model, framework, change)
        rehash(ws, paths.run_dir(model, framework))
        return [(model, framework, "onnx_test_accuracy_equals_native")]

    return perturb


def accuracy_floor(model: str) -> Perturb:
    """params.yaml's floor for `model` rises half-way from the best framework's accuracy to 1 (every framework
    fails), or to half a test image below the worst one's (every framework passes)."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, "min_test_accuracy")
        accuracies = [r["value"] for r in rows]
        if side == "beyond":
            assert max(accuracies) < 1, f"{model} is perfect in this run: no floor above it can be set"
            floor = max(accuracies) + (1 - max(accuracies)) / 2
        else:
            floor = min(accuracies) - 0.5 / len(load_prepared(ws.run.root / paths.PREPARED).test_labels)
        params = ws.params()
        params["quality"]["min_test_accuracy"][model] = floor
        ws.write(paths.PARAMS, yaml.safe_dump(params, sort_keys=False).encode())
        return [key(r) for r in rows]

    return perturb


def native_roundtrip(model: str, framework: str) -> Perturb:
    """export.json records a larger reload error for one native format (the first, whatever the formats are)."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        record = ws.read_json(paths.export_record(model, framework))
        fmt = sorted(record["native_roundtrip_max_abs"])[0]
        row = ws.row(model, framework, f"native_roundtrip_{fmt}")
        record["native_roundtrip_max_abs"][fmt] = aim(side, row["value"], row["tolerance"])
        ws.write_json(paths.export_record(model, framework), record)
        return [key(row)]

    return perturb


def running_statistic(model: str, framework: str, statistic: str) -> Perturb:
    """One framework's trained BatchNorm statistic moves in one element of one layer (the first such layer): its
    smallest-magnitude element, so that the tensor's largest magnitude (the figure's denominator) stays, shifts by
    shift() times that magnitude. Every pair the framework is in moves; nothing else does (training parity reads
    the logs and test logits, not the weights)."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, f"{statistic}_rel", framework)
        baseline, bound = worst(rows)
        frameworks = {f for r in rows for f in r["framework"].split("|")}
        trained = {f: load_file(str(ws.run.root / paths.trained_weights(model, f))) for f in frameworks}
        name = next(n for n in trained[framework] if n.endswith(f".{statistic}"))
        scale = max(float(np.abs(t[name]).max()) for t in trained.values())
        tensor = trained[framework][name].copy()
        smallest = int(np.abs(tensor).argmin())
        tensor.flat[smallest] += np.float32(shift(side, baseline, bound) * scale)
        assert np.abs(tensor).max() <= scale, "the shift changed the tensor's largest magnitude"
        rel = paths.trained_weights(model, framework)
        with safe_open(str(ws.run.root / rel), framework="numpy") as f:
            metadata = f.metadata()
        ws.write(rel, save_safetensors({**trained[framework], name: tensor}, metadata=metadata))
        rehash(ws, paths.run_dir(model, framework))
        return [key(r) for r in rows]

    return perturb


# inference_mode_problems (rosetta_common.metrics) compares an image's logits alone with those in its batch for
# the batch's first images: the planted batch dependence is measured on these (beyond) and bounded over the whole
# batch (inside), so that either side holds whichever first images it looks at.
FIRST_ALONE = 4


def reduce_mean_rows(node_input: str, output: str, opset: int) -> onnx.NodeProto:
    """ReduceMean over axis 0, keeping it: axes are an attribute before opset 18, an input from it."""
    if opset >= 18:
        return helper.make_node("ReduceMean", [node_input, "batch_axis0"], [output], keepdims=1)
    return helper.make_node("ReduceMean", [node_input], [output], axes=[0], keepdims=1)


def onnx_batch_dependence(model: str, framework: str) -> Perturb:
    """model.onnx adds delta * (mean over the batch of pixel p - c) to every logit, c being that mean over the
    validation batch: on the validation batch (onnx_vs_native) it adds ~0, on the test set (accuracy) the same
    value to every class (no prediction changes), but an image alone gets delta * (x[p] - c): its logits depend on
    its batch, as with BatchNorm on batch statistics. Only inference_mode_onnx_model moves."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        row = ws.row(model, framework, "inference_mode_onnx_model")
        target = shift(side, row["value"], row["tolerance"])
        flat = ws.validation_batch().reshape(ws.validation_batch_size(), -1).astype(np.float64)
        centre = flat.mean(axis=0)
        first = np.abs(flat[:FIRST_ALONE] - centre).max(axis=0)
        pixel = int(first.argmax())
        spread = first[pixel] if side == "beyond" else np.abs(flat[:, pixel] - centre[pixel]).max()
        delta = target / spread
        rel = paths.onnx_model(model, framework)
        onnx_model = onnx.load(str(ws.run.root / rel))
        opset = next(o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx"))
        graph = onnx_model.graph
        images, logits = graph.input[0].name, graph.output[0].name
        for node in graph.node:
            node.output[:] = [f"{logits}_alone" if name == logits else name for name in node.output]
        graph.initializer.extend([
            numpy_helper.from_array(np.array([pixel], np.int64), "batch_pixel"),
            numpy_helper.from_array(np.array([0], np.int64), "batch_axis0"),
            numpy_helper.from_array(np.array(centre[pixel], np.float32), "batch_centre"),
            numpy_helper.from_array(np.array(delta, np.float32), "batch_delta"),
        ])
        graph.node.extend([
            helper.make_node("Flatten", [images], ["batch_flat"], axis=1),
            helper.make_node("Gather", ["batch_flat", "batch_pixel"], ["batch_x"], axis=1),  # (batch, 1)
            reduce_mean_rows("batch_x", "batch_mean", opset),  # (1, 1)
            helper.make_node("Sub", ["batch_mean", "batch_centre"], ["batch_off"]),
            helper.make_node("Mul", ["batch_off", "batch_delta"], ["batch_term"]),
            helper.make_node("Add", [f"{logits}_alone", "batch_term"], [logits]),
        ])
        onnx.checker.check_model(onnx_model, full_check=True)
        ws.write(rel, onnx_model.SerializeToString())
        rehash(ws, paths.run_dir(model, framework))
        return [key(row)]

    return perturb


def native_batch_dependence(model: str, framework: str) -> Perturb:
    """The logits one native format recorded for the first image alone move by an offset (at its smallest logit,
    whose float32 spacing is finest): that export's image depends on its batch. Only its inference-mode row
    moves."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        fmt = sorted(ws.read_json(paths.export_record(model, framework))["native_roundtrip_max_abs"])[0]
        row = ws.row(model, framework, f"inference_mode_native_{fmt}")
        rel = paths.native_outputs(model, framework)
        arrays = ws.read_npz(rel)
        _, alone_key = paths.native_inference_keys(fmt)
        alone = arrays[alone_key].copy()
        at = int(np.abs(alone[0]).argmin())
        alone[0, at] += shift(side, row["value"], row["tolerance"])
        arrays[alone_key] = alone
        ws.write_npz(rel, arrays)
        rehash(ws, paths.run_dir(model, framework))
        return [key(row)]

    return perturb


# ---- the cases, and how they share validate runs ---------------------------------------------------------------
#
# Every row of reports/validation.json is one model's, computed from that model's files (its runs, its init
# weights, its entries of params.yaml) and the shared prepared data, with one exception: the training-parity
# figures judged against the replicates' null after two runs part are Holm-corrected together, across models. So a
# case that moves no training figure nor which runs are judged (`shares`: an export's outputs, an ONNX graph, a
# recorded round-trip error, an accuracy floor) can share one run of the stage with cases of other models, each
# judged on its own model's rows exactly as a run of it alone would judge them, provided they agree on the outcome
# (the stage passes for "inside" cases and fails for the others); every other case has a run of its own.
# `ROUNDS` groups them so: at most one case per model in a run, all passing or all failing. Each run checks that no
# two of its cases edit the same file, and that every model none of its cases edited comes back as in the
# baseline, row for row, passing with the same figures (validate is deterministic: test_lineage.py's
# `dvc repro -f` changes no hash). 43 cases, 25 runs of the stage.


@dataclass(frozen=True)
class Case:
    id: str
    model: str  # the one model whose files `apply` edits (in params.yaml, only that model's entries)
    passes: bool  # whether validate must pass with the edit in place ("inside") or fail
    apply: Callable[[Workspace], Any]  # edits the workspace; returns what the case's test checks
    shares: bool = False  # may share a validate run with other models' cases (see above)

    def __repr__(self) -> str:
        return self.id


# One case per kind of check, spread over models and frameworks (not every combination: each case is judged).
TOLERANCE_CASES: list[tuple[str, str, Perturb]] = [
    ("onnx_vs_native-cnn-torch", "cnn", native_logits("cnn", "torch", "onnx_vs_native", "validation_logits")),
    ("init_onnx_vs_native-attention-tf", "attention",
     native_logits("attention", "tf", "init_onnx_vs_native", "init_validation_logits")),
    ("init_onnx_vs_reference-cnn", "cnn", reference_weights("cnn")),
    ("forward_parity_init_onnx-attention-torch", "attention", input_gated_offset("attention", "torch")),
    ("train_step1_loss_rel-mlp-jax", "mlp", step_loss("mlp", "jax", "train_step1_loss_rel", 0)),
    ("train_lockstep_loss_rel-cnn-tf", "cnn", step_loss("cnn", "tf", "train_lockstep_loss_rel", 1)),
    ("test_loss_rel-attention-torch", "attention", loss_scale("attention", "torch")),
    ("test_accuracy_points-mlp-tf", "mlp", accuracy_flips("mlp", "tf")),
    ("min_test_accuracy-attention", "attention", accuracy_floor("attention")),
    ("native_roundtrip-mlp-torch", "mlp", native_roundtrip("mlp", "torch")),
    ("native_roundtrip-cnn-tf", "cnn", native_roundtrip("cnn", "tf")),
    ("native_roundtrip-attention-jax", "attention", native_roundtrip("attention", "jax")),
    ("running_mean_rel-resnet-tf", "resnet", running_statistic("resnet", "tf", "running_mean")),
    ("running_var_rel-resnet-torch", "resnet", running_statistic("resnet", "torch", "running_var")),
    ("inference_mode_onnx_model-resnet-jax", "resnet", onnx_batch_dependence("resnet", "jax")),
    ("inference_mode_onnx_model-gru-tf", "gru", onnx_batch_dependence("gru", "tf")),
    ("inference_mode_native-resnet-torch", "resnet", native_batch_dependence("resnet", "torch")),
    ("inference_mode_native-lstm-jax", "lstm", native_batch_dependence("lstm", "jax")),
]
# Checks whose tolerance is 0: only "beyond".
ZERO_TOLERANCE_CASES: list[tuple[str, str, Perturb]] = [
    ("onnx_test_accuracy_equals_native-cnn-jax", "cnn", onnx_accuracy("cnn", "jax")),
]


# What an edit of a trained run's files necessarily moves besides the check it probes: a trained file edited, or
# the native logits it must reproduce, without the framework's model being retrained is no longer the model the
# framework trained, which trained_weights_vs_native judges. Such a row may fail beside the probed one (beyond),
# and may be the only one that fails (inside); no other row may.
# Likewise for the init twins the servers answered (pipelines/checks/serving.py): the init logits native_outputs.npz
# records, edited, are no longer what that framework's server computed from the same weights
# (served_init_vs_in_process); the init weights the reference reads, edited, move every served init answer's
# distance to the reference as they move init.onnx's (served_init_vs_reference, served_onnx_init_vs_reference).
# The ONNX server serves ONNX_FROM's files, so its rows' subject is that framework.
ONNX_FROM = "torch"  # pipelines.serving.ONNX_FROM, as the tiny run's serve stage served it
COLLATERAL: dict[str, set[Key]] = {
    "onnx_vs_native-cnn-torch": {("cnn", "torch", "trained_weights_vs_native")},
    "running_mean_rel-resnet-tf": {("resnet", "tf", "trained_weights_vs_native")},
    "running_var_rel-resnet-torch": {("resnet", "torch", "trained_weights_vs_native")},
    "init_onnx_vs_native-attention-tf": {("attention", "tf", f"served_init_vs_in_process_{p}")
                                         for p in paths.SERVED_PROTOCOLS},
    "init_onnx_vs_reference-cnn": {("cnn", fw, f"served_init_vs_reference_{p}") for fw in ("torch", "tf", "jax")
                                   for p in paths.SERVED_PROTOCOLS}
    | {("cnn", ONNX_FROM, f"served_onnx_init_vs_reference_{p}") for p in paths.SERVED_PROTOCOLS},
}


# The cases that move no training-parity figure and leave every run judged (see `Case.shares`).
SHARING = {"onnx_vs_native-cnn-torch", "init_onnx_vs_native-attention-tf", "init_onnx_vs_reference-cnn",
           "forward_parity_init_onnx-attention-torch", "min_test_accuracy-attention", "native_roundtrip-mlp-torch",
           "native_roundtrip-cnn-tf", "native_roundtrip-attention-jax", "inference_mode_onnx_model-resnet-jax",
           "inference_mode_onnx_model-gru-tf", "inference_mode_native-resnet-torch", "inference_mode_native-lstm-jax"}


def sided(id: str, model: str, perturb: Perturb, side: Side) -> Case:
    return Case(f"{id}-{side}", model, side == "inside", lambda ws: perturb(ws, side), shares=id in SHARING)


SIDED = [sided(*case, side) for case in TOLERANCE_CASES for side in ("beyond", "inside")] + [
    sided(*case, "beyond") for case in ZERO_TOLERANCE_CASES]


@pytest.fixture(scope="module")
def finished_run(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """A private copy of the session's run, so the cases neither see nor disturb what other tests do to it (the
    e2e tests edit the torch package and rerun). Validated once here: the copy must pass as it stands, and its
    report gives the baseline figures."""
    root = tmp_path_factory.mktemp("validate_failures") / "repo"
    shutil.copytree(tiny_pipeline.root, root, symlinks=True)
    sh(VALIDATE, root, tiny_pipeline.env)
    report = json.loads((root / REPORT).read_text())
    assert report["passed"] is True, [r for r in report["checks"] if not r["passed"]]
    return FinishedRun(root, tiny_pipeline.env, {key(r): r for r in report["checks"]})


def run_validate(ws: Workspace) -> tuple[Any, dict[Key, dict[str, Any]], str]:
    """The real validate stage on the workspace: its process result, its report's rows, and its output (for
    assertion messages)."""
    ws.remove(REPORT)  # the report read below must be this run's, not a leftover
    result = sh(VALIDATE, ws.run.root, ws.run.env, check=False)
    output = f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert (ws.run.root / REPORT).is_file(), f"validate wrote no report (crashed?):\n{output}"
    report = json.loads((ws.run.root / REPORT).read_text())
    assert report["passed"] is (result.returncode == 0), output
    return result, {key(r): r for r in report["checks"]}, output


@dataclass
class Judged:
    """One run of the validate stage on the copy with the edits of one round's cases in place."""

    result: Any
    rows: dict[Key, dict[str, Any]]
    output: str
    models: set[str]  # the models whose files the round's cases edited
    returned: dict[str, Any]  # case id -> what its edit returned
    errors: dict[str, Exception]  # case id -> what its edit raised (its own test raises it again)

    def own_rows(self, run: FinishedRun, case: Case) -> dict[Key, dict[str, Any]]:
        """The case's own model's rows: what it is judged on. Every model that no case of the round edited must
        come back as in the baseline: the same rows, passing, with the same figures (no edit reached it)."""
        def figures(rows: dict[Key, dict[str, Any]]) -> dict[Key, tuple[Any, ...]]:
            return {k: (r["passed"], r["value"], r["tolerance"]) for k, r in rows.items()
                    if k[0] not in self.models}

        assert figures(self.rows) == figures(run.baseline), self.output
        return {k: r for k, r in self.rows.items() if k[0] == case.model}


def rounds(cases: list[Case]) -> list[list[Case]]:
    """Cases grouped into validate runs: a sharing case joins the first run of sharing cases with no case of its
    model and the same outcome; any other case has a run of its own."""
    grouped: list[list[Case]] = []
    for case in cases:
        room = [g for g in grouped if case.shares and g[0].shares and g[0].passes == case.passes
                and all(c.model != case.model for c in g)]
        if room:
            room[0].append(case)
        else:
            grouped.append([case])
    return grouped


def judge(run: FinishedRun, cases: list[Case]) -> Judged:
    """Apply every case's edit (each to files no other case of the run touches), run validate once, restore."""
    ws = Workspace(run)
    returned: dict[str, Any] = {}
    errors: dict[str, Exception] = {}
    try:
        for case in cases:
            earlier, ws.touched = set(ws.saved), set()
            try:
                returned[case.id] = case.apply(ws)
            except Exception as error:  # the case's own test reports it; the others are still judged
                errors[case.id] = error
                ws.restore_only(ws.touched - earlier)
                continue
            shared = sorted(str(p.relative_to(run.root)) for p in ws.touched & earlier)
            assert not shared, f"{case.id} edits files another case of its validate run edits: {shared}"
        result, rows, output = run_validate(ws)
    finally:
        ws.restore()
    return Judged(result, rows, output, {c.model for c in cases if c.id in returned}, returned, errors)


@pytest.fixture(scope="module")
def judged(finished_run: FinishedRun) -> Callable[[Case], tuple[Judged, Any]]:
    """A case's validate run (made once per round, when its first case is tested) and what its edit returned."""
    done: dict[int, Judged | Exception] = {}

    def get(case: Case) -> tuple[Judged, Any]:
        index = ROUND_OF[case.id]
        if index not in done:
            try:
                done[index] = judge(finished_run, ROUNDS[index])
            except Exception as error:  # every case of the round fails with it
                done[index] = error
        outcome = done[index]
        if isinstance(outcome, Exception):
            raise outcome
        if case.id in outcome.errors:
            raise outcome.errors[case.id]
        return outcome, outcome.returned[case.id]

    return get


def assert_failed_naming(result: Any, rows: dict[Key, dict[str, Any]], keys: set[Key], output: str,
                         collateral: frozenset[Key] | set[Key] = frozenset()) -> None:
    assert result.returncode != 0, output
    for model, framework, check in keys:
        assert re.search(rf"^FAILED {re.escape(f'{model}/{framework} {check}')}:", result.stderr, re.M), output
    failed = {k for k, r in rows.items() if not r["passed"]}
    assert keys <= failed <= keys | collateral, output  # that check and nothing else (but what it must move)


def model_keys(run: FinishedRun, model: str) -> set[Key]:
    return {k for k in run.baseline if k[0] == model}


@pytest.mark.parametrize("case", SIDED, ids=lambda c: c.id)
def test_validate_judges_the_tolerance(judged: Callable[[Case], tuple[Judged, Any]], finished_run: FinishedRun,
                                       case: Case) -> None:
    run, pushed = judged(case)
    assert pushed, "the case moved no row"
    assert {k[0] for k in pushed} == {case.model}, pushed
    rows, output = run.own_rows(finished_run, case), run.output
    # Every row of the model is judged again; a pair in lockstep to the end has no prediction_disagreement row (its
    # float32 bounds judge it), so a case that makes two runs part adds that pair's row, and only that one.
    added = rows.keys() - model_keys(finished_run, case.model)
    assert model_keys(finished_run, case.model) <= rows.keys(), output
    assert all(k[2] == PREDICTION_DISAGREEMENT for k in added), (added, output)
    collateral = COLLATERAL.get(case.id.rsplit("-", 1)[0], set())
    if not case.passes:
        assert_failed_naming(run.result, rows, set(pushed), output, collateral)
    else:
        # The case's own model fails nothing but its collateral; the run as a whole (shared with other models'
        # cases) nothing but the collateral of its cases, and it exits non-zero exactly when something failed.
        failed = {k for k, r in run.rows.items() if not r["passed"]}
        assert {k for k in failed if k[0] == case.model} <= collateral, output
        round_collateral = set().union(*(COLLATERAL.get(id.rsplit("-", 1)[0], set()) for id in run.returned))
        assert failed <= round_collateral and (run.result.returncode == 0) is (not failed), output
        assert all(rows[k]["passed"] for k in pushed), output
        for k in pushed:
            before, after = finished_run.baseline[k], rows[k]
            assert (after["value"], after["tolerance"]) != (before["value"], before["tolerance"]), k


# A damage edits a run's files and returns the rows that must fail, the rows validate must then leave out (what it
# cannot judge), and the text the failing row's detail must hold (naming the file).
Damage = Callable[[Workspace], tuple[set[Key], set[Key], str]]


def native_files(ws: Workspace, model: str, framework: str) -> list[Path]:
    native = ws.run.root / paths.native_dir(model, framework)
    return sorted(p.relative_to(ws.run.root) for p in native.rglob("*") if p.is_file())


def unjudged(ws: Workspace, model: str, framework: str) -> set[Key]:
    """A run that fails artifacts_intact is not judged further: every other row of it, and every pair it is in
    (the ONNX server's pairs too, where it serves that framework's files)."""
    subjects = {framework} | ({"onnx"} if framework == ONNX_FROM else set())
    return {
        k
        for k in ws.run.baseline
        if k[0] == model and subjects & set(k[1].split("|")) and k != (model, framework, "artifacts_intact")
    }


def native_file_deleted(model: str, framework: str) -> Damage:
    def damage(ws: Workspace) -> tuple[set[Key], set[Key], str]:
        target = native_files(ws, model, framework)[0]
        ws.remove(target)
        return (
            {(model, framework, "artifacts_intact")},
            unjudged(ws, model, framework),
            f"{target}: missing (export.json recorded it)",
        )

    return damage


def native_file_altered(model: str, framework: str) -> Damage:
    """One byte of the largest native file changes; export.json is not updated."""

    def damage(ws: Workspace) -> tuple[set[Key], set[Key], str]:
        target = max(native_files(ws, model, framework), key=lambda p: (ws.run.root / p).stat().st_size)
        data = bytearray((ws.run.root / target).read_bytes())
        data[len(data) // 2] ^= 0xFF
        ws.write(target, bytes(data))
        return (
            {(model, framework, "artifacts_intact")},
            unjudged(ws, model, framework),
            f"{target}: altered since export",
        )

    return damage


def native_file_unrecorded(model: str, framework: str) -> Damage:
    """A file export.json never recorded appears under native/ (a format the export did not vouch for)."""

    def damage(ws: Workspace) -> tuple[set[Key], set[Key], str]:
        target = paths.native_dir(model, framework) / "unrecorded.bin"
        ws.write(target, b"not written by the export")
        return (
            {(model, framework, "artifacts_intact")},
            unjudged(ws, model, framework),
            f"{target}: not among the files export.json recorded",
        )

    return damage


def onnx_corrupt_rehashed(model: str, framework: str) -> Damage:
    """model.onnx is not an ONNX model, and export.json records its sha256 (an export that wrote junk): the run is
    intact, the ONNX checker fails naming the file, and what needs a session of it is not judged."""

    def damage(ws: Workspace) -> tuple[set[Key], set[Key], str]:
        target = paths.onnx_model(model, framework)
        ws.write(target, b"this is not an onnx model")
        rehash(ws, paths.run_dir(model, framework))
        absent = {(model, framework, check) for check in ("onnx_vs_native", "onnx_test_accuracy_equals_native",
                                                           "inference_mode_onnx_model")}
        return {(model, framework, "onnx_checker_model")}, absent, f"{target}: not a valid ONNX model"

    return damage


DAMAGE_CASES = [
    Case("artifacts_intact-native-deleted-mlp-tf", "mlp", False, native_file_deleted("mlp", "tf")),
    Case("artifacts_intact-native-altered-cnn-torch", "cnn", False, native_file_altered("cnn", "torch")),
    Case("artifacts_intact-native-unrecorded-attention-jax", "attention", False,
         native_file_unrecorded("attention", "jax")),
    Case("onnx_checker_model-corrupt-mlp-jax", "mlp", False, onnx_corrupt_rehashed("mlp", "jax")),
]


@pytest.mark.parametrize("case", DAMAGE_CASES, ids=lambda c: c.id)
def test_validate_refuses_altered_artifacts(judged: Callable[[Case], tuple[Judged, Any]], finished_run: FinishedRun,
                                            case: Case) -> None:
    run, (failing, absent, message) = judged(case)
    assert {k[0] for k in failing | absent} == {case.model}, (failing, absent)
    rows, output = run.own_rows(finished_run, case), run.output
    assert_failed_naming(run.result, rows, failing, output)
    for k in failing:
        assert message in rows[k].get("detail", ""), (rows[k], message)
    assert message in run.result.stderr, output
    assert rows.keys() == model_keys(finished_run, case.model) - absent, output


def in_training_mode(kind: str) -> Callable[[onnx.ModelProto], None]:
    """A graph edit that puts the model's logits through a layer in training mode, as an export made before
    `model.eval()` (or with `training=True`) would: "dropout", a Dropout whose training_mode input is true
    (random units dropped on every run); "batch statistics", a BatchNormalization with training_mode=1 (each
    class's logit normalized with the batch's mean and variance, so an image's logits depend on its batch)."""

    def edit(model: onnx.ModelProto) -> None:
        graph = model.graph
        logits = graph.output[0].name
        for node in graph.node:
            node.output[:] = [f"{logits}_eval" if name == logits else name for name in node.output]
        classes = graph.output[0].type.tensor_type.shape.dim[1].dim_value
        if kind == "dropout":
            graph.initializer.extend([numpy_helper.from_array(np.array(0.5, np.float32), "train_ratio"),
                                      numpy_helper.from_array(np.array(True), "train_mode")])
            graph.node.append(helper.make_node("Dropout", [f"{logits}_eval", "train_ratio", "train_mode"], [logits]))
        else:
            graph.initializer.extend([numpy_helper.from_array(np.full(classes, value, np.float32), name)
                                      for name, value in (("bn_scale", 1.0), ("bn_bias", 0.0), ("bn_mean", 0.0),
                                                          ("bn_var", 1.0))])
            graph.node.append(helper.make_node(
                "BatchNormalization", [f"{logits}_eval", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                [logits, "bn_running_mean", "bn_running_var"], training_mode=1))
        onnx.checker.check_model(model, full_check=True)

    return edit


def training_mode_export(kind: str) -> Callable[[Workspace], None]:
    """resnet's model.onnx from torch, edited into a training-mode export, its hash re-recorded (as an export that
    wrote it would have)."""

    def damage(ws: Workspace) -> None:
        rel = paths.onnx_model("resnet", "torch")
        model = onnx.load(str(ws.run.root / rel))
        in_training_mode(kind)(model)
        ws.write(rel, model.SerializeToString())
        rehash(ws, paths.run_dir("resnet", "torch"))

    return damage


TRAINING_MODE = [("dropout", "dropout active?"), ("batch statistics", "batch statistics in use?")]
TRAINING_MODE_CASES = {kind: Case(f"training-mode-{kind}", "resnet", False, training_mode_export(kind), shares=True)
                       for kind, _ in TRAINING_MODE}


@pytest.mark.parametrize(("kind", "problem"), TRAINING_MODE)
def test_an_onnx_export_in_training_mode_fails_the_inference_mode_check(
        judged: Callable[[Case], tuple[Judged, Any]], finished_run: FinishedRun, kind: str, problem: str) -> None:
    """validate fails inference_mode_onnx_model for resnet/torch's training-mode model.onnx, naming what shows
    it. (Its logits differ from the framework's too, so onnx_vs_native and the accuracy checks may fail beside
    it.)"""
    case = TRAINING_MODE_CASES[kind]
    run, _ = judged(case)
    rows, output = run.own_rows(finished_run, case), run.output
    assert run.result.returncode != 0, output
    row = rows[("resnet", "torch", "inference_mode_onnx_model")]
    assert row["passed"] is False and row["value"] > row["tolerance"], row
    assert problem in row["detail"], row
    assert re.search(r"^FAILED resnet/torch inference_mode_onnx_model:", run.result.stderr, re.M), output
    assert rows[("resnet", "torch", "inference_mode_onnx_init")]["passed"] is True  # init.onnx was left alone


ALL_CASES = [*SIDED, *DAMAGE_CASES, *TRAINING_MODE_CASES.values()]
assert len({c.id for c in ALL_CASES}) == len(ALL_CASES)
ROUNDS = rounds(ALL_CASES)
ROUND_OF = {case.id: index for index, group in enumerate(ROUNDS) for case in group}


def test_cases_share_runs_only_across_models() -> None:
    """The grouping itself: every case judged once, no two cases of one model or of opposite outcomes together,
    and only sharing cases with others."""
    assert sorted(c.id for g in ROUNDS for c in g) == sorted(c.id for c in ALL_CASES)
    assert {c.id.removesuffix("-beyond").removesuffix("-inside") for c in SIDED if c.shares} == SHARING
    for group in ROUNDS:
        assert len({c.model for c in group}) == len(group) and len({c.passes for c in group}) == 1, group
        assert len(group) == 1 or all(c.shares for c in group), group
