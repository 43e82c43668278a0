"""Where the trainings of a finished run part: for each model with end-of-training replicates, the step at which
each pair of trainings stops being in lockstep (rosetta_common.metrics.parting_step at tolerances.lockstep_loss_rel,
the validate stage's own rule), within each framework (its run against each replicate, and the replicates among
themselves) and across frameworks (the runs pairwise).

    .venv/bin/python -m tooling.diagnose.parting [--models cnn resnet] [--json parting.json]

The measured null pools each framework's run with the replicates that parted from it; it is the null it names
only where those part as early as the frameworks' runs do from each other. A replicate that follows its run for
hundreds of steps after the runs of two frameworks parted is a near-copy, and a group of near-copies has almost no
spread: its test then weighs the cross-framework distance against a spread that training from the same point
could not have produced. The last column says, for each framework, how many of its within-framework pairs part
later than the earliest cross-framework pair that involves it. Reads the run in the current folder (params.yaml,
artifacts/); prints one Markdown table; with --json, also writes every pair's step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines import paths
from rosetta_common.io import read_json
from rosetta_common.metrics import parting_step
from rosetta_common.registry import SpecError
from rosetta_common.spec import load_spec


def replicate_losses(model: str, framework: str) -> list[list[float]]:
    """Every end-of-training replicate's step losses, the replicates stage's then replicates_more's, in order."""
    losses = []
    for folder in (paths.replicates_run(model, framework), paths.replicates_more_run(model, framework)):
        record = folder / paths.REPLICATES_RECORD
        if record.is_file():
            losses += [[float(x) for x in r["step_losses"]] for r in read_json(record)["replicates"]]
    return losses


def pairs(model: str, frameworks: Sequence[str], tolerance: float) -> dict[str, Any]:
    """Every pair's parting step (None: in lockstep to the end): within each framework, its run against each
    replicate and each two replicates; across frameworks, the runs."""
    runs = {fw: read_json(paths.train_log(model, fw))["step_losses"] for fw in frameworks}
    within: dict[str, dict[str, list[int | None]]] = {}
    for fw in frameworks:
        reps = replicate_losses(model, fw)
        within[fw] = {"run": [parting_step(runs[fw], r, tolerance) for r in reps],
                      "replicates": [parting_step(a, b, tolerance) for a, b in itertools.combinations(reps, 2)]}
    across = {f"{a}|{b}": parting_step(runs[a], runs[b], tolerance) for a, b in itertools.combinations(frameworks, 2)}
    return {"model": model, "steps": len(next(iter(runs.values()))), "within": within, "across": across}


def spread(steps: list[int | None], total: int) -> str:
    """min / median / max of the steps at which pairs part (a pair that never parts counts as after the last
    step, `total`), and how many pairs; "-" for none."""
    if not steps:
        return "-"
    at = [total + 1 if s is None else s for s in steps]
    word = lambda s: "never" if s > total else str(int(s))  # noqa: E731
    return f"{word(min(at))} / {word(statistics.median(at))} / {word(max(at))} ({len(at)})"


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| model | framework | run vs its replicates: min / median / max (pairs) | replicates among themselves "
             "| earliest across, with this framework | within-framework pairs parting later |",
             "| --- | --- | --- | --- | --: | --: |"]
    for rec in records:
        total = rec["steps"]
        for fw, mine in rec["within"].items():
            across = [s for pair, s in rec["across"].items() if fw in pair.split("|") and s is not None]
            first = min(across) if across else None
            steps = mine["run"] + mine["replicates"]
            later = sum(1 for s in steps if first is not None and (s is None or s > first))
            lines.append(f"| {rec['model']} | {fw} | {spread(mine['run'], total)} | "
                         f"{spread(mine['replicates'], total)} | {'never' if first is None else first} | "
                         f"{later} of {len(steps)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tooling.diagnose.parting", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", help="models (default: every model params.yaml names that has "
                                                    "end-of-training replicates in artifacts/replicates)")
    parser.add_argument("--json", type=Path, help="also write every pair's parting step here")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(paths.PARAMS)
    except (OSError, SpecError) as error:
        print(f"error: {paths.PARAMS}: {error}", file=sys.stderr)
        return 2
    frameworks = list(spec.frameworks)
    with_replicates = [m for m in spec.models if any(replicate_losses(m, fw) for fw in frameworks)]
    unknown = [m for m in args.models or [] if m not in with_replicates]
    if unknown:
        print(f"error: --models {' '.join(unknown)}: no end-of-training replicates in {paths.ARTIFACTS}; allowed: "
              f"{', '.join(with_replicates) or 'none (run dvc repro first)'}", file=sys.stderr)
        return 2
    try:
        records = [pairs(m, frameworks, spec.tolerances.lockstep_loss_rel) for m in args.models or with_replicates]
    except (OSError, KeyError, ValueError) as error:
        print(f"error: {paths.ARTIFACTS}: unreadable ({type(error).__name__}: {error}); run dvc repro first",
              file=sys.stderr)
        return 2
    print(table(records))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
