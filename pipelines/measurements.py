"""Measurements of this run: timings, throughputs, latencies. Kept out of the lineage on purpose.

They depend on the machine and its load, so they can never repeat bit for bit; inside a DVC output they would
change every hash downstream. Stages write them under `measurements/` (git- and DVC-ignored, never a stage's
dependency or output). `dvc metrics show` and `dvc plots show` still show them (top-level `metrics:` and
`plots:` in dvc.yaml), and the report page shows them, marked as this run's, by loading `timings.js`.

Each writer regenerates the aggregate files (`timings.js`, `latency.csv`, `metrics/*.json`) from every
record present, so they are current whichever stage ran last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rosetta_common.io import dumps, write_text

ROOT = Path("measurements")
TIMINGS_JS = ROOT / "timings.js"  # loaded by reports/comparison/report.html as ../../measurements/timings.js
LATENCY_CSV = ROOT / "latency.csv"  # for `dvc plots show`
METRICS = ROOT / "metrics"  # one flat file per model and framework, for `dvc metrics show`


def record_path(model: str, framework: str, root: Path = ROOT) -> Path:
    return root / model / f"{framework}.json"


def read_all(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """"<model>/<framework>" -> its record, for every readable record under `root`."""
    records = {}
    for path in sorted(root.glob("*/*.json")):
        if path.parent.name == METRICS.name:
            continue  # the flat files written below, not records
        try:
            records[f"{path.parent.name}/{path.stem}"] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a record being rewritten by a killed stage: the next writer replaces it
    return records


def headline(record: dict[str, Any]) -> dict[str, float]:
    """The few figures `dvc metrics show` prints for one run (few columns: the table stays readable)."""
    train = record.get("train", {})
    return {key: round(float(train[key]), 3) for key in ("train_seconds", "steady_samples_per_second") if key in train}


def write(model: str, framework: str, record: dict[str, Any], root: Path = ROOT) -> None:
    """Write one stage's measurements, then regenerate the aggregates from every record present."""
    write_text(record_path(model, framework, root), dumps(record))
    records = read_all(root)
    write_text(root / TIMINGS_JS.name, "window.ROSETTA_MEASUREMENTS = " + json.dumps(records, sort_keys=True) + ";\n")
    rows = ["case,native_over_onnx,native_ms,onnx_ms"]
    for key, rec in records.items():
        for r in rec.get("latency", {}).get("results", []):
            rows.append(f"{key}/batch {r['batch']},{r['native_over_onnx']:.4g},{r['native_median_ms']:.4g},"
                        f"{r['onnx_median_ms']:.4g}")
    write_text(root / LATENCY_CSV.name, "\n".join(rows) + "\n")
    for key, rec in records.items():
        write_text(root / METRICS.name / f"{key.replace('/', '-')}.json", dumps(headline(rec)))
