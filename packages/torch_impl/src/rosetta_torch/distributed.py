"""Data-parallel training on torch's own engine: `torch.distributed` (gloo on CPU, NCCL on CUDA) and
`DistributedDataParallel`, the same loop as train.py with each worker on its rows of every batch.

How the single-process step is kept (rosetta_common.distributed): every worker builds the model from the same
canonical init and DDP broadcasts rank 0's parameters once more when it wraps the module; worker r runs the
forward and the mean cross-entropy on its rows [r B/N, (r+1) B/N) of each global batch; during the backward,
DDP's reducer all-reduces each bucket of gradients and divides by the world size, which is the gradient of the
global batch's mean loss (equal shards); then each worker steps the same torch.optim optimizer
(train.make_optimizer) on the same gradient, so the replicas stay bitwise alike without another collective.
The LSTM's frozen bias_hh_l0 (requires_grad False) is not registered with DDP's reducer at all.

The engines, starting workers by hand, and how the runs are judged: docs/data-parallel.md.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rosetta_common.data import Dataset
from rosetta_common.distributed import Cluster, check_run, split_address
from rosetta_common.errors import DistributedError, one_line
from rosetta_common.interface import TrainResult
from rosetta_common.spec import ModelConfig
from rosetta_common.training import TrainPlan
from rosetta_common.weights import Weights
from rosetta_torch.models import build, default_device, model_device
from rosetta_torch.train import train_module

PROBE_INTERVAL = 0.2  # seconds between two attempts to reach a coordinator that is not listening yet
ENGINE_FAILURE = re.compile(r"gloo|nccl", re.IGNORECASE)  # a collective's RuntimeError names its library
SOURCE_PREFIX = re.compile(r"^\[[^]]*\]\s*")  # gloo's "[file.cc:line] " before the message


def start_worker(cluster: Cluster) -> None:
    """Join the process group as rank `cluster.rank` of `cluster.world`, rank 0's TCPStore at
    `cluster.coordinator` being the rendezvous; gloo on CPU, NCCL when the models will live on CUDA (the
    backend follows models.default_device, where build puts them). Waits at most `cluster.timeout_seconds`
    for the coordinator and the peers (that is also every later collective's timeout); a coordinator that
    cannot be reached, a port already in use or missing peers raise a one-line DistributedError naming the
    address. Call once per process, before train_data_parallel."""
    if dist.is_initialized():
        raise DistributedError(f"torch.distributed is already started in this process (rank {dist.get_rank()}); "
                               "call start_worker once")
    host, port = split_address(cluster.coordinator)
    who = f"torch.distributed rank {cluster.rank} of {cluster.world}"
    if cluster.rank != 0:
        # torch's TCPStore client retries its connect with the whole timeout per try (2 tries and a back-off:
        # 12.8 s for a 5 s timeout) and logs a C++ stack at each; waiting here keeps the bound and the message.
        _wait_for_coordinator(host, port, cluster.timeout_seconds, who)
    device = default_device()
    backend = "nccl" if device.type == "cuda" else "gloo"
    device_id = None
    if device.type == "cuda":
        # One GPU per worker on a host (NCCL refuses two ranks on one device): torchrun's LOCAL_RANK picks it,
        # and build()'s "cuda" then means that device.
        device_id = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device_id)
    try:
        # tcp:// with explicit rank and size (from the launcher's variables, Cluster.from_environment): under
        # torchrun, torch sees TORCHELASTIC_USE_AGENT_STORE and joins the agent's store at the same address.
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=cluster.rank,
                                world_size=cluster.world, timeout=timedelta(seconds=cluster.timeout_seconds),
                                device_id=device_id)
    except dist.DistError as error:
        message = one_line(str(error))
        if "EADDRINUSE" in message or "address already in use" in message.lower():
            raise DistributedError(f"{who}: port {port} on {host} is already in use, the coordinator cannot listen "
                                   "there; free it or choose another (data_parallel.port)") from None
        raise DistributedError(f"{who}: the process group at {cluster.coordinator} did not form within "
                               f"{cluster.timeout_seconds:g} s: {message}") from None


def _wait_for_coordinator(host: str, port: int, timeout: float, who: str) -> None:
    """Return once `host:port` accepts a TCP connection; a one-line DistributedError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(left, 5.0), 0.1)):
                return
        except socket.gaierror as error:
            raise DistributedError(f"{who}: coordinator address {host}:{port}: cannot resolve {host!r} "
                                   f"({error.strerror})") from None
        except OSError as error:
            if left <= PROBE_INTERVAL:
                reason = error.strerror or type(error).__name__
                raise DistributedError(f"{who}: could not reach the coordinator at {host}:{port} within "
                                       f"{timeout:g} s ({reason}); is rank 0 started there?") from None
        time.sleep(PROBE_INTERVAL)


