"""The CPU runs' measured null, as deep as a TPU run's judgement needs it.

The pipeline trains a CPU run's end-of-training replicates for the models its null plan names, and on after its
interim look only where its own tests are undecided (artifacts/null_interim.json). A TPU run's tests against that
CPU run form a Holm family of their own: where the CPU side's replicates are too few for it (a pooled test whose
floor, the smallest p its groups allow, lies above Holm's threshold at its rank: replicate_null.floor_thresholds),
the judge cannot reject and fails the test, naming the cause. `wanted` reads those tests from a judged result;
`train` trains the CPU runs' replicates on, as the replicates_more stage does (until `replicates.parted` have parted
from the run, at most `replicates.at_most` in all), numbered on from the replicates stages', into
artifacts/jax@tpu-null/<framework>/<model>/; tooling/devices/tpu_judge.py reads them after those. The pipeline's
own folders, and so its verdicts, stay as they are.

    python -m tooling.devices.tpu_null wanted RESULT.json      # one line per CPU framework: "<framework> <model> ..."
    python -m pipelines.runner torch -- python -m tooling.devices.tpu_null train torch MODEL ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pipelines import paths
from pipelines.checks.replicate_null import floor_thresholds

NULL_DIR = paths.ARTIFACTS / "jax@tpu-null"


def null_dir(framework: str) -> Path:
    """One CPU framework's replicates trained for a TPU run's judgement (a folder per model)."""
    return NULL_DIR / framework


def wanted(result: dict[str, Any], alpha: float) -> dict[str, list[str]]:
    """Per CPU framework, the models with a test against the TPU run that cannot judge: its floor lies above Holm's
    threshold at the rank that floor would take in the result's family (Ledger.judge_nulls' rule)."""
    tests: dict[str, dict[str, Any]] = {}
    for row in result["checks"]:
        if row.get("null"):
            tests.setdefault(row["null"]["test"], {**row["null"], "model": row["model"],
                                                   "frameworks": row["framework"].split("|")})
    keys = list(tests)
    at_floor = floor_thresholds([tests[k]["p_value"] for k in keys], [tests[k]["floor"] for k in keys], alpha)
    found: dict[str, set[str]] = {}
    for key, threshold in zip(keys, at_floor, strict=True):
        if tests[key]["floor"] > threshold:
            for fw in tests[key]["frameworks"]:
                if "@" not in fw:  # the CPU side: the TPU's own replicates are tpu_train's
                    found.setdefault(fw, set()).add(tests[key]["model"])
    return {fw: sorted(models) for fw, models in sorted(found.items())}


def before(arch: str, fw: str) -> tuple[int, int]:
    """(trained, parted): the replicates the pipeline's replicates stages trained for the CPU run (none where its
    null plan does not name the model)."""
    from rosetta_common.io import read_json

    trained = parted = 0
    for folder in (paths.replicates_run(arch, fw), paths.replicates_more_run(arch, fw)):
        if (folder / paths.REPLICATES_RECORD).exists():
            record = read_json(folder / paths.REPLICATES_RECORD)
            trained, parted = trained + int(record["trained"]), parted + int(record["parted"])
    return trained, parted


def train(argv: list[str]) -> int:
    """In the CPU framework's environment: its run's replicates trained on for each model named (module docstring)."""
    from pipelines import measurements
    from pipelines.stages import IMPORTS_STARTED, framework_stage_args
    from pipelines.stages.common import replicates_stage
    from rosetta_common.io import staged_outputs

    clock = measurements.StageClock("tpu_null", IMPORTS_STARTED)
    fw, models, spec = framework_stage_args(argv, __doc__, "replicates_more")
    with staged_outputs(null_dir(fw)) as out:
        replicates_stage("tpu_null", fw, models, spec, clock, out, spec.replicates.parted,
                         lambda arch: before(arch, fw))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["wanted"] and len(argv) == 2:
        from rosetta_common.spec import load_spec

        alpha = load_spec(paths.PARAMS).tolerances.null_alpha
        for fw, models in wanted(json.loads(Path(argv[1]).read_text()), alpha).items():
            print(fw, *models)
        return 0
    if argv[:1] == ["train"] and len(argv) >= 3:
        return train(argv[1:])
    print("usage: python -m tooling.devices.tpu_null wanted RESULT.json | train FRAMEWORK MODEL [MODEL ...]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
