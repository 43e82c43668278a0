"""What DVC reads from the report stage: headline metrics (`dvc metrics show`) and plot data (`dvc plots show`).

Plots: one loss CSV per model, plots/loss/<model>.csv with columns step,<framework>... (step losses, a column per
framework), so one plot definition over the folder in dvc.yaml draws every model, whatever their number, with
the frameworks overlaid. Latency is a measurement, not lineage: measurements/latency.csv, never here.

`dvc metrics show` prints one row per metrics file and one column per (flattened, dot-joined) key of any file,
so the headline figures are one small file per model, summary/<model>.json: models add rows, never columns.
It holds at most 10 keys (each framework's test accuracy and loss, three worst parity figures, the verdict),
so that with measurements/metrics/<model>-<framework>.json (train_seconds, steady_samples_per_second) the table
stays within 12 columns. Everything else (every check) is in the report and reports/validation.json."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from pipelines import paths
from pipelines.checks import ledger
from pipelines.report.analysis import check_rows, quality
from pipelines.report.collect import Inputs

PLOTS = paths.PLOTS
SUMMARY = paths.SUMMARY
# Summary figure -> the validation checks whose worst value it is, as a multiple of each one's tolerance: DVC
# prints 5 decimals (a relative error of 2e-08 would show as 0.0), and "0.02 of its tolerance" reads at a glance.
# A row the measured null judged (runs that parted) is left out: its tolerance is not what judged it, and its
# statistic, p-value and Holm threshold are in the report and reports/validation.json.
WORST = {
    "worst_forward_parity_over_tol": (ledger.FORWARD_PARITY_INIT_ONNX, ledger.INIT_ONNX_VS_REFERENCE),
    "worst_step1_loss_over_tol": (ledger.TRAIN_STEP1_LOSS_REL,),
    "worst_test_loss_over_tol": (ledger.TEST_LOSS_REL,),
}


def loss_csv_path(model: str) -> Path:
    """Relative to the plots folder."""
    return Path("loss") / f"{model}.csv"


def _csv(header: list[str], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def plot_files(inputs: Inputs) -> dict[Path, str]:
    """Relative path under the plots folder -> CSV text: per model, step and each framework's step loss (an
    empty cell where a framework has no loss for that step)."""
    files = {}
    for model in inputs.models:
        losses = {fw: (inputs.run(model, fw).train_log or {}).get("step_losses") or [] for fw in inputs.frameworks}
        steps = max((len(v) for v in losses.values()), default=0)
        rows = [
            [step, *(_number(v[step - 1]) if step <= len(v) else "" for v in losses.values())]
            for step in range(1, steps + 1)
        ]
        files[loss_csv_path(model)] = _csv(["step", *inputs.frameworks], rows)
    return files


def _number(value: Any) -> str:
    """Full precision, one spelling (repr of the float64), so the CSV's bytes follow the losses' values alone."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    return repr(number) if math.isfinite(number) else ""


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _worst(rows: list[dict[str, Any]], checks: tuple[str, ...]) -> float | None:
    ratios = [
        float(r["value"]) / float(r["tolerance"])
        for r in rows
        if r.get("check") in checks and r.get("value") is not None and r.get("tolerance") and not r.get("null")
    ]
    return _finite(max(ratios)) if ratios else None


def model_summary(inputs: Inputs, model: str) -> dict[str, Any]:
    """One model's headline figures: each framework's test accuracy and loss, the worst parity figures (as
    multiples of their tolerances) and whether every check of the model passed. At most 10 leaves."""
    out: dict[str, Any] = {}
    for fw in inputs.frameworks:
        out[fw] = {key: _finite(value) for key, value in quality(inputs, model, fw).items()}
    rows = check_rows(inputs, model)
    for key, checks in WORST.items():
        out[key] = _worst(rows, checks)
    validated = bool(inputs.validation and "checks" in inputs.validation)
    out["passed"] = validated and bool(rows) and all(r.get("passed") for r in rows)
    return out


def summaries(inputs: Inputs) -> dict[Path, dict[str, Any]]:
    """File name under the summary folder -> its content, one per model."""
    return {paths.summary(model).relative_to(SUMMARY): model_summary(inputs, model) for model in inputs.models}
