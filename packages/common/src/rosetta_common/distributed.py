"""Data-parallel training, the framework-neutral part: who a worker is, and which rows of a batch are its own.

Each package's `distributed.py` runs its framework's own engine; what the three must agree on lives in this module.
A worker (`Cluster`) is read from the variables its engine's own launcher sets, so a worker Rosetta's launcher
starts and one started by hand on another host are the same program. Of each global batch of B rows, worker r takes
the contiguous rows [r B/N, (r+1) B/N) and the dropout mask's rows of the same samples (`Cluster.rows`). With the
same weights and plan on every worker, and each worker's loss the mean over its equal share, the engine's average of
their gradients is the gradient of the global batch's mean loss: N workers take the single process's step, up to
float32 summation order.

The engines and their variables, and starting workers by hand: docs/data-parallel.md.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from rosetta_common.errors import DistributedError

# The variables each framework's engine is configured from (docs/data-parallel.md's table): torch's are what
# `torchrun` sets; TF_CONFIG lists every worker's address and this worker's index.
ENGINE_VARIABLES: dict[str, tuple[str, ...]] = {
    "torch": ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"),
    "jax": ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"),
    "tf": ("TF_CONFIG",),
}
TIMEOUT_VARIABLE = "ROSETTA_DP_TIMEOUT"  # seconds an engine may wait for its peers (start-up, a collective)
DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Cluster:
    """One worker's view of a data-parallel run."""

    rank: int
    world: int
    # "host:port" of each rank. torch and JAX need only rank 0's (the coordinator); TF's ring needs all.
    addresses: tuple[str, ...]
    timeout_seconds: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        if self.world < 1:
            raise DistributedError(f"world size = {self.world}: must be at least 1")
        if not 0 <= self.rank < self.world:
            raise DistributedError(f"rank = {self.rank}: must be in 0..{self.world - 1} for {self.world} workers")
        if not self.addresses:
            raise DistributedError("no coordinator address: give rank 0's host:port")
        for address in self.addresses:
            split_address(address)

    @property
    def coordinator(self) -> str:
        return self.addresses[0]

    @property
    def is_chief(self) -> bool:
        """Rank 0 writes the outputs."""
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """This worker's contiguous rows of a global batch of `batch_size` (one of
        rosetta_common.training.TrainPlan.batches), and of that step's dropout mask."""
        if batch_size % self.world:
            raise DistributedError(
                f"train.batch_size = {batch_size}: must divide by the {self.world} data-parallel workers"
            )
        share = batch_size // self.world
        return slice(self.rank * share, (self.rank + 1) * share)

    def environment(self, framework: str) -> dict[str, str]:
        """The variables that start `framework`'s engine as this worker (the inverse of from_environment)."""
        host, port = split_address(self.coordinator)
        variables = {
            "torch": {"MASTER_ADDR": host, "MASTER_PORT": str(port), "RANK": str(self.rank),
                      "LOCAL_RANK": str(self.rank), "WORLD_SIZE": str(self.world)},  # one host: a device each
            "jax": {"JAX_COORDINATOR_ADDRESS": self.coordinator, "JAX_NUM_PROCESSES": str(self.world),
                    "JAX_PROCESS_ID": str(self.rank)},
            "tf": {"TF_CONFIG": json.dumps({"cluster": {"worker": list(self.addresses)},
                                            "task": {"type": "worker", "index": self.rank}})},
        }
        if framework not in variables:
            raise DistributedError(f"framework = {framework!r}: unknown; allowed: {', '.join(variables)}")
        return {**variables[framework], TIMEOUT_VARIABLE: str(self.timeout_seconds)}

    @classmethod
    def from_environment(cls, framework: str, env: Mapping[str, str] | None = None) -> Cluster:
        """This worker, from the variables of `framework`'s own launcher (a one-line error if one is missing)."""
        env = os.environ if env is None else env
        if framework not in ENGINE_VARIABLES:
            raise DistributedError(f"framework = {framework!r}: unknown; allowed: {', '.join(ENGINE_VARIABLES)}")
        missing = [name for name in ENGINE_VARIABLES[framework] if not env.get(name)]
        if missing:
            raise DistributedError(
                f"{framework} data-parallel worker: {', '.join(missing)} not set "
                f"(set {', '.join(ENGINE_VARIABLES[framework])}; docs/data-parallel.md, 'Two hosts')"
            )
        timeout = _number(env, TIMEOUT_VARIABLE, float, str(DEFAULT_TIMEOUT))
        if framework == "torch":
            return cls(_number(env, "RANK", int), _number(env, "WORLD_SIZE", int),
                       (f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",), timeout)
        if framework == "jax":
            return cls(_number(env, "JAX_PROCESS_ID", int), _number(env, "JAX_NUM_PROCESSES", int),
                       (env["JAX_COORDINATOR_ADDRESS"],), timeout)
        try:
            config = json.loads(env["TF_CONFIG"])
            workers, index = list(config["cluster"]["worker"]), int(config["task"]["index"])
        except (ValueError, KeyError, TypeError) as error:
            raise DistributedError(
                f"TF_CONFIG = {env['TF_CONFIG']!r}: not a cluster description "
                '({"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}})'
            ) from error
        return cls(index, len(workers), tuple(workers), timeout)


def _number(env: Mapping[str, str], name: str, kind: type, default: str | None = None) -> float | int:
    text = env.get(name, default)
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise DistributedError(f"{name} = {text!r}: not a{'n integer' if kind is int else ' number'}") from None


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port", or a one-line error naming the address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(f"address = {address!r}: must be host:port with a port in 1..65535")
    return host, int(port)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports on `host` that nothing listens on now (the kernel's choice)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def check_port_free(host: str, port: int) -> None:
    """A one-line error if `port` on `host` cannot be bound (before a worker fails on it less clearly), saying why:
    taken, not allowed, or `host` not an address of this machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as error:
            why = {errno.EADDRINUSE: "is already in use", errno.EACCES: "may not be bound by this user",
                   errno.EADDRNOTAVAIL: f"cannot be bound: {host} is not an address of this machine"}
            raise DistributedError(f"port {port} on {host} {why.get(error.errno, 'cannot be bound')} "
                                   f"({error.strerror}); free it or choose another (data_parallel.port)") from None


# BatchNorm normalizes each worker's rows with their own statistics, not the global batch's: data-parallel
# training would be a different model (a synchronized BatchNorm is not wired in any of the three packages).
UNSUPPORTED = {"resnet": "its BatchNorm would normalize each worker's rows with their own batch statistics"}


def check_supported(arch: str) -> None:
    if arch in UNSUPPORTED:
        raise DistributedError(f"data_parallel.models: {arch!r} cannot train data-parallel: {UNSUPPORTED[arch]}; "
                               f"allowed: models without BatchNorm")


def check_run(arch: str, batch_size: int, cluster: Cluster) -> slice:
    """Refuse a run the workers cannot share (before the engine is touched); this worker's rows of a batch."""
    check_supported(arch)
    return cluster.rows(batch_size)
