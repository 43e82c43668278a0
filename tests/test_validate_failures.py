"""The failure path of the validate stage, for real: a copy of the session's finished TINY run gets one figure
pushed past its tolerance (or to just inside it), then the real stage runs under ONNX Runtime through the runner.

Each case perturbs the artifacts so that exactly one kind of check moves. The shift is computed from the
tolerance and the baseline figure that the unperturbed copy's own reports/validation.json gives:
- "beyond": the figure lands at 2x the bound (or further): validate must exit non-zero, print
  `FAILED <model>/<framework> <check>` and mark exactly the expected rows failed in reports/validation.json;
- "inside": the figure lands at most half-way from the baseline to the bound: validate must pass, and the
  row must have moved (else the perturbation was not read and the case proves nothing).
Nothing is mocked; every case restores the files it touched, so cases do not depend on their order.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
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
from rosetta_common.data import load_prepared
from support import VALIDATE, TinyRun, sh

Side = Literal["beyond", "inside"]
Key = tuple[str, str, str]  # (model, framework or "a|b" pair, check), as in reports/validation.json
REPORT = "reports/validation.json"


def key(row: dict[str, Any]) -> Key:
    return row["model"], row["framework"], row["check"]


def replace_file(path: Path, data: bytes) -> None:
    """Write by rename, never through the old file: should DVC ever link a workspace file to its cache, an edit
    would otherwise corrupt the cache (and with it the session's shared run)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class FinishedRun:
    """This module's private copy of the session's finished run, with the figures it validates to."""

    root: Path
    env: dict[str, str]
    baseline: dict[Key, dict[str, Any]]


@dataclass
class Workspace:
    """One case's view of the copy: every write saves the original first, and `restore` puts it back."""

    run: FinishedRun
    saved: dict[Path, bytes] = field(default_factory=dict)

    def row(self, model: str, framework: str, check: str) -> dict[str, Any]:
        return self.run.baseline[(model, framework, check)]

    def rows(self, model: str, check: str, framework: str | None = None) -> list[dict[str, Any]]:
        """Baseline rows of `check` for `model`; with `framework`, only its own row or the pairs it is in."""
        return [
            r
            for (m, f, c), r in self.run.baseline.items()
            if m == model and c == check and (framework is None or framework in f.split("|"))
        ]

    def write(self, rel: str | Path, data: bytes) -> None:
        path = self.run.root / rel
        self.saved.setdefault(path, path.read_bytes())
        replace_file(path, data)

    def remove(self, rel: str | Path) -> None:
        path = self.run.root / rel
        self.saved.setdefault(path, path.read_bytes())
        path.unlink()

    def read_json(self, rel: str | Path) -> Any:
        return json.loads((self.run.root / rel).read_text())

    def write_json(self, rel: str | Path, value: Any) -> None:
        # json writes floats by repr, so every figure below reaches validate bit for bit
        self.write(rel, json.dumps(value, indent=2).encode())

    def params(self) -> dict[str, Any]:
        return yaml.safe_load((self.run.root / paths.PARAMS).read_text())

    def validation_batch(self) -> np.ndarray:
        data = load_prepared(self.run.root / paths.PREPARED)
        return data.validation_batch(self.params()["export"]["validation_batch_size"])

    def restore(self) -> None:
        for path, data in self.saved.items():
            replace_file(path, data)
        self.saved.clear()


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
    return max(r["max_abs_err"] for r in rows), bound


def native_logits(model: str, framework: str, check: str, array: str) -> Perturb:
    """The framework's own logits that the ONNX model must reproduce (validation or init) move by an offset."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        row = ws.row(model, framework, check)
        rel = paths.native_outputs(model, framework)
        with np.load(ws.run.root / rel, allow_pickle=False) as npz:
            arrays = dict(npz)
        logits = arrays[array].copy()
        # the smallest logit: its float32 spacing is the finest, so the offset lands as computed, and the
        # largest |logit| (which sets the tolerance) stays where it is
        at = np.unravel_index(np.abs(logits).argmin(), logits.shape)
        logits[at] += shift(side, row["max_abs_err"], row["tolerance"])
        arrays[array] = logits
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        ws.write(rel, buffer.getvalue())
        return [(model, framework, check)]

    return perturb


def reference_weights(model: str) -> Perturb:
    """init.safetensors' head bias moves, so the float64 reference's logits all move by the offset; the
    exported init.onnx files do not, so every framework's init_onnx_vs_reference row moves."""

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
        return [key(r) for r in rows]

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


def step_loss(model: str, framework: str, check: str, step: int) -> Perturb:
    """One framework's training log reports a different loss at one step (index 0 for step 1)."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, check, framework)
        pairs = {f for r in rows for f in r["framework"].split("|")}
        logs = {f: ws.read_json(paths.train_log(model, f)) for f in pairs}
        assert step < logs[framework]["steps_per_epoch"], "the step must lie in the first epoch"
        others = [log["step_losses"][step] for f, log in logs.items() if f != framework]
        logs[framework]["step_losses"][step] = moved_value(side, others, aim(side, *worst(rows)), relative=True)
        ws.write_json(paths.train_log(model, framework), logs[framework])
        return [key(r) for r in rows]

    return perturb


def metric_value(model: str, framework: str, check: str, metric: str) -> Perturb:
    """One framework's metrics file reports a different test loss or accuracy. (validate reads these figures
    from metrics/ today; once it recomputes them from the artifacts, this case must perturb those instead.)"""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, check, framework)
        pairs = {f for r in rows for f in r["framework"].split("|")}
        metrics = {f: ws.read_json(paths.metrics(model, f)) for f in pairs}
        others = [m[metric] for f, m in metrics.items() if f != framework]
        target = aim(side, *worst(rows))
        metrics[framework][metric] = moved_value(side, others, target, relative=metric == "test_loss")
        ws.write_json(paths.metrics(model, framework), metrics[framework])
        return [key(r) for r in rows]

    return perturb


def accuracy_floor(model: str) -> Perturb:
    """params.yaml's floor for `model` rises half-way from the best framework's accuracy to 1 (every framework
    fails), or to half a test image below the worst one's (every framework passes)."""

    def perturb(ws: Workspace, side: Side) -> list[Key]:
        rows = ws.rows(model, "min_test_accuracy")
        accuracies = [r["max_abs_err"] for r in rows]
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
        record["native_roundtrip_max_abs"][fmt] = aim(side, row["max_abs_err"], row["tolerance"])
        ws.write_json(paths.export_record(model, framework), record)
        return [key(row)]

    return perturb


