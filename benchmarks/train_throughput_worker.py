"""The in-framework half of benchmarks/train_throughput.py: one process of one framework's environment times our
train() and that framework's idiomatic loops (benchmarks/idiomatic/<framework>.py) side by side.

    python -m pipelines.runner torch -- python -m benchmarks.train_throughput_worker JOB.json RESULT.json

A ratio of two loops means something only if both meet the same conditions, so every run of every case (scale,
model) starts from a fresh `build(config, init)`: the same canonical init weights, data, batch size and optimizer
settings, after the package's own configure(), as in the pipeline. Per repeat it trains ours, the idiomatic loop,
each peer style on the models it has and, with tricks requested (JOB.json, from train_throughput.py), each TRICKS
and PARITY variant, in an order reversed every other repeat so that the machine's load falls on all alike. A case
with short epochs gets more of them (up to MAX_EPOCHS). Only raw epoch times go to RESULT.json; the parent
summarizes.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cpus import hold_to_thread_count
from rosetta_common.data import Dataset, load_prepared
from rosetta_common.interface import load_backend
from rosetta_common.spec import ModelConfig, load_spec
from rosetta_common.training import plan
from rosetta_common.weights import init_weights

# A case whose epochs are short gets more of them (the job's min_steady_seconds): one unrecorded run of ours first
# measures its epoch, then every variant of every repeat trains for enough epochs that the steady part lasts at least
# that long, at most MAX_EPOCHS. The digits mlp's epochs take about 6 ms: two of them are timer noise, forty a figure.
MAX_EPOCHS = 40


def subset(data: Dataset, samples: int | None) -> Dataset:
    """The first `samples` training images (the prepared split is already shuffled by the seed), or all."""
    if samples is None or samples >= len(data.train_labels):
        return data
    return dataclasses.replace(data, train_inputs=data.train_inputs[:samples], train_labels=data.train_labels[:samples])


def named(idiomatic: Any, peers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The framework's TRICKS, PARITY and ONLY_FOR with each peer's under `<peer>:<name>`."""
    out = {key: dict(getattr(idiomatic, key.upper())) for key in ("tricks", "parity", "only_for")}
    for peer_name, peer in peers.items():
        for key in out:
            out[key] |= {f"{peer_name}:{name}": value for name, value in getattr(peer, key.upper()).items()}
    return out


def run_case(backend: Any, idiomatic: Any, spec: Any, case: dict[str, Any], repeats: int, extra: list[str],
             min_steady_seconds: float = 0.0, peers: dict[str, Any] | None = None) -> dict[str, Any]:
    peers = peers or {}
    data = subset(load_prepared(case["data"]), case.get("train_samples"))
    config = ModelConfig.of(spec, case["model"], data.image_shape, data.num_classes)
    init = init_weights(config, spec.seed)
    train_plan = dataclasses.replace(plan(spec, case["model"], len(data.train_labels)), epochs=case["epochs"])
    if min_steady_seconds > 0:  # calibrate: how many epochs make the steady part at least that long
        result = backend.train(backend.build(config, init), train_plan, data)
        epoch = min(result.epoch_seconds[1:])
        wanted = 1 + math.ceil(min_steady_seconds / max(epoch, 1e-6))
        train_plan = dataclasses.replace(train_plan, epochs=min(MAX_EPOCHS, max(case["epochs"], wanted)))
    only_for = named(idiomatic, peers)["only_for"]  # a variant named there applies to those models alone
    loops = [name for name, peer in peers.items() if case["model"] in peer.MODELS]

    def applies(name: str) -> bool:  # a peer's variant only where that peer runs; ONLY_FOR's only for its models
        peer, colon, _ = name.partition(":")
        return (not colon or peer in loops) and case["model"] in only_for.get(name, (case["model"],))

    variants = ["ours", "idiomatic", *loops, *(name for name in extra if applies(name))]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for repeat in range(repeats):
        for position, name in enumerate(variants if repeat % 2 == 0 else variants[::-1]):
            model = backend.build(config, init)
            gc.collect()
            started = time.perf_counter()
            if name == "ours":
                result = backend.train(model, train_plan, data)
                record = {"epoch_seconds": result.epoch_seconds,
                          "samples_per_epoch": train_plan.steps_per_epoch * train_plan.batch_size,
                          "epoch_losses": result.epoch_losses}
            else:
                # "idiomatic", a peer ("idiomatic_linen"), a variant of the first ("donate") or of a peer's
                # ("idiomatic_linen:torch_adam")
                peer, colon, variant = name.partition(":")
                module = peers.get(peer, idiomatic)
                variant = variant if colon else None if name == "idiomatic" or name in peers else name
                loop = module.train(model, data, train_plan.batch_size, train_plan.optimizer, train_plan.epochs,
                                    spec.seed, variant=variant)
                record = dataclasses.asdict(loop)
            record["call_seconds"] = time.perf_counter() - started  # the whole train call, set-up included
            record["position"] = position  # 0: ran first in this repeat
            runs[name].append(record)
            del model
            print(f"  {backend.FRAMEWORK} {case['scale']} {case['model']} repeat {repeat + 1}/{repeats} {name}: "
                  f"epochs {', '.join(f'{s:.2f}' for s in record['epoch_seconds'])} s", file=sys.stderr, flush=True)
    return {**case, "epochs": train_plan.epochs, "train_samples": len(data.train_labels),
            "batch_size": train_plan.batch_size,
            "optimizer": train_plan.describe(), "runs": runs}


def main(argv: list[str]) -> int:
    job_path, result_path = (Path(a) for a in argv)
    job = json.loads(job_path.read_text())
    hold_to_thread_count()  # before the framework starts its pools: JAX's too
    framework = job["framework"]
    spec = load_spec(job["params"])
    started = time.perf_counter()
    backend = load_backend(framework)
    backend.configure(spec.seed)  # deterministic mode, as in the pipeline; it holds for both loops alike
    idiomatic = importlib.import_module(f"benchmarks.idiomatic.{framework}")
    peers = {name: importlib.import_module(module) for name, module in getattr(idiomatic, "PEERS", {}).items()}
    import_seconds = time.perf_counter() - started
    kinds = named(idiomatic, peers)
    variants = [*kinds["tricks"], *kinds["parity"]] if job["tricks"] else []
    cases = [run_case(backend, idiomatic, spec, case, job["repeats"], variants, job.get("min_steady_seconds", 0.0),
                      peers) for case in job["cases"]]
    Path(result_path).write_text(json.dumps({
        "framework": framework, "import_seconds": import_seconds, **kinds, "measured_variants": variants,
        "peers": {name: {"module": peer.__name__, "models": list(peer.MODELS)} for name, peer in peers.items()},
        "cases": cases,
        "environment": environment(framework),
    }, indent=1))
    return 0


def environment(framework: str) -> dict[str, Any]:
    from pipelines import latency

    return {"threads": latency.framework_threads(framework), "cores": latency.available_cores()}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
