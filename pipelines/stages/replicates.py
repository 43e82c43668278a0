"""Stage `replicates@<framework>`: the measured null's end-of-training replicates up to the interim look, in that
framework's environment, for the models artifacts/null_plan.json names (those whose runs part beyond a float32
bound).

    python -m pipelines.stages.replicates <framework>

Per named model: replicates 1, 2, ... trained to the end from the init moved by one ulp, each batch's rows in
their own order, until `replicates.first` have parted from the framework's own run or `replicates.at_most` were
trained (stages.common.replicates); their test figures, predictions and BatchNorm statistics go to
artifacts/replicates/<framework>/<model>/, tied to the run by its step losses' digest. The null_interim stage
then tests them; replicates_more@<framework> adds the rest where that test is undecided. With no model named
the framework is never imported and the folder holds only the plan it followed. A DVC output of its own: editing
validate or the report never retrains them, and a plan that names the same models keeps them cached.
"""

from __future__ import annotations

from pipelines import measurements, paths
from pipelines.stages import IMPORTS_STARTED, framework_stage_args, stage_main
from pipelines.stages.common import planned_models, replicates_stage
from rosetta_common.io import staged_outputs


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("replicates", IMPORTS_STARTED)
    fw, models, spec = framework_stage_args(argv, __doc__, "replicates")
    clock.stage = f"replicates@{fw}"
    planned = planned_models(models)
    with staged_outputs(paths.replicates_dir(fw)) as out:
        replicates_stage("replicates", fw, planned, spec, clock, out, spec.replicates.first, lambda arch: (0, 0))
    measurements.write_stage(clock.record(models=planned))
    return 0


if __name__ == "__main__":
    stage_main(main)
