"""What DVC reads from the report stage: headline metrics (`dvc metrics show`) and plot data
(`dvc plots show`, declared in dvc.yaml's top-level `plots:`): one loss CSV per model and framework, so a
plot overlays the three frameworks' files, and one latency CSV."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from pipelines.report.analysis import Verdict, forward_parity, latency_rows
from pipelines.report.collect import Inputs

PLOTS = Path("reports/plots")
SUMMARY = Path("reports/summary.json")


def loss_csv_path(model: str, framework: str) -> Path:
    return Path("loss") / model / f"{framework}.csv"


def _csv(header: list[str], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def plot_files(inputs: Inputs) -> dict[Path, str]:
    """Relative path under reports/plots -> CSV text."""
    files = {}
    for (model, fw), run in inputs.runs.items():
        log = run.train_log or {}
        per_epoch = int(log.get("steps_per_epoch") or 0) or None
        rows = [
            [step, loss, (step - 1) // per_epoch + 1 if per_epoch else ""]
            for step, loss in enumerate(log.get("step_losses", []), start=1)
        ]
        files[loss_csv_path(model, fw)] = _csv(["step", "loss", "epoch"], rows)
    ratios, medians = [], []
    for model in inputs.models:
        for row in latency_rows(inputs, model):
            case = f"{model} {row['framework']} b{row['batch']}"
            ratios.append([case, model, row["framework"], row["batch"], row["native_median_ms"],
                           row["onnx_median_ms"], row["native_over_onnx"]])
            # One bar per runtime: DVC's bar templates take one x field per file.
            for runtime, key in (("native", "native_median_ms"), ("onnxruntime", "onnx_median_ms")):
                medians.append([f"{case} {runtime}", model, row["framework"], row["batch"], runtime, row[key]])
    files[Path("latency.csv")] = _csv(
        ["case", "model", "framework", "batch", "native_ms", "onnx_ms", "native_over_onnx"], ratios
    )
    files[Path("latency_ms.csv")] = _csv(["case", "model", "framework", "batch", "runtime", "median_ms"], medians)
    return files


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def summary(inputs: Inputs, judged: Verdict) -> dict[str, Any]:
    """Headline figures not already in metrics/<model>/<framework>.json (accuracy, losses and training speed
    are there): the verdict, the worst forward parity, ONNX size and latency ratios. Nested
    model -> framework -> figure; DVC flattens them into columns."""
    out: dict[str, Any] = {
        "validation": {"passed": judged.status == "passed", "checks": judged.checks, "failed": len(judged.failures)},
    }
    for model in inputs.models:
        matrix = forward_parity(inputs, model)
        finite = [v for row in matrix.values for v in row if math.isfinite(v)]
        per_model: dict[str, Any] = {}
        if finite:
            # As a multiple of its tolerance too: DVC prints 5 decimals, which shows 2e-06 as 0.0.
            per_model["forward_parity_max_abs"] = max(finite)
            per_model["forward_parity_max_over_tolerance"] = max(finite) / matrix.tolerance
        for fw in inputs.frameworks:
            run = inputs.run(model, fw)
            onnx = run.onnx.get("model.onnx")
            figures: dict[str, Any] = {}
            if onnx:
                figures |= {"onnx_kib": onnx.bytes / 1024, "onnx_nodes": onnx.nodes}
            for result in (run.latency or {}).get("results", []):
                figures[f"latency_native_over_onnx_b{result['batch']}"] = result.get("native_over_onnx")
            per_model[fw] = {k: _finite(v) for k, v in figures.items() if v is not None}
        out[model] = per_model
    return out
