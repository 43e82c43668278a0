"""Stage `report`: the artifact comparison report, reports/report.html (one self-contained file that opens
offline) and reports/report.md (the same tables), plus what DVC shows: reports/summary/<model>.json (headline
metrics) and reports/plots/ (loss curves per model and framework, latency).

Runs in the orchestrator environment and reads files only: no framework, no ONNX Runtime. A failed check
does not fail this stage (the validate stage does that); the report says which failed and by how much. After
a failed validate, `dvc repro --single-item report` (or `python -m pipelines.stages.report`) reports it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pipelines.environments import envs_dir
from pipelines.report import dvc_files
from pipelines.report.analysis import Verdict, verdict
from pipelines.report.collect import collect
from pipelines.report.render import context, render
from pipelines.stages import stage_main
from rosetta_common.io import atomic_path, write_text


def _write_folder(folder: Path, files: dict[Path, str]) -> None:
    with atomic_path(folder) as tmp:  # the whole folder at once: no stale file (a dropped model's) survives
        tmp.mkdir()
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)


def build(root: Path, out: Path, environments: Path | None, variant: str = "cpu") -> Verdict:
    """Write every output of the stage under `out` (reports/ of `root` in the pipeline); returns the verdict."""
    inputs = collect(root)
    ctx = context(inputs, environments, variant)
    write_text(out / "report.html", render(ctx, "html"))
    write_text(out / "report.md", render(ctx, "md"))
    summaries = {rel: json.dumps(data, indent=2) + "\n" for rel, data in dvc_files.summaries(inputs).items()}
    _write_folder(out / dvc_files.SUMMARY.name, summaries)
    _write_folder(out / dvc_files.PLOTS.name, dvc_files.plot_files(inputs))
    return verdict(inputs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root holding the artifacts")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <root>/reports)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = args.out or args.root / "reports"
    judged = build(args.root, out, envs_dir(), os.environ.get("ROSETTA_VARIANT", "cpu"))
    print(f"report: {out / 'report.html'} and report.md in {time.perf_counter() - start:.1f}s ({judged.headline})")
    return 0


if __name__ == "__main__":
    stage_main(main)
