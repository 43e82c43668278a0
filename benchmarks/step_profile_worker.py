"""The in-framework half of benchmarks/step_profile.py: one process of one framework's environment trains each
model with our train() and, asked to, records its second epoch with the framework's profiler.

    python -m pipelines.runner tf -- python -m benchmarks.step_profile_worker JOB.json RESULT.json

The job's `environment` is applied before the framework is imported (TF reads TF_ENABLE_ONEDNN_OPTS once, at
import; the runner sets it to 0), and the process runs on ROSETTA_THREADS of its CPUs (the one way to size XLA's
pool), so one setting is one process. The profiler starts in a StepHook at the end of epoch 1 (compilation done)
and stops at the end of epoch 2: the window holds that epoch's steps and the loop around them. The epochs after it
run unrecorded, so the profiler's own cost is the recorded epoch against them. Only raw figures go to RESULT.json;
the parent summarizes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cpus import hold_to_thread_count
from benchmarks.profilers import OpTime, compiled_kinds, kind_of
from benchmarks.train_throughput_worker import subset
from rosetta_common.data import load_for
from rosetta_common.interface import load_backend
from rosetta_common.spec import load_spec
from rosetta_common.training import StepHook, plan
from rosetta_common.weights import init_weights

TOP_OPS = 40  # the longest operations kept per model (every one counts in the totals by kind)


def annotated(ops: list[OpTime], kinds: dict[tuple[str, str], tuple[str, str]]) -> dict[str, Any]:
    """Seconds by kind (control flow left out: its run holds its body's) and the longest operations."""
    by_kind: dict[str, float] = {}
    rows = []
    for op in ops:
        kind, source = kind_of(op, kinds)
        by_kind[kind] = by_kind.get(kind, 0.0) + op.seconds
        if kind != "control flow" and len(rows) < TOP_OPS:
            rows.append({**dataclasses.asdict(op), "kind": kind, "source": source})
    by_kind.pop("control flow", None)
    return {"seconds_by_kind": by_kind, "ops": rows}


def run_model(backend: Any, profiler: Any, spec: Any, case: dict[str, Any], epochs: int, dump: Path | None
              ) -> dict[str, Any]:
    """Train `case`'s model for `epochs`; with a profiler, epoch 2 recorded (its compiled programs read from `dump`)."""
    record = profiler is not None
    data = subset(load_for(case["model"], case["data"]), case.get("train_samples"))
    config = data.model_config(spec, case["model"])
    train_plan = dataclasses.replace(plan(spec, case["model"], len(data.train_labels)), epochs=epochs)
    steps = train_plan.steps_per_epoch
    window: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rosetta-profile-") as folder:

        def at(step: int, model: Any) -> None:  # the end of epoch 1 starts the record, the end of epoch 2 stops it
            profiler.sync(model)
            if step == steps:
                profiler.start(Path(folder))
                window["started"] = time.perf_counter()
            else:
                window["seconds"] = time.perf_counter() - window.pop("started")
                window["ops"] = profiler.stop(Path(folder))

        hook = StepHook((steps, 2 * steps), at) if record else None
        result = backend.train(backend.build(config, init_weights(config, spec.seed)), train_plan, data, hook)
    if record:
        window.update(annotated(window.pop("ops"), compiled_kinds(dump)))
    print(f"  {backend.FRAMEWORK} {case['model']}{' (profiled)' if record else ''}: epochs "
          f"{', '.join(f'{s:.2f}' for s in result.epoch_seconds)} s", file=sys.stderr, flush=True)
    return {**case, "steps_per_epoch": steps, "batch_size": train_plan.batch_size,
            "train_samples": len(data.train_labels), "epoch_seconds": result.epoch_seconds, "window": window}


def main(argv: list[str]) -> int:
    job_path, result_path = (Path(a) for a in argv)
    job = json.loads(job_path.read_text())
    os.environ.update(job["environment"])
    hold_to_thread_count()  # before the framework starts its pools
    dump = Path(job["dump"]) if job["record"] else None
    if dump:  # XLA's optimized programs as text: what each compiled instruction holds (compiled_kinds)
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump} --xla_dump_hlo_as_text"
    framework = job["framework"]
    spec = load_spec(job["params"])
    backend = load_backend(framework)
    backend.configure(spec.seed)  # deterministic mode, as in the pipeline
    profiler = importlib.import_module(f"benchmarks.profilers.{framework}") if job["record"] else None
    cases = [run_model(backend, profiler, spec, case, job["epochs"], dump) for case in job["cases"]]
    Path(result_path).write_text(json.dumps({"framework": framework, "setting": job["setting"], "cases": cases},
                                            indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