def train_data_parallel(config: ModelConfig, weights: Weights, plan: TrainPlan, data: Dataset,
                        cluster: Cluster) -> tuple[torch.nn.Module, TrainResult]:
    """Build `config`'s model from the canonical `weights` and train it with the plan's optimizer on the plan's
    batches in the plan's order, this worker on its rows of each batch (and of each step's dropout mask), DDP
    averaging the gradients. step_losses are the global batches' mean losses (the workers' means all-reduced),
    the same on every rank. Returns the plain module (not the DDP wrapper) in eval mode, for predict,
    to_canonical and the exports."""
    rows = check_run(config.arch, plan.batch_size, cluster)  # before the engine is touched
    if not dist.is_initialized():
        raise DistributedError("torch.distributed is not started: call start_worker(cluster) first")
    if (dist.get_rank(), dist.get_world_size()) != (cluster.rank, cluster.world):
        raise DistributedError(f"cluster is rank {cluster.rank} of {cluster.world}, torch.distributed was started "
                               f"as rank {dist.get_rank()} of {dist.get_world_size()}")
    if plan.num_samples != len(data.train_labels):  # before the DDP wrap's collectives
        raise ValueError(f"plan for {plan.num_samples} training samples, data has {len(data.train_labels)}")
    model = build(config, weights)
    device = model_device(model)
    where = f"torch.distributed rank {cluster.rank} of {cluster.world} training {config.arch}"
    with _engine_errors(where):
        # Wrapping broadcasts rank 0's parameters and checks that every rank has the same shapes (collectives).
        ddp = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device])

    def global_losses(summed: torch.Tensor) -> torch.Tensor:
        # The global batch's mean loss is the mean of the equal shards' means: one all-reduce per epoch, whose sum
        # every rank receives alike, so every rank reports the same losses.
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        return summed / cluster.world

    # train.py's loop, on this worker's rows; the optimizer over the module's own parameters.
    with _engine_errors(where):
        result = train_module(model, ddp, plan, data, desc=f"torch {plan.arch} x{cluster.world}", rows=rows,
                              epoch_losses_of=global_losses, show=cluster.is_chief, workers=cluster.world,
                              engine=f"torch.distributed {dist.get_backend()} DDP")
    return model, result


@contextmanager
def _engine_errors(where: str) -> Iterator[None]:
    """The engine's failures inside a run (a peer that died, or stalled past the timeout) as one line. gloo
    raises them as plain RuntimeErrors naming its own source file ("[.../gloo/transport/tcp/pair.cc:553]
    Connection closed by peer ..."); any other RuntimeError is a bug of ours and keeps its traceback."""
    try:
        yield
    except RuntimeError as error:
        message = one_line(str(error))
        if not isinstance(error, dist.DistError) and not ENGINE_FAILURE.search(message):
            raise
        raise DistributedError(f"{where}: {SOURCE_PREFIX.sub('', message)}") from None


def stop_worker() -> None:
    """Leave the process group (closing gloo's connections and rank 0's store), so the process exits promptly;
    nothing to do if it was never started."""
    if dist.is_initialized():
        dist.destroy_process_group()
