"""Stage `train_dp@<framework>`: the models of `data_parallel.models` trained on `data_parallel.workers` workers of
the framework's own distributed engine, from the same init and batches as train_export; the validate stage
judges each run against the same framework's single-process run and against the other frameworks'.

    python -m pipelines.stages.train_dp <framework> [--worker pipelines.stages.train_dp_worker]

Runs in the orchestrator's environment: it starts the workers (pipelines/workers.py) as processes of the
framework's environment (ROSETTA_RUNTIME=local) or as containers on a network made for the run (container),
watches them, and publishes artifacts/data_parallel/<framework>/ only when every worker succeeded. With
`data_parallel.workers: 1` (the default: off) it publishes an empty folder and starts no framework.
"""

from __future__ import annotations

import argparse
import os
import shutil
import uuid

from pipelines import measurements, paths, resources, workers
from pipelines.environments import thread_environment
from pipelines.stages import StageError, stage_main
from pipelines.stages.common import DP_OUT_VARIABLE
from rosetta_common.interface import BACKEND_MODULES
from rosetta_common.io import staged_outputs, write_json
from rosetta_common.spec import load_spec


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=list(BACKEND_MODULES))
    # dvc.yaml names the worker's module in the command, so that the stage's command says every module it runs.
    parser.add_argument("--worker", default=workers.WORKER_MODULE, help="the module each worker runs")
    args = parser.parse_args(argv)
    fw = args.framework
    spec = load_spec(paths.PARAMS)  # validated: workers divide the batch, models are known and BatchNorm-free
    dp = spec.data_parallel
    where = f"train_dp@{fw}"
    if fw not in spec.frameworks:
        raise StageError(f"params.yaml: frameworks = {spec.frameworks}: does not list {fw!r}")
    runtime = os.environ.get("ROSETTA_RUNTIME", "local")
    with staged_outputs(paths.data_parallel_dir(fw)) as out:
        if dp.workers == 1:
            write_json(out / "off.json", {"workers": 1, "why": "data_parallel.workers is 1: no data-parallel run "
                                          "(-S data_parallel.workers=2 switches it on)"})
            print(f"{where}: off (data_parallel.workers: 1)", flush=True)
            return 0
        out.mkdir(exist_ok=True)
        # Each worker gets its share of the cores (ROSETTA_THREADS, default 2, is the whole stage's).
        threads = max(1, int(thread_environment(os.environ)["ROSETTA_THREADS"]) // dp.workers)
        env = {**thread_environment({**os.environ, "ROSETTA_THREADS": str(threads)}),
               DP_OUT_VARIABLE: str(out.resolve())}
        print(f"{where}: {dp.workers} workers ({runtime}), {threads} thread(s) each: {', '.join(dp.models)}",
              flush=True)
        shutil.rmtree(measurements.worker_resources_dir(where), ignore_errors=True)  # a former run's records
        if runtime == "container":
            started, cleanup = workers.start_containers(fw, dp.workers, dp.timeout_seconds, env,
                                                        uuid.uuid4().hex[:8], module=args.worker)
        else:
            started, cleanup = workers.start_local(fw, dp.workers, dp.port, dp.timeout_seconds, env,
                                                   module=args.worker), []
        for worker in started:
            print(f"{where}: started {worker.name}", flush=True)
        try:
            workers.watch(started, where)
        finally:
            if cleanup:
                workers.run_quietly(cleanup)
        # Each worker probed itself from its engine's start to its last model (pipelines/resources.py).
        probed = measurements.gather_worker_resources(
            where, f"{dp.workers} data-parallel workers ({runtime}): {', '.join(dp.models)}")
        for name, record in probed.items():
            print(f"{where}: {name}: {resources.describe(record)}", flush=True)
        missing = [arch for arch in dp.models if not (out / arch / "trained.safetensors").is_file()]
        if missing:
            raise StageError(f"{where}: rank 0 wrote no run for {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    stage_main(main)
