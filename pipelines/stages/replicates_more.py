"""Stage `replicates_more@<framework>`: the measured null's replicates after the interim look, for the models
artifacts/null_interim.json names (those whose interim test is undecided), in that framework's environment.

    python -m pipelines.stages.replicates_more <framework>

Per named model: replicates numbered on from the replicates stage's (artifacts/replicates/<framework>/<model>/),
trained until `replicates.parted` have parted from the framework's own run, counting those, or
`replicates.at_most` were trained in all; into artifacts/replicates_more/<framework>/<model>/, which validate
reads after the first ones. A model the interim look accepted trains none; with no model named the framework is
never imported.
"""

from __future__ import annotations

from pipelines import measurements, paths
from pipelines.stages import IMPORTS_STARTED, framework_stage_args, stage_main
from pipelines.stages.common import interim_continued, replicates_stage
from rosetta_common.io import read_json, staged_outputs


def before(arch: str, fw: str) -> tuple[int, int]:
    """(trained, parted): the replicates the replicates stage trained for the model."""
    record = read_json(paths.replicates_run(arch, fw) / paths.REPLICATES_RECORD)
    return int(record["trained"]), int(record["parted"])


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("replicates_more", IMPORTS_STARTED)
    fw, models, spec = framework_stage_args(argv, __doc__, "replicates_more")
    clock.stage = f"replicates_more@{fw}"
    more = interim_continued(models)
    with staged_outputs(paths.replicates_more_dir(fw)) as out:
        replicates_stage("replicates_more", fw, more, spec, clock, out, spec.replicates.parted,
                         lambda arch: before(arch, fw))
    measurements.write_stage(clock.record(models=more))
    return 0


if __name__ == "__main__":
    stage_main(main)
