"""What DVC reads from the report stage: headline metrics (`dvc metrics show`) and plot data
(`dvc plots show`, declared in dvc.yaml's top-level `plots:`): one loss CSV per model and framework, so a
plot overlays the three frameworks' files, and one latency CSV.

`dvc metrics show` prints one row per metrics file and one column per (flattened, dot-joined) key of any file,
so the headline figures are one small file per model, reports/summary/<model>.json: models add rows, never
columns. Everything else (every check, every latency) is in the report and reports/validation.json."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from pipelines import paths
from pipelines.report.analysis import check_rows, latency_rows
from pipelines.report.collect import Inputs

PLOTS = paths.PLOTS
SUMMARY = paths.SUMMARY
# Summary figure -> the validation checks whose worst value it is, as a multiple of each one's tolerance: DVC
# prints 5 decimals (a relative error of 2e-08 would show as 0.0), and "0.02 of its tolerance" reads at a glance.
WORST = {
    "worst_forward_parity_over_tol": ("forward_parity_init_onnx", "init_onnx_vs_reference"),
    "worst_step1_loss_over_tol": ("train_step1_loss_rel",),
    "worst_test_loss_over_tol": ("test_loss_rel",),
}
HEADLINE = ("test_accuracy", "test_loss")  # per framework, from metrics/<model>/<framework>.json


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


def _worst(rows: list[dict[str, Any]], checks: tuple[str, ...]) -> float | None:
    ratios = [
        float(r["max_abs_err"]) / float(r["tolerance"])
        for r in rows
        if r.get("check") in checks and r.get("max_abs_err") is not None and r.get("tolerance")
    ]
    return _finite(max(ratios)) if ratios else None


def model_summary(inputs: Inputs, model: str) -> dict[str, Any]:
    """One model's headline figures: each framework's test accuracy and loss, the worst parity figures (as
    multiples of their tolerances), how many of its checks failed and whether all passed. At most 12 leaves."""
    out: dict[str, Any] = {}
    for fw in inputs.frameworks:
        metrics = inputs.run(model, fw).metrics or {}
        out[fw] = {key: _finite(metrics.get(key)) for key in HEADLINE}
    rows = check_rows(inputs, model)
    for key, checks in WORST.items():
        out[key] = _worst(rows, checks)
    validated = bool(inputs.validation and "checks" in inputs.validation)
    failed = sum(not r.get("passed") for r in rows)
    out["failed_checks"] = failed if validated else None
    out["passed"] = validated and bool(rows) and failed == 0
    return out


def summaries(inputs: Inputs) -> dict[Path, dict[str, Any]]:
    """File name under reports/summary -> its content, one per model."""
    return {paths.summary(model).relative_to(SUMMARY): model_summary(inputs, model) for model in inputs.models}
