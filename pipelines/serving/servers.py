"""Start Rosetta's model servers, wait until they serve, stop them: one or all four, as processes on loopback.

    python -m pipelines.serving                       # all four on free ports, until Ctrl-C
    python -m pipelines.serving torch onnx --port 8500 --artifacts artifacts

Each server is `python -m <module> --artifacts ... --http-port P --grpc-port Q` in its own environment (SERVERS),
started as pipelines/workers.py starts data-parallel workers (stage_environment: the instruction-set pins of the
stage that exported the model, and the thread count its export.json records, export_threads), on fixed ports
(`--port BASE`: server i of SERVERS on BASE + 2i for REST, BASE + 2i + 1 for gRPC) or free ones. A server is ready
when `GET /v2/health/ready` and `GET /v2/models/<m>/ready` of every model answer 200 within the bound; one that
exits or is not ready in time is one `error:` line naming it, and every server started is stopped. Standard
library only: it runs in the orchestrator, which has no kserve.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipelines.environments import envs_dir, stage_environment
from pipelines.workers import describe_exit  # how a server ended, said as a data-parallel worker's end is said
from rosetta_common.distributed import free_ports
from rosetta_common.errors import RosettaError
from rosetta_common.serving import served_models

HOST = "127.0.0.1"
# Server -> (environment, module). The order fixes the ports of `--port BASE`; docs/serving.md lists them.
SERVERS: dict[str, tuple[str, str]] = {
    "torch": ("torch", "rosetta_torch.serve"),
    "tf": ("tf", "rosetta_tf.serve"),
    "jax": ("jax", "rosetta_jax.serve"),
    "onnx": ("validation", "pipelines.serving.onnx"),
}
FRAMEWORKS = ("torch", "tf", "jax")
INIT_FOLDER = "init"  # the init stage's folder in an artifacts folder (paths.INIT): every server's --init
ONNX_FROM = "torch"  # whose model.onnx files the ONNX server serves, unless told otherwise
# A start imports kserve (~6 s of CPU: pandas, FastAPI, gRPC) and the framework, and loads every model: the four
# full-size servers side by side took 100 s on 2 busy cores.
READY_SECONDS = 300.0
POLL_SECONDS = 0.25
# The servers' own grace (rosetta_common.serving.server.GRACE_SECONDS), then the interpreter's exit: torch's server
# took 3 s from SIGTERM to exit on 2 busy cores, and more than 10 s once, beside four other servers starting.
STOP_SECONDS = 30.0
# The command line's servers write here (scratch space, ignored by git and DVC), so that what it prints is its own
# lines: where each server listens, and one error line naming a server that fails (with that server's last line).
LOGS = Path(".rosetta/serving")


class ServingError(RosettaError):
    """A server could not be started, died, or was not ready in time; the message names it."""


@dataclass
class Server:
    name: str  # "torch", "tf", "jax", "onnx"
    artifacts: Path  # the artifacts folder it serves (artifacts/<framework>)
    http_port: int
    grpc_port: int
    process: subprocess.Popen[bytes]
    log: Path | None = None  # its stdout and stderr, when not the caller's

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def describe(self) -> str:
        return f"the {self.name} server (pid {self.process.pid}, {self.url}, grpc {self.grpc_target})"

    def last_words(self) -> str:
        """Where its reason is: the last line of its log, or the output above."""
        if self.log is None:
            return "its reason is above"
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        return f"its last line: {lines[-1]!r} (all of it in {self.log})" if lines else f"its log {self.log} is empty"


def port_pairs(names: Sequence[str], base: int) -> dict[str, tuple[int, int]]:
    """(REST, gRPC) port of each server: fixed from `base` by its place in SERVERS, or free ones (base 0)."""
    if not base:
        ports = free_ports(2 * len(names), HOST)
        return {name: (ports[2 * i], ports[2 * i + 1]) for i, name in enumerate(names)}
    pairs = {}
    for name in names:
        index = list(SERVERS).index(name)
        pairs[name] = (base + 2 * index, base + 2 * index + 1)
        for port in pairs[name]:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                # As uvicorn and gRPC bind: a port a stopped server left in TIME_WAIT is free, a listening one not.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((HOST, port))
                except OSError as error:
                    raise ServingError(f"--port {base}: the {name} server's port {port} on {HOST} cannot be bound "
                                       f"({error.strerror}); free it or choose another base port") from None
    return pairs


def served_folder(name: str, artifacts: Path, onnx_from: str) -> Path:
    return artifacts / (onnx_from if name == "onnx" else name)


def export_threads(folder: Path, models: Sequence[str] | None = None) -> int | None:
    """The CPU thread count the runs in `folder` (a framework's artifacts; `models` of them, where given) were
    exported with, their export.json's "threads": the last bits of the in-process logits they record depend on
    it, so their server runs with it and its answers are those logits bit for bit, whatever ROSETTA_THREADS the
    caller has (the ONNX server takes its source framework's, as validate's session of the same file does). None
    where no run records one (the caller's then); runs that disagree are one error naming the folder."""
    found: set[int] = set()
    for record in sorted(folder.glob("*/export.json")):
        if models and record.parent.name not in models:
            continue
        threads = json.loads(record.read_text()).get("threads")
        if threads is not None:
            found.add(int(threads))
    if len(found) > 1:
        raise ServingError(f"{folder}: its runs were exported with different thread counts {sorted(found)}, so no "
                           "one server can reproduce them all; rerun its train_export stage")
    return found.pop() if found else None


def server_arguments(name: str, artifacts: Path, onnx_from: str, http_port: int, grpc_port: int,
                     models: Sequence[str] | None = None, max_body_bytes: int | None = None,
                     host: str = HOST) -> list[str]:
    """A server's command line after its interpreter (`-m <module> --artifacts ...`): one place for both a local
    process (start) and a container on a network of its own (pipelines/serving/containers.py, `--host 0.0.0.0`)."""
    command = ["-m", SERVERS[name][1], "--artifacts", str(served_folder(name, artifacts, onnx_from)),
               "--init", str(artifacts / INIT_FOLDER), "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    command += ["--host", host] if host != HOST else []
    command += ["--models", *models] if models else []
    command += ["--max-body-bytes", str(max_body_bytes)] if max_body_bytes else []
    return command


def start(names: Sequence[str], artifacts: Path = Path("artifacts"), models: Sequence[str] | None = None,
          base_port: int = 0, onnx_from: str = ONNX_FROM, max_body_bytes: int | None = None,
          log_dir: Path | None = None) -> list[Server]:
    """Start the named servers (SERVERS' keys) on `artifacts/<framework>` (the ONNX server on `onnx_from`'s), each
    as a process of its environment; returns at once (wait_ready waits). With `log_dir`, each server's output goes
    to `<log_dir>/<name>.log`, else to this process's."""
    unknown = [name for name in names if name not in SERVERS]
    if unknown or not names:
        raise ServingError(f"servers {list(unknown or names)}: unknown; allowed: {', '.join(SERVERS)}")
    if onnx_from not in FRAMEWORKS:
        raise ServingError(f"--onnx-from {onnx_from}: unknown; allowed: {', '.join(FRAMEWORKS)}")
    for name in names:
        folder = served_folder(name, artifacts, onnx_from)
        if not folder.is_dir():
            raise ServingError(f"{folder}: missing, so the {name} server has nothing to serve (run dvc repro first)")
    if not (artifacts / INIT_FOLDER).is_dir():
        raise ServingError(f"{artifacts / INIT_FOLDER}: missing, so no server can serve the init models (run dvc "
                           "repro first)")
    variant = os.environ.get("ROSETTA_VARIANT", "cpu")
    environments = list(dict.fromkeys(SERVERS[name][0] for name in names))
    # The runner builds each environment from its lock if it is missing or stale, and only confirms it otherwise.
    built = subprocess.run([sys.executable, "-m", "pipelines.runner", "--setup", *environments], check=False)
    if built.returncode != 0:
        raise ServingError(f"environments {', '.join(environments)}: could not be built (the reason is above)")
    pairs = port_pairs(names, base_port)
    started: list[Server] = []
    try:
        for name in names:
            environment = SERVERS[name][0]
            env_dir = envs_dir() / f"{environment}-{variant}"
            folder = served_folder(name, artifacts, onnx_from)
            http_port, grpc_port = pairs[name]
            command = [str(env_dir / "bin" / "python"),
                       *server_arguments(name, artifacts, onnx_from, http_port, grpc_port, models, max_body_bytes)]
            log = None if log_dir is None else log_dir / f"{name}.log"
            if log is not None:
                log.parent.mkdir(parents=True, exist_ok=True)
            out = None if log is None else open(log, "wb")  # noqa: SIM115  (the child holds it; closed below)
            try:
                process = subprocess.Popen(command, env=stage_environment(environment, env_dir,
                                                                          export_threads(folder, models)),
                                           stdout=out, stderr=None if out is None else subprocess.STDOUT)
            finally:
                if out is not None:
                    out.close()
            started.append(Server(name, folder, http_port, grpc_port, process, log))
    except BaseException:
        stop(started)
        raise
    return started


def get(url: str, timeout: float = 5.0) -> tuple[int, object]:
    """GET `url`: (HTTP status, decoded JSON or text); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            status, body = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    except (urllib.error.URLError, OSError) as error:  # refused, reset, timed out: not up yet
        return 0, str(getattr(error, "reason", error))
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def _served_models(server: Server, models: Sequence[str] | None) -> list[str]:
    if models:
        return served_models(models)  # each run folder's model and its init twin
    status, listing = get(f"{server.url}/v2/models")
    if status != 200 or not isinstance(listing, dict):
        raise ServingError(f"{server.describe()}: GET /v2/models answered {status} {listing}")
    return list(listing.get("models", []))


def wait_ready(servers: Sequence[Server], models: Sequence[str] | None = None,
               timeout: float = READY_SECONDS) -> None:
    """Wait until every server answers V2 readiness, for itself and for each of `models` and its init twin
    (default: every model it lists); ServingError naming the first server that exits, refuses a model, or is not
    ready by then."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for server in list(pending):
            code = server.process.poll()
            if code is not None:
                raise ServingError(f"{server.describe()} {describe_exit(code)} before it was ready; "
                                   f"{server.last_words()}")
            status, answer = get(f"{server.url}/v2/health/ready", timeout=1.0)
            if status != 200:
                if time.monotonic() > deadline:
                    raise ServingError(f"{server.describe()} was not ready within {timeout:g} s "
                                       f"(GET /v2/health/ready: {status or answer}); {server.last_words()}")
                continue
            for model in _served_models(server, models):
                status, answer = get(f"{server.url}/v2/models/{model}/ready")
                if status != 200 or not (isinstance(answer, dict) and answer.get("ready")):
                    raise ServingError(f"{server.describe()} does not serve model {model!r} "
                                       f"(GET /v2/models/{model}/ready: {status} {answer})")
            pending.remove(server)
        if pending:
            time.sleep(POLL_SECONDS)


def stop(servers: Sequence[Server]) -> dict[str, int]:
    """SIGTERM every server still running (each stops cleanly), SIGKILL what is left after STOP_SECONDS; returns
    each server's exit code."""
    for server in servers:
        if server.process.poll() is None:
            server.process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    codes = {}
    for server in servers:
        try:
            codes[server.name] = server.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.process.kill()
            codes[server.name] = server.process.wait()
    return codes


@contextmanager
def running(names: Sequence[str], artifacts: Path = Path("artifacts"), models: Sequence[str] | None = None,
            timeout: float = READY_SECONDS, **options: object) -> Iterator[list[Server]]:
    """The servers, started and ready; stopped on leaving, however it is left."""
    servers = start(names, artifacts, models, **options)  # type: ignore[arg-type]
    try:
        wait_ready(servers, models, timeout)
        yield servers
    finally:
        stop(servers)


def watch(servers: Sequence[Server]) -> None:
    """Serve until SIGINT or SIGTERM; ServingError naming the first server that dies meanwhile."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the servers as Ctrl-C does

    signal.signal(signal.SIGTERM, interrupt)
    try:
        while True:
            for server in servers:
                code = server.process.poll()
                if code is not None:
                    raise ServingError(f"{server.describe()} {describe_exit(code)} while serving; "
                                       f"{server.last_words()}")
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        return


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve Rosetta's models: KServe ModelServers on 127.0.0.1.")
    parser.add_argument("servers", nargs="*", metavar="SERVER", help=f"any of {', '.join(SERVERS)} (default: all)")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"),
                        help="the pipeline's artifacts folder (artifacts/<framework>/<model>/ in it)")
    parser.add_argument("--models", nargs="+", metavar="MODEL", help="serve only these (default: every one there)")
    parser.add_argument("--port", type=int, default=0,
                        help="base port: server i of torch, tf, jax, onnx gets BASE+2i (REST) and BASE+2i+1 "
                             "(gRPC); 0 (default): free ports")
    parser.add_argument("--onnx-from", default=ONNX_FROM, choices=FRAMEWORKS,
                        help=f"whose model.onnx files the ONNX server serves (default {ONNX_FROM})")
    parser.add_argument("--timeout", type=float, default=READY_SECONDS,
                        help=f"seconds every server has to be ready (default {READY_SECONDS:g})")
    parser.add_argument("--max-body-bytes", type=int, help="the servers' size limit (default: theirs, 16 MiB)")
    parser.add_argument("--logs", type=Path, default=LOGS,
                        help=f"where each server's output goes, <name>.log (default {LOGS})")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535 - 2 * len(SERVERS):
        parser.error(f"--port {args.port}: allowed: 0 (free ports) or a base port up to {65535 - 2 * len(SERVERS)}")
    try:
        servers = start(args.servers or list(SERVERS), args.artifacts, args.models, args.port, args.onnx_from,
                        args.max_body_bytes, args.logs)
        try:
            wait_ready(servers, args.models, args.timeout)
            for server in servers:
                print(f"serving: {server.name} ({server.artifacts}) REST {server.url} (V1, V2), gRPC "
                      f"{server.grpc_target} (V2), log {server.log}", flush=True)
            print("Ctrl-C stops them.", flush=True)
            watch(servers)
        finally:
            codes = stop(servers)
    except ServingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    unclean = [f"{name} {describe_exit(code)}" for name, code in codes.items() if code != 0]
    print(f"stopped: {', '.join(codes)}" + (f" ({'; '.join(unclean)})" if unclean else ""), flush=True)
    return 0

