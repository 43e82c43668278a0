"""The model servers as containers: each in its framework's image (onnx: the validation image), all on one network
the serve stage makes for its run, and the client in a validation container on that network, addressing each server
by its container name, as the pods of a cluster would.

Used by pipelines/stages/serve.py under ROSETTA_RUNTIME=container. The network is `--internal`: nothing on it
reaches outside or is reached from outside, so readiness is probed from inside each server's own container
(`<engine> exec ... python -m pipelines.serving.probe`). Every server listens on its own address (`--host
0.0.0.0`), all on the same two ports. Containers are kept when they exit, so a server's exit code and last log
line can be read; `serving_session` removes every container and the network on the way out, however it is left.
The command lines are built by pure functions, so tests check them without an engine.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipelines import containers
from pipelines.containers import Engine
from pipelines.environments import REPO_ROOT
from pipelines.serving.probe import NOT_YET
from pipelines.serving.servers import (
    SERVERS,
    STOP_SECONDS,
    ServingError,
    export_threads,
    served_folder,
    server_arguments,
)
from pipelines.workers import describe_exit

LISTEN = "0.0.0.0"  # the container's own interfaces: on the stage's internal network only
HTTP_PORT, GRPC_PORT = 8080, 8081  # one pair for every server: each container has an address of its own
PROBE_MODULE = "pipelines.serving.probe"
POLL_SECONDS = 1.0  # each look is an `exec` (a Python start in the container): once a second is plenty
ENGINE_SECONDS = 60.0  # any one engine command (inspect, exec, logs, rm); a hung engine is an error, not a hang


def network_name(run_id: str) -> str:
    return f"rosetta-serve-{run_id}"


def container_name(network: str, name: str) -> str:
    """A server's (or "client") container: named after its network, so one run's containers are told apart."""
    return f"{network}-{name}"


def network_create_command(engine: Engine, network: str) -> list[str]:
    return [engine.name, "network", "create", "--internal", network]


def network_remove_command(engine: Engine, network: str) -> list[str]:
    return [engine.name, "network", "rm", network]


def _run_line(engine: Engine, env: str, variant: str, command: Sequence[str], network: str, container: str,
              host_env: Mapping[str, str], repo: Path, cwd: Path, uid: int, gid: int, detach: bool,
              threads: int | None = None) -> list[str]:
    return containers.run_command(
        engine, containers.image_name(env, variant), list(command),
        env_vars=containers.container_environment(env, variant, host_env, threads), repo=repo, cwd=cwd, uid=uid,
        gid=gid,
        variant=variant, network=network, detach=detach,
        extra_args=["--name", container, *shlex.split(host_env.get("ROSETTA_CONTAINER_ARGS", ""))])


def server_run_command(engine: Engine, name: str, variant: str, network: str, artifacts: Path, onnx_from: str,
                       models: Sequence[str] | None, host_env: Mapping[str, str], repo: Path, cwd: Path, uid: int,
                       gid: int) -> list[str]:
    """`<engine> run --detach` of one server on `network`: the same server command line as a local process
    (servers.server_arguments), listening on the container's own interfaces, with the thread count its exports
    recorded (servers.export_threads)."""
    arguments = server_arguments(name, artifacts, onnx_from, HTTP_PORT, GRPC_PORT, models, host=LISTEN)
    return _run_line(engine, SERVERS[name][0], variant, ["python", *arguments], network,
                     container_name(network, name), host_env, repo, cwd, uid, gid, detach=True,
                     threads=export_threads(served_folder(name, artifacts, onnx_from), models))


def client_run_command(engine: Engine, variant: str, network: str, module: str, config: Path,
                       host_env: Mapping[str, str], repo: Path, cwd: Path, uid: int, gid: int) -> list[str]:
    """`<engine> run --rm` of the client in the validation image on `network`."""
    return _run_line(engine, "validation", variant, ["python", "-m", module, str(config)], network,
                     container_name(network, "client"), host_env, repo, cwd, uid, gid, detach=False)


def server_addresses(network: str, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """The client's config entry of each server: its container's name on the network, and the two ports."""
    return {name: {"url": f"http://{container_name(network, name)}:{HTTP_PORT}",
                   "grpc": f"{container_name(network, name)}:{GRPC_PORT}"} for name in names}


def probe_command(engine: Engine, container: str, models: Sequence[str]) -> list[str]:
    return [engine.name, "exec", container, "python", "-m", PROBE_MODULE, f"http://127.0.0.1:{HTTP_PORT}",
            *models]


def state_command(engine: Engine, container: str) -> list[str]:
    return [engine.name, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container]


def logs_command(engine: Engine, container: str) -> list[str]:
    return [engine.name, "logs", container]


def stop_command(engine: Engine, names: Sequence[str], seconds: float) -> list[str]:
    """SIGTERM to every server at once, SIGKILL after `seconds` (each server answers SIGTERM by exiting 0)."""
    return [engine.name, "stop", "--time", str(int(seconds)), *names]


def remove_command(engine: Engine, names: Sequence[str]) -> list[str]:
    return [engine.name, "rm", "--force", *names]


def _engine(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=ENGINE_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise ServingError(f"`{shlex.join(command)}` did not return within {ENGINE_SECONDS:g} s (is the "
                                   "container engine hung?)") from None


@dataclass
class ServerContainer:
    name: str  # "torch", "tf", "jax", "onnx"
    container: str
    engine: Engine
    log: Path  # where its log is saved (on an error, and before it is removed)

    def describe(self) -> str:
        return f"the {self.name} server (container {self.container})"

    def state(self) -> tuple[str, int]:
        """(status, exit code): "running", "exited", ...; ("missing", -1) when the engine no longer knows it."""
        result = _engine(state_command(self.engine, self.container))
        if result.returncode != 0:
            return "missing", -1
        status, _, code = result.stdout.strip().partition(" ")
        return status, int(code or -1)

    def save_log(self) -> None:
        result = _engine(logs_command(self.engine, self.container))
        if result.returncode == 0:  # stdout and stderr of the server, as the engine kept them apart
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self.log.write_text(result.stdout + result.stderr)

    def last_words(self) -> str:
        self.save_log()
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines()
                 if line.strip()] if self.log.is_file() else []
        return f"its last line: {lines[-1]!r} (all of it in {self.log})" if lines else "its log is empty"

    def died(self, when: str) -> ServingError | None:
        status, code = self.state()
        if status in ("running", "created", "restarting"):
            return None
        how = "is gone (the engine no longer lists it)" if status == "missing" else describe_exit(code)
        return ServingError(f"{self.describe()} {how} {when}; {self.last_words()}")


@dataclass
class Session:
    """One run's network and server containers."""

    engine: Engine
    variant: str
    network: str
    servers: list[ServerContainer]

    def wait_ready(self, models: Sequence[str], timeout: float) -> None:
        """Until every server answers V2 readiness for itself and every model in `models`, probed from inside its
        container; ServingError naming the first server that exits, refuses a model, or is not ready in time."""
        deadline = time.monotonic() + timeout
        pending = list(self.servers)
        while pending:
            for server in list(pending):
                probe = _engine(probe_command(self.engine, server.container, models))
                if probe.returncode == 0:
                    pending.remove(server)
                    continue
                dead = server.died("before it was ready")
                if dead:
                    raise dead
                if probe.returncode not in (NOT_YET, 0):
                    errors = [line.removeprefix("error: ") for line in probe.stderr.splitlines()
                              if line.startswith("error: ")]
                    if errors:  # it answers, and refuses a model
                        raise ServingError(f"{server.describe()} {errors[-1]}")
                    # `exec` into a container that is still being created fails: one more look
                if time.monotonic() > deadline:
                    said = (probe.stdout.strip() or probe.stderr.strip()).splitlines()
                    raise ServingError(f"{server.describe()} was not ready within {timeout:g} s "
                                               f"({said[-1] if said else 'no answer'}); {server.last_words()}")
            if pending:
                time.sleep(POLL_SECONDS)

    def died(self, when: str) -> ServingError | None:
        for server in self.servers:
            dead = server.died(when)
            if dead:
                return dead
        return None

    def run_client(self, module: str, config: Path) -> subprocess.CompletedProcess[str]:
        command = client_run_command(self.engine, self.variant, self.network, module, config, os.environ,
                                     REPO_ROOT, Path.cwd().resolve(), os.getuid(), os.getgid())
        return subprocess.run(command, capture_output=True, text=True, check=False)

    def stop(self) -> dict[str, int]:
        """Stop every server (SIGTERM, SIGKILL after servers.STOP_SECONDS) and return each one's exit code."""
        _engine(stop_command(self.engine, [s.container for s in self.servers], STOP_SECONDS))
        return {server.name: server.state()[1] for server in self.servers}