# One case per kind of check, spread over models and frameworks (not every combination: each case is a run).
CASES = [
    pytest.param(native_logits("cnn", "torch", "onnx_vs_native", "validation_logits"), id="onnx_vs_native-cnn-torch"),
    pytest.param(
        native_logits("attention", "tf", "init_onnx_vs_native", "init_validation_logits"),
        id="init_onnx_vs_native-attention-tf",
    ),
    pytest.param(reference_weights("cnn"), id="init_onnx_vs_reference-cnn"),
    pytest.param(input_gated_offset("attention", "torch"), id="forward_parity_init_onnx-attention-torch"),
    pytest.param(step_loss("mlp", "jax", "train_step1_loss_rel", 0), id="train_step1_loss_rel-mlp-jax"),
    pytest.param(step_loss("cnn", "tf", "train_first_epoch_loss_rel", 1), id="train_first_epoch_loss_rel-cnn-tf"),
    pytest.param(metric_value("attention", "torch", "test_loss_rel", "test_loss"), id="test_loss_rel-attention-torch"),
    pytest.param(metric_value("mlp", "tf", "test_accuracy_points", "test_accuracy"), id="test_accuracy_points-mlp-tf"),
    pytest.param(accuracy_floor("attention"), id="min_test_accuracy-attention"),
    pytest.param(native_roundtrip("mlp", "torch"), id="native_roundtrip-mlp-torch"),
    pytest.param(native_roundtrip("cnn", "tf"), id="native_roundtrip-cnn-tf"),
    pytest.param(native_roundtrip("attention", "jax"), id="native_roundtrip-attention-jax"),
]


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


@pytest.fixture
def workspace(finished_run: FinishedRun) -> Iterator[Workspace]:
    ws = Workspace(finished_run)
    yield ws
    ws.restore()


@pytest.mark.parametrize("side", ["beyond", "inside"])
@pytest.mark.parametrize("perturb", CASES)
def test_validate_judges_the_tolerance(workspace: Workspace, perturb: Perturb, side: Side) -> None:
    pushed = perturb(workspace, side)
    assert pushed, "the case moved no row"
    workspace.remove(REPORT)  # the report read below must be this run's, not a leftover
    result = sh(VALIDATE, workspace.run.root, workspace.run.env, check=False)
    output = f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert (workspace.run.root / REPORT).is_file(), f"validate wrote no report (crashed?):\n{output}"
    report = json.loads((workspace.run.root / REPORT).read_text())
    rows = {key(r): r for r in report["checks"]}
    assert rows.keys() == workspace.run.baseline.keys()
    failed = {k for k, r in rows.items() if not r["passed"]}
    if side == "beyond":
        assert result.returncode != 0, output
        assert report["passed"] is False
        for model, framework, check in pushed:
            assert re.search(rf"^FAILED {re.escape(f'{model}/{framework} {check}')}:", result.stderr, re.M), output
        assert failed == set(pushed), output  # that check and nothing else
    else:
        assert result.returncode == 0, output
        assert report["passed"] is True and not failed
        for k in pushed:
            before, after = workspace.run.baseline[k], rows[k]
            assert (after["max_abs_err"], after["tolerance"]) != (before["max_abs_err"], before["tolerance"]), k
