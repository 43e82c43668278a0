"""Data-parallel training on JAX's own engine: jax.distributed's multi-process runtime and one global Mesh, the
same step as train.py with each worker on its rows of every batch.

How the single-process step is kept (rosetta_common.distributed): `jax.distributed.initialize` joins the processes
through the coordination service rank 0 serves, and each then sees every process's device (on CPU the collectives
are gloo's, over TCP). One global `Mesh` over them, the batch a global array sharded on its "data" axis (each
process supplies its own rows), the parameters and optimizer state replicated: the jitted step is train.py's own,
the gradient of the GLOBAL batch's mean loss, and XLA's SPMD partitioner inserts the all-reduce that sums the
workers' partial gradients (and the loss), so no collective is written by hand. jax aborts a process that cannot
register rather than raising, so start_worker first checks what it can (the comment above it says how).

The engines, starting workers by hand, and how the runs are judged: docs/data-parallel.md.
"""

from __future__ import annotations

import errno
import math
import socket
import time
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rosetta_common.data import Dataset
from rosetta_common.distributed import Cluster, check_run, split_address
from rosetta_common.errors import DistributedError, one_line
from rosetta_common.interface import TrainResult
from rosetta_common.spec import ModelConfig
from rosetta_common.training import TrainPlan, dropout_masks
from rosetta_common.weights import Weights
from rosetta_jax.models import Model, build, training_view
from rosetta_jax.train import TrainState, make_optimizer, make_train_step, run_epochs, training_inputs

_POLL_SECONDS = 0.2  # how often a worker retries the coordinator's address while it waits for rank 0


def _check_coordinator_port(host: str, port: int) -> None:
    """Rank 0 serves the coordinator on `port`: a one-line error if it cannot (jax would abort instead)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise DistributedError(f"jax coordinator {host}:{port}: cannot resolve {host!r} ({error.strerror})") from None
    with socket.socket(family, kind, proto) as s:
        try:
            s.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise DistributedError(f"jax coordinator {host}:{port}: port {port} is already in use; free it or "
                                       "choose another (data_parallel.port)") from None
            raise DistributedError(f"jax coordinator {host}:{port}: rank 0 cannot serve it here ({error.strerror}); "
                                   "the coordinator address must be rank 0's own") from None


def _wait_for_coordinator(host: str, port: int, deadline: float, timeout: float) -> None:
    """Block until something accepts connections at host:port (rank 0's coordinator), or a one-line error at
    `deadline` (jax's own client would abort the process instead of raising)."""
    last = "no answer"
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                return
        except OSError as error:
            last = error.strerror or type(error).__name__
        if time.monotonic() + _POLL_SECONDS >= deadline:
            raise DistributedError(f"jax coordinator {host}:{port} unreachable: no connection within {timeout:g} s "
                                   f"({last}); is rank 0 running there? (ROSETTA_DP_TIMEOUT)")
        time.sleep(_POLL_SECONDS)


# What jax 0.10 does on a failure, and what is done about it:
# - jax's coordination client does not raise when it cannot register: its error callback aborts the process
#   (SIGABRT, a multi-line "Terminating process because the JAX distributed service detected fatal errors ...
#   DEADLINE_EXCEEDED ... RegisterTask" log), and jax.distributed.initialize offers no hook to change that. So
#   start_worker checks first, within the timeout, what it can check with a plain socket: on rank 0 that the
#   coordinator's port can be bound, on the other ranks that something accepts connections at the coordinator's
#   address; either failure is a one-line DistributedError naming the address.
# - What cannot be checked before (rank 0 whose peers never come, a worker that dies mid-run) stays jax's
#   abort, bounded by the same timeout (initialization_timeout, heartbeat_timeout_seconds).
def start_worker(cluster: Cluster) -> None:
    """Join JAX's multi-process engine as process `cluster.rank` of `cluster.world` (coordinator: rank 0's
    address). Waits at most `cluster.timeout_seconds` for the peers; call once, before any JAX computation."""
    start = time.monotonic()
    deadline = start + cluster.timeout_seconds
    host, port = split_address(cluster.coordinator)
    if cluster.rank == 0:
        _check_coordinator_port(host, port)
    else:
        _wait_for_coordinator(host, port, deadline, cluster.timeout_seconds)
    seconds = max(1, math.ceil(deadline - time.monotonic()))  # jax takes whole seconds
    # gloo is jax 0.10's default CPU collective already; said explicitly because without a cross-process
    # implementation the CPU client would have no way to all-reduce across processes (mpi is not installed).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=cluster.coordinator, num_processes=cluster.world, process_id=cluster.rank,
            initialization_timeout=seconds,
            heartbeat_timeout_seconds=max(1, math.ceil(cluster.timeout_seconds)),  # a dead peer: abort after it
            shutdown_timeout_seconds=max(1, math.ceil(cluster.timeout_seconds)),  # stop_worker's barrier
        )
        jax.devices()  # starts the backend now, so that the global device topology is exchanged within start_worker
    except (RuntimeError, ValueError) as error:  # e.g. called twice, or after JAX had already started
        raise DistributedError(f"jax coordinator {cluster.coordinator}: rank {cluster.rank} could not join: "
                               f"{one_line(str(error))}") from None
    if jax.process_count() != cluster.world or jax.process_index() != cluster.rank:
        raise DistributedError(f"jax coordinator {cluster.coordinator}: joined as process {jax.process_index()} of "
                               f"{jax.process_count()}, expected {cluster.rank} of {cluster.world}")


def _mesh(cluster: Cluster) -> Mesh:
    """One "data" axis over every process's devices in process order, so that process r's rows of a global
    batch are rows [r B/N, (r+1) B/N) (Cluster.rows) and each process supplies exactly its own."""
    if jax.process_count() != cluster.world or jax.process_index() != cluster.rank:
        raise DistributedError(f"jax runs {jax.process_count()} process(es), this one {jax.process_index()}; the "
                               f"cluster is rank {cluster.rank} of {cluster.world}: call start_worker(cluster) first")
    return Mesh(np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))), ("data",))


