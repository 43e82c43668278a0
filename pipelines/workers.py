"""Start N data-parallel workers of one framework and watch them: as N local processes, or as N containers on
one user-defined network, the way N hosts would run them.

Each worker is `python -m pipelines.stages.train_dp_worker <framework>` in that framework's environment, told
who it is by the variables of the framework's own launcher (rosetta_common.distributed.Cluster.environment:
torchrun's, JAX's, TF_CONFIG), so the same program runs under `torchrun` or by hand on two hosts
(docs/data-parallel.md).

The watcher ends the run as soon as any worker fails: it names the worker and how it ended, stops the others
(a peer blocked in a collective would otherwise wait for its timeout), and the caller publishes nothing.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipelines import containers
from pipelines.environments import REPO_ROOT, envs_dir, stage_environment
from rosetta_common.distributed import Cluster, check_port_free, free_ports
from rosetta_common.errors import DistributedError

WORKER_MODULE = "pipelines.stages.train_dp_worker"  # the default; dvc.yaml names it in train_dp's command
CONTAINER_PORT = 29500  # every worker container listens on its own network address, so one port serves all
POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 5.0


def log(message: str) -> None:
    print(f"[rosetta] {message}", file=sys.stderr, flush=True)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == 137:  # a container's main process killed by SIGKILL (128 + 9)
        return "was killed (exit 137, SIGKILL)"
    return f"exited with code {code}"


@dataclass
class Worker:
    rank: int
    name: str  # how the error names it: "worker 1 (pid 4242)" or "worker 1 (container rosetta-dp-...)"
    process: subprocess.Popen[bytes]
    stop: list[str] = field(default_factory=list)  # a command that stops it for sure (containers), else a signal


def local_addresses(workers: int, port: int) -> tuple[str, ...]:
    """Loopback addresses: rank 0 on `port` (rank r on port + r), or ports nothing listens on (port 0)."""
    host = "127.0.0.1"
    ports = [port + rank for rank in range(workers)] if port else free_ports(workers, host)
    if port:
        for p in ports:
            check_port_free(host, p)
    return tuple(f"{host}:{p}" for p in ports)


def start_local(framework: str, workers: int, port: int, timeout: float, env: Mapping[str, str],
                module: str = WORKER_MODULE) -> list[Worker]:
    """N processes of the framework's environment on loopback, each `python -m <module> <framework>`."""
    # The runner builds the environment from its lock if it is missing or stale (and only confirms it otherwise).
    variant = os.environ.get("ROSETTA_VARIANT", "cpu")
    built = subprocess.run([sys.executable, "-m", "pipelines.runner", "--setup", framework], check=False)
    if built.returncode != 0:
        raise DistributedError(f"the {framework}-{variant} environment could not be built (its reason is above)")
    env_dir = envs_dir() / f"{framework}-{variant}"
    addresses = local_addresses(workers, port)
    started = []
    for rank in range(workers):
        cluster = Cluster(rank, workers, addresses, timeout)
        worker_env = {**stage_environment(framework, env_dir), **env, **cluster.environment(framework)}
        process = subprocess.Popen([str(env_dir / "bin" / "python"), "-m", module, framework],
                                   env=worker_env)
        started.append(Worker(rank, f"worker {rank} (pid {process.pid})", process))
    return started


def start_containers(framework: str, workers: int, timeout: float, env: Mapping[str, str],
                     run_id: str, module: str = WORKER_MODULE) -> tuple[list[Worker], list[str]]:
    """N containers of the framework's image on a network made for this run; returns them and the command that
    removes the network."""
    variant = os.environ.get("ROSETTA_VARIANT", "cpu")
    engine = containers.select_engine()
    image = containers.check_image(engine, framework, variant)
    network = f"rosetta-dp-{framework}-{run_id}"
    names = [f"{network}-{rank}" for rank in range(workers)]
    made = subprocess.run([engine.name, "network", "create", "--internal", network], capture_output=True, text=True,
                          check=False)
    if made.returncode != 0:
        raise DistributedError(f"{engine.name} network create {network} failed: {made.stderr.strip()}")
    addresses = tuple(f"{name}:{CONTAINER_PORT}" for name in names)
    started = []
    for rank, name in enumerate(names):
        cluster = Cluster(rank, workers, addresses, timeout)
        env_vars = {**containers.container_environment(framework, variant, {**os.environ, **env}),
                    **cluster.environment(framework)}
        argv = containers.run_command(
            engine, image, ["python", "-m", module, framework], env_vars=env_vars, repo=REPO_ROOT,
            cwd=Path.cwd().resolve(), uid=os.getuid(), gid=os.getgid(), variant=variant, network=network,
            extra_args=["--name", name, *shlex.split(os.environ.get("ROSETTA_CONTAINER_ARGS", ""))])
        process = subprocess.Popen(argv)
        started.append(Worker(rank, f"worker {rank} (container {name})", process,
                              stop=[engine.name, "rm", "--force", name]))
    return started, [engine.name, "network", "rm", network]


def stop(workers: Sequence[Worker]) -> None:
    """Stop every worker still running: SIGTERM, then SIGKILL after a grace period (containers: rm --force)."""
    for worker in workers:
        if worker.process.poll() is None:
            if worker.stop:
                subprocess.run(worker.stop, capture_output=True, check=False)
            else:
                worker.process.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()


def watch(workers: Sequence[Worker], where: str) -> None:
    """Wait for every worker to succeed; at the first failure stop the rest and raise, naming the worker."""
    try:
        pending = list(workers)
        while pending:
            for worker in list(pending):
                code = worker.process.poll()
                if code is None:
                    continue
                pending.remove(worker)
                if code != 0:
                    raise DistributedError(f"{where}: {worker.name} {describe_exit(code)}; the other workers were "
                                           "stopped and nothing was published (its reason, if any, is above)")
            time.sleep(POLL_SECONDS)
    finally:
        stop(workers)


def run_quietly(command: Sequence[str]) -> None:
    subprocess.run(list(command), capture_output=True, check=False)
