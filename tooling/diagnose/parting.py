"""Where the trainings of a finished run part, as the validate stage recorded it (reports/validation.json's
"parting", pipelines.checks.replicates.parting_record): for each model with end-of-training replicates, the step at
which each pair of trainings stops being in lockstep (tolerances.lockstep_loss_rel), within each framework (its run
against each replicate, and the replicates among themselves) and across frameworks (the runs pairwise).

    .venv/bin/python -m tooling.diagnose.parting [--validation reports/validation.json] [--models cnn resnet]
                                                 [--json parting.json]

The measured null pools each framework's run with the replicates that parted from it; it is the null it names
only where those part as early as the frameworks' runs do from each other. A replicate that follows its run for
hundreds of steps after the runs of two frameworks parted is a near-copy, and a group of near-copies has almost no
spread: its test then weighs the cross-framework distance against a spread that training from the same point
could not have produced. The last column says, for each framework, how many of its within-framework pairs part
later than the earliest cross-framework pair that involves it. Prints one Markdown table (the report's "Where the
trainings part", every model in one); with --json, also writes every pair's step.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines import paths
from pipelines.report.analysis import parting_rows
from rosetta_common.io import read_json


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| model | framework | run vs its replicates: min / median / max (pairs) | replicates among themselves "
             "| earliest across, with this framework | within-framework pairs parting later |",
             "| --- | --- | --- | --- | --: | --: |"]
    for rec in records:
        for row in parting_rows(rec):
            first = "never" if row["first_across"] is None else row["first_across"]
            lines.append(f"| {rec['model']} | {row['framework']} | {row['run']} | {row['replicates']} | {first} | "
                         f"{row['later']} of {row['pairs']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tooling.diagnose.parting", description=__doc__.split("\n\n")[0])
    parser.add_argument("--validation", type=Path, default=paths.VALIDATION,
                        help="the validate stage's report (default: %(default)s)")
    parser.add_argument("--models", nargs="+", help="models (default: every model it records parting steps for)")
    parser.add_argument("--json", type=Path, help="also write every pair's parting step here")
    args = parser.parse_args(argv)
    try:
        records = read_json(args.validation)["parting"]
        if not isinstance(records, list) or not all(isinstance(r, dict) and "model" in r for r in records):
            raise TypeError("parting: must be a list of records, one per model")
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"error: --validation {args.validation}: unreadable ({type(error).__name__}: {error}); run dvc repro "
              "first", file=sys.stderr)
        return 2
    recorded = [r["model"] for r in records]
    unknown = [m for m in args.models or [] if m not in recorded]
    if unknown:
        print(f"error: --models {' '.join(unknown)}: no parting steps in {args.validation} (a model without "
              f"end-of-training replicates); allowed: {', '.join(recorded) or 'none'}", file=sys.stderr)
        return 2
    chosen = [r for r in records if not args.models or r["model"] in args.models]
    print(table(chosen))
    if args.json:
        args.json.write_text(json.dumps(chosen, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
