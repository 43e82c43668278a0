"""Stage `replicates@<framework>`: the measured null's end-of-training replicates, in that framework's
environment, for the models artifacts/null_plan.json names (those whose runs part beyond a float32 bound).

    python -m pipelines.stages.replicates <framework>

Per named model: replicates 1, 2, ... trained to the end from the init moved by one ulp, each batch's rows in
their own order, until `replicates.parted` have parted from the framework's own run or `replicates.at_most` were
trained (stages.common.replicates); their test figures, predictions and BatchNorm statistics go to
artifacts/replicates/<framework>/<model>/, tied to the run by its step losses' digest. With no model named the
framework is never imported and the folder holds only the plan it followed. A DVC output of its own: editing
validate or the report never retrains them, and a plan that names the same models keeps them cached.
"""

from __future__ import annotations

import time
from typing import Any

from pipelines import measurements, paths
from pipelines.stages import IMPORTS_STARTED, framework_stage_args, stage_main
from pipelines.stages.common import load_jobs, planned_models, rebuilt, replicates, seeded_backend
from rosetta_common.io import read_json, staged_outputs, write_json
from rosetta_common.weights import Weights


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("replicates", IMPORTS_STARTED)
    fw, models, spec = framework_stage_args(argv, __doc__, "replicates")
    clock.stage = f"replicates@{fw}"
    planned = planned_models(models)
    jobs = load_jobs(spec, planned)
    clock.lap("inputs")
    with staged_outputs(paths.replicates_dir(fw)) as out:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "plan.json", {"framework": fw, "models": planned})
        if not jobs:
            print(f"replicates@{fw}: no model parts beyond a float32 bound: none trained", flush=True)
        backend = seeded_backend(fw, spec.seed) if jobs else None
        clock.lap("framework_import")
        for job in jobs:
            where = f"replicates@{fw} {job.arch}"
            own = read_json(paths.train_log(job.arch, fw))["step_losses"]  # train_export checked them
            model = None

            def fit(replicate: int, init: Weights, plan: Any, job: Any = job) -> Any:
                nonlocal model
                model = rebuilt(backend, job, model, init)
                return model, backend.train(model, plan, job.data)

            started = time.time()
            with clock.phase(f"{job.arch}.replicates"):
                replicates(backend, spec, job, job.data, out / job.arch, where, fit, own)
            print(f"{where}: done in {time.time() - started:.1f}s", flush=True)
    measurements.write_stage(clock.record(models=planned))
    return 0


if __name__ == "__main__":
    stage_main(main)