def _replicate(tree: Any, sharding: NamedSharding) -> Any:
    """Every process holds the same values (the same canonical weights): each supplies its full copy."""
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x), np.shape(x)), tree)


def _local(tree: Any) -> Any:
    """This process's copy of replicated arrays: ordinary single-device arrays, as single-process train has."""
    return jax.tree.map(lambda x: x.addressable_data(0), tree)


def train_data_parallel(config: ModelConfig, weights: Weights, plan: TrainPlan, data: Dataset,
                        cluster: Cluster) -> tuple[Model, TrainResult]:
    """Train the model of `config`, built from `weights` on every worker, as train() would with the whole
    batch, with this worker computing on its rows of every batch (and of every dropout mask). Returns the
    trained single-device model in inference mode and the GLOBAL batch's loss of every step."""
    rows = check_run(config.arch, plan.batch_size, cluster)  # before the engine is touched
    if plan.arch != config.arch:
        raise ValueError(f"train_data_parallel: plan for {plan.arch!r} but the config is {config.arch!r}")
    mesh = _mesh(cluster)
    replicated, batch_rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def shard(local: np.ndarray) -> jax.Array:  # this worker's rows -> its part of the global batch
        return jax.make_array_from_process_local_data(batch_rows, local, (plan.batch_size, *local.shape[1:]))

    model = build(config, weights)
    tx = make_optimizer(model, plan.optimizer, plan.schedule_steps)
    graphdef, params, statistics = nnx.split(training_view(model), nnx.Param, nnx.BatchStat)
    params, statistics = _replicate(params, replicated), _replicate(statistics, replicated)
    opt_state = jax.jit(tx.init, out_shardings=replicated)(params)
    # train.py's step, unchanged: the mean loss of the global batch. Its outputs are pinned replicated, so
    # the partitioner all-reduces the gradient (and the loss) rather than leaving them split over workers.
    train_step = jax.jit(make_train_step(graphdef, tx), out_shardings=replicated)
    masks = dropout_masks(plan, config)  # None for a model without dropout; else row s is step s's mask
    inputs = training_inputs(config, data)  # checked; token ids as JAX's int32, as train() takes them

    def step(state: TrainState, idx: np.ndarray, s: int) -> tuple[TrainState, jax.Array]:
        own = idx[rows]
        mask = None if masks is None else shard(masks[s][rows])
        *state, loss = train_step(*state, shard(inputs[own]), shard(data.train_labels[own]), mask)
        return tuple(state), loss

    def read(losses: list[jax.Array]) -> list[float]:
        # The loss is already the global batch's (one all-reduced value, the same on every worker).
        return [float(np.asarray(v.addressable_data(0))) for v in losses]

    collectives = "gloo CPU collectives" if jax.default_backend() == "cpu" else f"{jax.default_backend()} collectives"
    engine = f"jax.distributed, {collectives}: XLA SPMD all-reduce over a global mesh of {mesh.size} devices"
    (params, statistics, _), result = run_epochs(plan, (params, statistics, opt_state), step, read,
                                                 desc=f"jax {plan.arch} x{cluster.world}", show=cluster.is_chief,
                                                 workers=cluster.world, engine=engine)
    nnx.update(model, _local(params), _local(statistics))
    return model, result


def stop_worker() -> None:
    """Leave JAX's engine: the processes meet at a shutdown barrier, then the coordinator stops (rank 0)."""
    jax.distributed.shutdown()
