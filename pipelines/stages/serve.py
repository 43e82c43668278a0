"""Stage `serve`: each model's validation batch through every model server and protocol, for validate to judge.

    python -m pipelines.stages.serve [--client pipelines.stages.serve_client]

A deployed model answers over the network, so the judge checks what the servers answer, not only what the export
computes in process. This stage starts the four KServe model servers (torch, tf, jax, onnx) on the run's exports,
as local processes or, with ROSETTA_RUNTIME=container, as containers on a network of their own; sends each model's
validation batch, and its init twin's, through V1 REST, V2 REST and V2 gRPC of each (the client, `--client`, runs
in the validation environment, which holds KServe's gRPC stubs); and publishes the answers as artifacts/served/,
the same bytes on every run. What it publishes, how it fails, the containers: docs/serving.md, 'The serve stage'.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines import measurements, paths
from pipelines.serving import containers as serving_containers
from pipelines.serving import servers as serving
from pipelines.stages import IMPORTS_STARTED, StageError, stage_main
from rosetta_common.data import Dataset, load_for
from rosetta_common.io import read_json, scratch_dir, sha256, staged_outputs, write_json
from rosetta_common.serving import batch_sha256, init_name, served_models
from rosetta_common.spec import Spec, load_spec

CLIENT_MODULE = "pipelines.stages.serve_client"
REPEATS = 3  # timed requests per server, model and protocol; the first answer is the one published
# How long every server has to be ready, every model and its init twin answering V2 readiness: four cold starts at
# once (three framework imports, every model loaded) took 96 s on 2 cores shared with other jobs (load average near 5).
READY_SECONDS = 300.0


def served_names(spec: Spec) -> tuple[list[str], str]:
    """The servers to start (each framework of params.yaml, then onnx) and whose model.onnx the ONNX server serves."""
    onnx_from = serving.ONNX_FROM if serving.ONNX_FROM in spec.frameworks else spec.frameworks[0]
    return [*spec.frameworks, "onnx"], onnx_from


def check_inputs(spec: Spec, names: list[str], onnx_from: str) -> None:
    """Every run folder a server will serve, and every model's canonical init weights (each server's
    <model>-init), are there before any server starts (the servers check the files)."""
    for name in names:
        framework = onnx_from if name == "onnx" else name
        for model in spec.models:
            run = paths.run_dir(model, framework)
            if not run.is_dir():
                raise StageError(f"{run}: missing, so the {name} server cannot serve {model} (run train_export@"
                                 f"{framework} first)")
    for model in spec.models:
        if not paths.init_weights(model).is_file():
            raise StageError(f"{paths.init_weights(model)}: missing, so no server can serve {init_name(model)} (run "
                             "the init stage first)")


def run_client(module: str, config: Path, servers: list[serving.Server]) -> None:
    """The client in the validation environment; a failure is one line: the server that died, if one did (the
    client's own line then only says it got no answer), else the client's line."""
    command = [sys.executable, "-m", "pipelines.runner", "validation", "--", "python", "-m", module,
               str(config)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    dead = died(servers, "while serving")
    if dead:
        raise dead
    client_failed(result, module)


def client_failed(result: subprocess.CompletedProcess[str], module: str) -> None:
    """StageError with the client's own error line (or its last line) when it failed; either runtime's client."""
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
        if not errors:
            sys.stderr.write(result.stderr)  # a bug of ours: its traceback, above the one line
        raise StageError(errors[-1] if errors else f"the serving client ({module}) exited with code "
                         f"{result.returncode}; {lines[-1] if lines else 'no output'}")


def died(servers: list[serving.Server], when: str) -> serving.ServingError | None:
    """A one-line error naming the first server that is no longer running, or None."""
    for server in servers:
        code = server.process.poll()
        if code is not None:
            return serving.ServingError(f"{server.describe()} {serving.describe_exit(code)} {when}; "
                                        f"{server.last_words()}")
    return None


def stop_all(servers: list[serving.Server]) -> dict[str, int]:
    """Stop every server and return the exit codes. One that did not exit cleanly (SIGTERM, exit 0) is a warning
    naming it, not an error: every answer was in by then (the torch server, its last line "stopped: torch
    server", once still had to be killed after serving.STOP_SECONDS on a loaded machine)."""
    codes = serving.stop(servers)
    warn_unclean(servers, codes)
    return codes


def warn_unclean(servers: list[serving.Server] | list[serving_containers.ServerContainer],
                 codes: dict[str, int]) -> None:
    for server in servers:
        if codes[server.name] != 0:
            print(f"warning: {server.describe()} {serving.describe_exit(codes[server.name])} when stopped "
                  f"(SIGTERM); {server.last_words()}", file=sys.stderr, flush=True)


def validation_batches(spec: Spec) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The batches to send, one per kind of input the models read (images, tokens), and each model's kind: its
    prepared data's validation batch, train_export's own call (load_for, Dataset.validation_batch)."""
    cache: dict[str, Dataset] = {}  # each kind of prepared data read once
    batches: dict[str, np.ndarray] = {}
    kinds: dict[str, str] = {}
    for model in spec.models:
        data = load_for(model, paths.PREPARED, cache)
        kinds[model] = data.kind
        if data.kind not in batches:
            batches[data.kind] = data.validation_batch(spec.export.validation_batch_size)
    return batches, kinds


def batch_records(spec: Spec, batches: dict[str, np.ndarray], kinds: dict[str, str]) -> dict[str, Any]:
    """index.json's "batches": per kind of input, the batch's shape, dtype and sha256 and the served names (each
    model and its init twin) it was sent to."""
    return {kind: {"shape": list(batch.shape), "dtype": str(batch.dtype), "sha256": batch_sha256(batch),
                   "models": served_models([m for m in spec.models if kinds[m] == kind])}
            for kind, batch in batches.items()}


def index(spec: Spec, names: list[str], onnx_from: str, batches: dict[str, Any], out: Path) -> dict[str, Any]:
    """index.json: what was served, on which batches, and the sha256 of every other file of the folder."""
    return {
        "servers": {name: {"environment": serving.SERVERS[name][0], "module": serving.SERVERS[name][1],
                           "serves": str(paths.framework_dir(onnx_from if name == "onnx" else name)),
                           "threads": serving.export_threads(paths.framework_dir(onnx_from if name == "onnx"
                                                                                 else name), spec.models)}
                    for name in names},
        "onnx_from": onnx_from,
        "models": served_models(spec.models),  # each model, then its canonical-init twin
        "init": str(paths.INIT),
        "protocols": list(paths.SERVED_PROTOCOLS),
        "batches": batches,
        "sha256": {p.relative_to(out).as_posix(): sha256(p) for p in sorted(out.rglob("*")) if p.is_file()},
    }


def request_figures(timings: dict[str, Any]) -> dict[str, Any]:
    """Per server, protocol and model: the first (cold) request's seconds and the median of the others."""
    return {name: {protocol: {model: {"first_seconds": round(seconds[0], 6),
                                      "median_seconds": round(statistics.median(seconds[1:] or seconds), 6)}
                              for model, seconds in models.items()}
                   for protocol, models in protocols.items()}
            for name, protocols in timings.items()}


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM (DVC stopping the stage, a test's kill) unwinds as Ctrl-C does, so the servers are stopped on the
    way out rather than left running; only a SIGKILL leaves them, each on its own free port."""
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Run:
    """What either runtime's route serves: the servers, the run folders, the client's request, the scratch."""

    names: list[str]
    onnx_from: str
    models: list[str]  # run folders (each server's --models)
    examples: dict[str, int]  # per kind of input (images, tokens), how many the validation batch holds
    request: dict[str, Any]  # the client's config without "servers"
    scratch: Path
    logs: Path

    def announce(self, ready_seconds: float, where: str) -> None:
        batches = ", ".join(f"{count} {'token rows' if kind == 'tokens' else kind}"
                            for kind, count in self.examples.items())
        print(f"serve: {', '.join(self.names)} ready in {ready_seconds:.1f} s {where}(onnx serves {self.onnx_from}'s "
              f"model.onnx); sending the validation batches ({batches}) through "
              f"{', '.join(paths.SERVED_PROTOCOLS)}", flush=True)

    def config(self, servers: dict[str, dict[str, str]]) -> Path:
        write_json(self.scratch / "config.json", {"servers": servers, **self.request})
        return self.scratch / "config.json"


def serve_locally(client: str, run: Run, clock: measurements.StageClock) -> dict[str, Any]:
    """The servers as processes on 127.0.0.1, the client in the validation environment."""
    started = time.perf_counter()
    servers = serving.start(run.names, paths.ARTIFACTS, run.models, onnx_from=run.onnx_from, log_dir=run.logs)
    try:
        clock.lap("start")
        serving.wait_ready(servers, run.models, READY_SECONDS)
        ready_seconds = time.perf_counter() - started
        clock.lap("ready")
        run.announce(ready_seconds, "")
        config = run.config({s.name: {"url": s.url, "grpc": s.grpc_target} for s in servers})
        run_client(client, config, servers)
        clock.lap("requests")
    except BaseException:
        serving.stop(servers)  # quietly: the error that brought us here is the one line to print
        raise
    stopped = stop_all(servers)
    clock.lap("stop")
    return {"ready_seconds": round(ready_seconds, 4), "stop_exit_codes": stopped}


def serve_in_containers(client: str, run: Run, clock: measurements.StageClock) -> dict[str, Any]:
    """The servers as containers on a network made for this run, the client in a validation container on it;
    every container and the network removed on the way out (serving_containers.serving_session)."""
    started = time.perf_counter()
    with serving_containers.serving_session(run.names, paths.ARTIFACTS, run.models, run.onnx_from, run.logs,
                                            uuid.uuid4().hex[:8]) as session:
        clock.lap("start")
        session.wait_ready(run.request["models"], READY_SECONDS)
        ready_seconds = time.perf_counter() - started
        clock.lap("ready")
        run.announce(ready_seconds, f"as containers on network {session.network} ")
        config = run.config(serving_containers.server_addresses(session.network, run.names))
        result = session.run_client(client, config)
        dead = session.died("while serving")
        if dead:
            raise dead
        client_failed(result, client)
        clock.lap("requests")
        stopped = session.stop()
        warn_unclean(session.servers, stopped)
        clock.lap("stop")
    return {"ready_seconds": round(ready_seconds, 4), "stop_exit_codes": stopped, "network": session.network,
            "containers": {server.name: server.container for server in session.servers}}


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("serve", IMPORTS_STARTED)
    signal.signal(signal.SIGTERM, interrupted)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # dvc.yaml names the client's module in the command, so that the command says every module the stage runs.
    parser.add_argument("--client", default=CLIENT_MODULE, help="the module that sends the requests")
    args = parser.parse_args(argv)
    runtime = os.environ.get("ROSETTA_RUNTIME", "local")
    if runtime not in ("local", "container"):
        raise StageError(f"ROSETTA_RUNTIME={runtime}: not a runtime; allowed: local, container")
    spec = load_spec(paths.PARAMS)
    batches, kinds = validation_batches(spec)  # train_export's batches, the same calls
    names, onnx_from = served_names(spec)
    check_inputs(spec, names, onnx_from)
    clock.lap("inputs")
    work = scratch_dir(paths.SERVED, "serve")
    logs = work / "logs"  # kept after a failure: the error line points into it
    shutil.rmtree(logs, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="client.", dir=work))
    try:
        with staged_outputs(paths.SERVED) as out:
            files = {}
            for kind, batch in batches.items():
                files[kind] = scratch / f"{kind}.npy"
                np.save(files[kind], batch)
            # The client's config but for where the servers are: the one list of models both runtimes ask for, and
            # the batch each served name is sent (a model and its init twin, the same).
            request = {"models": served_models(spec.models),
                       "batches": {name: str(files[kinds[m]]) for m in spec.models for name in served_models([m])},
                       "out": str(out.resolve()), "timings": str(scratch / "timings.json"), "repeats": REPEATS}
            examples = {kind: len(batch) for kind, batch in batches.items()}
            route = serve_in_containers if runtime == "container" else serve_locally
            record = route(args.client, Run(names, onnx_from, list(spec.models), examples, request, scratch, logs),
                           clock)
            write_json(out / paths.SERVED_INDEX.name,
                       index(spec, names, onnx_from, batch_records(spec, batches, kinds), out))
        timings = read_json(scratch / "timings.json")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    measurements.write_stage(clock.record(servers=names, onnx_from=onnx_from, runtime=runtime, **record,
                                          requests=request_figures(timings)))
    print(f"serve: {len(names)} servers x {len(spec.models)} models and their init twins x "
          f"{len(paths.SERVED_PROTOCOLS)} protocols -> {paths.SERVED}", flush=True)
    return 0


if __name__ == "__main__":
    stage_main(main)
