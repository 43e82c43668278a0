"""Data-parallel training on TensorFlow's own engine: tf.distribute.MultiWorkerMirroredStrategy over gRPC, the
same step as train.py with each worker on its rows of every batch.

How the single-process step is kept (rosetta_common.distributed): each worker process is one replica (its CPU, or
its first GPU), and the strategy's ring all-reduce sums across the workers, so no collective is written by hand. The
step is what Keras' fit runs in train.train (the same model, training twin, optimizer and loss), written as a custom
loop because every worker feeds its own rows of each global batch; under the strategy, Keras' loss scaling and the
optimizer's gradient sum make it the single-process step on the global batch (the comment above replica_step says
how). A peer that dies or hangs is a one-line DistributedError within the cluster's timeout.

The engines, starting workers by hand, and how the runs are judged: docs/data-parallel.md.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

# Not in TF's public API: the coordination service's configuration, which MultiWorkerMirroredStrategy reads from
# the eager context (and keeps if it is already set); its public constructor has no timeout for start-up.
from tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2 import CoordinatedJob
from tensorflow.python.eager import context
from tqdm.auto import tqdm

from rosetta_common.data import Dataset
from rosetta_common.distributed import Cluster, check_port_free, check_run, split_address
from rosetta_common.errors import DistributedError, one_line
from rosetta_common.interface import TrainResult
from rosetta_common.spec import ModelConfig
from rosetta_common.training import TrainPlan, dropout_masks
from rosetta_common.weights import Weights
from rosetta_tf.models import build, training_view
from rosetta_tf.train import check_inputs, make_loss, make_optimizer, plan_batches, train_result
from rosetta_tf.weights import to_canonical

ENGINE = "tf.distribute.MultiWorkerMirroredStrategy, gRPC ring all-reduce"
JOB = "worker"  # the TF_CONFIG job every Rosetta worker is in (rank 0 is also the coordinator)

# What a collective raises when a peer is gone or too slow (the CommunicationOptions timeout).
PEER_ERRORS = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.AbortedError,
               tf.errors.CancelledError)

# A TF status from a graph function starts with lines that locate the op; _message skips them.
_FUNCTION_NODE = re.compile(r"^(\{\{[^}]*\}\}\s*)+")
_BOILERPLATE = re.compile(r"^(Graph execution error:|Detected at node |File \")")

# The one strategy of this process: TF configures its collective ops and starts this worker's gRPC server once
# per process, at start-up, and cannot configure them again.
_STARTED = False
_STRATEGY: tf.distribute.MultiWorkerMirroredStrategy | None = None
_CLUSTER: Cluster | None = None


def start_worker(cluster: Cluster) -> None:
    """Start this process as worker `cluster.rank` of `cluster.world` of a MultiWorkerMirroredStrategy.

    Call once per process, before train_data_parallel and before any other TF op: the strategy configures TF's
    collective ops and starts this worker's gRPC server on its address in `cluster.addresses`. Waits at most
    `cluster.timeout_seconds` for the peers; a port in use, an unreachable coordinator or peers that never join
    raise a one-line DistributedError naming the address.
    """
    global _STARTED, _STRATEGY, _CLUSTER
    if _STARTED:
        raise DistributedError("tf data-parallel worker: start_worker was already called in this process "
                               "(TF configures its collective ops once per process)")
    host, port = split_address(cluster.addresses[cluster.rank])
    check_port_free(host, port)  # TF would otherwise fail on it later, with a multi-line C++ status
    if cluster.rank != 0:
        _wait_for_coordinator(cluster)
    _STARTED = True  # from here on TF's configuration is this process's, whether the strategy comes up or not
    timeout_ms = int(cluster.timeout_seconds * 1000)
    # The coordination service (hosted by rank 0) is how the workers find each other. MultiWorkerMirroredStrategy
    # configures it with no start-up bound (rank 0 would wait forever for a worker that never comes); configured
    # here first, registering is a barrier of every worker that fails after the cluster's timeout, a dead peer is
    # noticed after it, and the shutdown every worker does when it exits waits for the others at most as long.
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=f"/job:{JOB}/replica:0/task:0",
        cluster_register_timeout_in_ms=timeout_ms, heartbeat_timeout_in_ms=timeout_ms,
        shutdown_barrier_timeout_in_ms=timeout_ms, coordinated_jobs=[CoordinatedJob(name=JOB, num_tasks=cluster.world)])
    context.context().coordination_service.cluster_register_with_barrier = True
    # The cluster from `cluster` itself (not re-read from TF_CONFIG): the same description however it was given.
    # One replica per worker, its first GPU or else its CPU: each worker feeds one value (its rows) per step.
    gpus = {"GPU": 1} if tf.config.list_physical_devices("GPU") else {}
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({JOB: list(cluster.addresses)}), task_type=JOB, task_id=cluster.rank, rpc_layer="grpc",
        num_accelerators=gpus)
    # RING: the gRPC collectives, which run on CPU (NCCL needs GPUs). No timeout_seconds: TF arms each timed
    # collective with a thread of its own that sleeps out the whole timeout (base_collective_executor.cc), so a
    # run of a few hundred steps a second held tens of thousands of threads until thread creation failed. A peer
    # that died or hangs is caught by the coordination service's heartbeat and by the run's Watchdog instead.
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    where = f"tf data-parallel worker {cluster.rank} of {cluster.world} ({', '.join(cluster.addresses)})"
    try:
        _STRATEGY = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                              communication_options=options)
    except RuntimeError as error:  # "Collective ops must be configured at program startup"
        raise DistributedError(f"{where}: {one_line(str(error))}: call start_worker before any other TF "
                               "operation of the process") from None
    except tf.errors.OpError as error:
        raise DistributedError(f"{where}: not every worker joined within {cluster.timeout_seconds:g} s: "
                               f"{_message(error)}") from None
    _CLUSTER = cluster


def _wait_for_coordinator(cluster: Cluster) -> None:
    """Wait until rank 0's gRPC server accepts connections, at most `cluster.timeout_seconds`.

    TF's coordination client would also give up (the registration barrier above), after a longer time and with a
    gRPC status; probing the address first makes an unreachable coordinator a one-line error that names it.
    """
    host, port = split_address(cluster.coordinator)
    deadline = time.monotonic() + cluster.timeout_seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(1.0, cluster.timeout_seconds)):
                return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise DistributedError(
                    f"tf data-parallel worker {cluster.rank}: the coordinator (rank 0) at {cluster.coordinator} "
                    f"did not answer within {cluster.timeout_seconds:g} s ({error.strerror or error}); "
                    "start rank 0 there first, or fix TF_CONFIG") from None
        time.sleep(0.2)


def _strategy(cluster: Cluster) -> tf.distribute.MultiWorkerMirroredStrategy:
    if _STRATEGY is None or cluster != _CLUSTER:
        raise DistributedError(f"tf data-parallel worker {cluster.rank}: not started for this cluster; call "
                               "start_worker(cluster) first (once per process)")
    return _STRATEGY


def train_data_parallel(config: ModelConfig, weights: Weights, plan: TrainPlan, data: Dataset,
                        cluster: Cluster) -> tuple[keras.Model, TrainResult]:
    """Train a model of `config` from the canonical `weights` on this worker's rows of the plan's batches, the
    gradients summed over the workers by the strategy's all-reduce.

    Returns the trained model, a plain Keras model as build makes it (predict, to_canonical and the exports work
    on it as on a single-process one), and every step's loss over the global batch, the same on every worker.
    """
    rows = check_run(config.arch, plan.batch_size, cluster)  # refuses before the engine is touched
    strategy = _strategy(cluster)
    if plan.arch != config.arch:
        raise ValueError(f"plan.arch = {plan.arch!r}: the model is a {config.arch} model; allowed: {config.arch!r}")
    check_inputs(config, data)
    masks = dropout_masks(plan, config)  # None for a model without dropout
    with strategy.scope():  # mirrored variables (their initial values broadcast from rank 0), then the weights
        model = build(config, weights)
        trainer = training_view(model)
        optimizer = make_optimizer(model, plan.optimizer, plan.num_steps)
        optimizer.build(trainer.trainable_variables)  # its slots mirrored too, before the step is traced
        loss_fn = make_loss()
    # This worker's own input pipeline: its rows of every global batch (and of the step's mask), in plan order.
    # Each step's batch becomes this worker's value of a per-replica input (one replica per worker). Not
    # distribute_datasets_from_function: its iterator costs about twice the step time and seconds to tear down.
    batches = iter(plan_batches(plan, data, masks, rows))

    # Worker r takes rows [r B/N, (r+1) B/N) of each global batch and the same rows of the dropout mask. Its loss
    # is the mean over its rows, which Keras' loss divides by the number of replicas when it runs under a strategy
    # (keras.src.losses.loss.scale_loss_for_distribution): the worker's share of the global batch's mean loss. The
    # Keras optimizer, applied in the replica context, first sums the gradients of every worker with the strategy's
    # all-reduce (keras.src.backend.tensorflow.optimizer: _all_reduce_sum_gradients): the sum of the shares'
    # gradients is the gradient of the global batch's mean loss, so every replica takes the single-process step on
    # the same (mirrored) variables. The step loss reported is the strategy's sum of the shares: the global batch's
    # mean loss, the same on every worker.
    def replica_step(inputs: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, trainer(inputs, training=True))  # this worker's mean / number of workers
        grads = tape.gradient(loss, trainer.trainable_variables)
        optimizer.apply_gradients(zip(grads, trainer.trainable_variables, strict=True))  # all-reduce, update
        return loss

    @tf.function  # one graph per model, as fit's train function
    def train_step(batch: Any) -> Any:
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=batch), axis=None)

    bar = tqdm(total=plan.num_steps, desc=f"tf {plan.arch} x{cluster.world}", unit="step", leave=False,
               disable=not cluster.is_chief)
    losses: list[float] = []
    epoch_seconds: list[float] = []
    start = time.perf_counter()
    try:
        with Watchdog(cluster.timeout_seconds, f"{plan.arch} on worker {cluster.rank}") as watchdog:
            for epoch in range(plan.epochs):
                epoch_start = time.perf_counter()
                for _ in range(plan.steps_per_epoch):
                    batch = next(batches)
                    inputs = strategy.experimental_distribute_values_from_function(lambda _, batch=batch: batch)
                    losses.append(float(np.float32(train_step(inputs))))
                    watchdog.beat()
                    bar.update(1)
                epoch_seconds.append(time.perf_counter() - epoch_start)
                bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}")
    except PEER_ERRORS as error:
        raise DistributedError(f"tf data-parallel worker {cluster.rank}: {plan.arch} step {len(losses) + 1} of "
                               f"{plan.num_steps}: a peer failed or did not answer within "
                               f"{cluster.timeout_seconds:g} s: {_message(error)}") from None
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    # A plain copy outside the strategy: no mirrored variables or collectives left in what predict and the
    # exports trace.
    local = build(config, to_canonical(model))
    return local, train_result(plan, losses, seconds, epoch_seconds, workers=cluster.world, engine=ENGINE)


class Watchdog:
    """One thread per training run that aborts TF's collectives when no step has finished for `seconds`.

    What CommunicationOptions(timeout_seconds=...) would do, without its thread per collective: a step stuck on a
    peer that hangs (alive to the coordination service's heartbeat, but never joining the all-reduce) fails with
    DEADLINE_EXCEEDED after `seconds` instead of waiting forever. Aborted collectives stay aborted in this
    process, which then ends with the error.
    """

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds, self.what = seconds, what
        self._last = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rosetta-tf-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def beat(self) -> None:
        """A step finished: the next one has `seconds` again."""
        self._last = time.monotonic()

    def _watch(self) -> None:
        while not self._done.wait(min(1.0, self.seconds / 4)):
            if time.monotonic() - self._last > self.seconds:
                context.context().abort_collective_ops(
                    tf.errors.DEADLINE_EXCEEDED, f"{self.what}: no step finished within {self.seconds:g} s")
                return


def stop_worker() -> None:
    """Leave the cluster: wait (at most the cluster's timeout) until every worker got here, so that none exits
    while another still needs it; TF's coordination client then shuts down when the process exits."""
    global _STRATEGY, _CLUSTER
    if _STRATEGY is None or _CLUSTER is None:
        return
    cluster, _STRATEGY, _CLUSTER = _CLUSTER, None, None
    try:
        context.context().wait_at_barrier("rosetta_stop_worker", int(cluster.timeout_seconds * 1000))
    except tf.errors.OpError as error:
        raise DistributedError(f"tf data-parallel worker {cluster.rank}: could not leave the cluster (each worker "
                               f"waits at most {cluster.timeout_seconds:g} s for the others): {_message(error)}"
                               ) from None


def _message(error: tf.errors.OpError) -> str:
    """The cause in a TF status, on one line: its first line that is not the graph-function boilerplate ("Graph
    execution error:", "Detected at node", a Python traceback, a "{{function_node ...}}" prefix)."""
    for line in error.message.splitlines():
        line = _FUNCTION_NODE.sub("", line.strip())
        if line and not _BOILERPLATE.match(line):
            return line
    return one_line(error.message)