@contextmanager
def serving_session(names: Sequence[str], artifacts: Path, models: Sequence[str] | None, onnx_from: str,
                    log_dir: Path, run_id: str) -> Iterator[Session]:
    """The servers started, detached, on a network made for this run; yielded at once (Session.wait_ready waits).
    On leaving, however it is left: each server's log saved to `<log_dir>/<name>.log`, every container of the run
    (the client's too) and the network removed."""
    variant = os.environ.get("ROSETTA_VARIANT", "cpu")
    engine = containers.select_engine()
    for env in dict.fromkeys(SERVERS[name][0] for name in [*names, "onnx"]):  # the client's: validation
        containers.check_image(engine, env, variant)  # all of them before anything starts
    network = network_name(run_id)
    made = _engine(network_create_command(engine, network))
    if made.returncode != 0:
        raise ServingError(f"{engine.name} network create {network} failed: {made.stderr.strip()}")
    session = Session(engine, variant, network, [])
    try:
        for name in names:
            server = ServerContainer(name, container_name(network, name), engine, log_dir / f"{name}.log")
            command = server_run_command(engine, name, variant, network, artifacts, onnx_from, models, os.environ,
                                         REPO_ROOT, Path.cwd().resolve(), os.getuid(), os.getgid())
            started = _engine(command)
            if started.returncode != 0:
                lines = [line for line in started.stderr.splitlines() if line.strip()]
                raise ServingError(f"{server.describe()} could not be started: "
                                           f"{lines[-1] if lines else f'exit {started.returncode}'}")
            session.servers.append(server)
        yield session
    finally:
        for server in session.servers:
            server.save_log()
        # By name, every one this run may have made: one whose start failed half-way, the client interrupted.
        everything = [container_name(network, name) for name in [*names, "client"]]
        subprocess.run(remove_command(engine, everything), capture_output=True, check=False)
        subprocess.run(network_remove_command(engine, network), capture_output=True, check=False)
