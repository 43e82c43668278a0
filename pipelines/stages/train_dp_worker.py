"""One worker of stage `train_dp@<framework>`: trains every model of `data_parallel.models` data-parallel on the
framework's own engine, from the same init and plan as train_export, and the end-of-training replicates of those
artifacts/null_plan.json names; rank 0 writes each model's run folder.

    python -m pipelines.stages.train_dp_worker <framework>

Who the worker is comes from the variables of the framework's own launcher (rosetta_common.distributed), so
pipelines/workers.py, `torchrun`, or a hand-made TF_CONFIG on another host start the same program. Rank 0
writes into ROSETTA_DP_OUT (the launcher's scratch folder, published only if every worker succeeds) or, started
by hand, publishes artifacts/data_parallel/<framework>/ itself when it is done.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import nullcontext
from pathlib import Path

from pipelines import measurements, paths, resources
from pipelines.stages import IMPORTS_STARTED, check_environment, stage_main
from pipelines.stages.common import (
    DP_OUT_VARIABLE,
    load_jobs,
    planned_models,
    record_training,
    replicates,
    seeded_backend,
    steady_samples_per_second,
)
from rosetta_common.distributed import Cluster
from rosetta_common.interface import BACKEND_MODULES
from rosetta_common.io import staged_outputs
from rosetta_common.spec import load_spec


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=list(BACKEND_MODULES))
    fw = parser.parse_args(argv).framework
    check_environment("train_dp_worker", fw)  # before the framework is imported or anything is written
    clock = measurements.StageClock(f"train_dp@{fw}", IMPORTS_STARTED)
    spec = load_spec(paths.PARAMS)
    cluster = Cluster.from_environment(fw)
    jobs = load_jobs(spec, list(spec.data_parallel.models))
    planned = planned_models(list(spec.data_parallel.models))  # those whose pairs need the null
    backend = seeded_backend(fw, spec.seed)
    clock.lap("framework_import")
    backend.start_worker(cluster)
    clock.lap("engine_start")
    probe = resources.Probe(os.getpid()).start()  # the engine is up: from here on a steady worker stays flat
    given = os.environ.get(DP_OUT_VARIABLE)
    publish = nullcontext(Path(given)) if given else staged_outputs(paths.data_parallel_dir(fw))
    with publish if cluster.is_chief else nullcontext(None) as out:
        for job in jobs:
            where = f"train_dp@{fw} {job.arch} (rank {cluster.rank} of {cluster.world})"
            backend.configure(spec.seed)
            started = time.time()
            with clock.phase(f"{job.arch}.train"):
                model, result = backend.train_data_parallel(job.config, job.init, job.plan, job.data, cluster)
            run = None if out is None else out / job.arch
            if run is not None:
                run.mkdir(parents=True)
                record_training(backend, job, model, result, job.data, run, where, workers=cluster.world,
                                engine=result.engine)
            # For a model the null plan names, its replicates, each trained data-parallel by every worker (rank 0
            # records them): the null that judges this run against its single-process run once the two part,
            # by the rule two frameworks' runs are judged by, with `parted` of them at once (no interim look).
            if job.arch in planned:
                with clock.phase(f"{job.arch}.replicates"):
                    replicates(backend, spec, job, job.data, run, where,
                               lambda _, init, plan, job=job: backend.train_data_parallel(job.config, init, plan,
                                                                                          job.data, cluster),
                               result.step_losses, spec.replicates.parted, group=f"{fw}-dp")
            if run is None:
                continue
            measurements.write(job.arch, f"{fw}-dp", {
                "framework": fw, "model": job.arch, "stage": f"train_dp@{fw}", "workers": cluster.world,
                "train": {"train_seconds": result.train_seconds, "epoch_seconds": result.epoch_seconds,
                          "steady_samples_per_second": steady_samples_per_second(result, job)},
                "model_seconds": time.time() - started,
            })
            print(f"train_dp: {fw}/{job.arch} on {cluster.world} workers -> {run}", flush=True)
    record = resources.summarize(probe.stop())
    backend.stop_worker()
    measurements.write_worker_resources(f"train_dp@{fw}", cluster.rank, record)
    if cluster.is_chief:
        measurements.write_stage(clock.record(models=[job.arch for job in jobs], workers=cluster.world))
    return 0


if __name__ == "__main__":
    stage_main(main)
