"""Stage `report`: the artifact comparison report, one folder reports/comparison/ published at once: report.html
(one file that opens offline), report.md (the same tables), summary/<model>.json (headline metrics, for
`dvc metrics show`) and plots/ (loss curves, one CSV per model, for `dvc plots show`).

Runs in the orchestrator environment and reads files only: no framework, no ONNX Runtime, and never
measurements/ (timings: not lineage, no dependency of this stage; it only writes its own timing record there).
Everything it writes is a pure function of its inputs, byte for byte; report.html shows the measurements of this
run by loading ../../measurements/timings.js in the browser. A failed check does not fail this stage (the
validate stage does that); the report says which failed and by how much. After a failed validate,
`dvc repro --single-item report` (or `python -m pipelines.stages.report`) reports it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pipelines import measurements, paths
from pipelines.report import dvc_files
from pipelines.report.analysis import Verdict, verdict
from pipelines.report.collect import collect
from pipelines.report.render import context, render
from pipelines.stages import IMPORTS_STARTED, stage_main
from rosetta_common.io import dumps, staged_outputs


def files(root: Path, variant: str = "cpu") -> tuple[dict[Path, str], Verdict]:
    """Every file of the report folder (path relative to it -> text) built from `root`'s inputs, and the verdict."""
    inputs = collect(root)
    ctx = context(inputs, variant)
    out = {Path("report.html"): render(ctx, "html"), Path("report.md"): render(ctx, "md")}
    summary, plots = paths.SUMMARY.relative_to(paths.REPORT), paths.PLOTS.relative_to(paths.REPORT)
    out |= {summary / rel: dumps(data) for rel, data in dvc_files.summaries(inputs).items()}
    out |= {plots / rel: text for rel, text in dvc_files.plot_files(inputs).items()}
    return out, verdict(inputs)


def build(root: Path, out: Path | None = None, variant: str = "cpu") -> Verdict:
    """Build the report folder from `root`'s inputs and publish it at `out` (default: <root>/reports/comparison)
    in one step: a failure leaves the previous folder, and no stale file (a dropped model's) survives."""
    built, judged = files(root, variant)
    with staged_outputs(out or root / paths.REPORT) as staged:
        for rel, text in sorted(built.items()):
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            with open(staged / rel, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
    return judged


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("report", IMPORTS_STARTED)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root holding the artifacts")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder (default: <root>/{paths.REPORT})")
    args = parser.parse_args(argv)
    out = args.out or args.root / paths.REPORT
    judged = build(args.root, out, os.environ.get("ROSETTA_VARIANT", "cpu"))
    clock.lap("build")
    measurements.write_stage(clock.record(), args.root / measurements.ROOT)
    print(f"report: {out}/ (report.html, report.md, summary/, plots/): {judged.headline}")
    return 0


if __name__ == "__main__":
    stage_main(main)
