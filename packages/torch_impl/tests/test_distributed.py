"""torch's own data-parallel details (the conformance suite checks 2 workers against 1 process): start_worker's
failures as one line naming the address within a bounded time (an unreachable coordinator, a port in use,
peers that never come), a peer that dies mid-run as one line (gloo raises plain RuntimeErrors), and one
worker's run returning the plain module that predict, to_canonical and the exports take as they are."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import rosetta_torch
from rosetta_common.distributed import Cluster, free_ports
from rosetta_common.errors import DistributedError
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan

TIMEOUT = 4.0  # seconds a worker waits for its peers here: small, so that each failure shows quickly
SLACK = 3.0  # start_worker's own time beyond the timeout (torch's store gives rank 0 one more second)
PROCESS_BOUND = 30.0  # a worker process, torch's import included, must have ended by then

# One worker as the launcher starts it: its variables in the environment; prints start_worker's one-line
# error and the seconds it took, or trains mlp (rank 0) / exits at once (rank 1) for "die".
WORKER = """
import os, sys, time
import rosetta_torch
from rosetta_common.distributed import Cluster
from rosetta_common.errors import DistributedError
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan
cluster = Cluster.from_environment("torch")
start = time.perf_counter()
try:
    rosetta_torch.start_worker(cluster)
    if sys.argv[1] == "die":
        if cluster.rank == 1:
            os._exit(0)  # gone without stop_worker, as a crashed worker
        config, data = small_config("mlp"), learnable_data()
        rosetta_torch.train_data_parallel(config, asymmetric_weights(config, 11),
                                          plan(small_spec(), "mlp", len(data.train_labels)), data, cluster)
except DistributedError as error:
    print(f"{time.perf_counter() - start:.2f}", error, sep="\\n", flush=True)
    sys.exit(3)
"""


def _workers(ranks: list[int], world: int, address: str, mode: str = "start") -> list[tuple[int, str, float]]:
    """Start one worker process per rank; (exit code, output, seconds until it ended) of each."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, **Cluster(rank, world, (address,), TIMEOUT).environment("torch")})
             for rank in ranks]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=PROCESS_BOUND * 2)
            results.append((proc.returncode, out + err, time.perf_counter() - started))
    finally:
        for proc in procs:
            proc.kill()
    return results


def _one_line_error(result: tuple[int, str, float], bound: float = PROCESS_BOUND) -> tuple[str, float]:
    """The DistributedError's message and its seconds since start_worker began, checking the process ended
    within `bound` seconds."""
    code, output, seconds = result
    assert code == 3, f"worker exited {code}:\n{output[-3000:]}"
    assert seconds < bound, f"worker ended after {seconds:.1f} s"
    took, message = output.split("\n")[:2]
    return message, float(took)


def test_an_unreachable_coordinator_is_one_line_within_the_timeout() -> None:
    (port,) = free_ports(1)  # nothing listens there
    message, took = _one_line_error(_workers([1], 2, f"127.0.0.1:{port}")[0])
    assert f"could not reach the coordinator at 127.0.0.1:{port} within {TIMEOUT:g} s" in message
    assert TIMEOUT - 0.5 <= took <= TIMEOUT + SLACK  # it waited for rank 0, and no longer than it was told


def test_a_port_in_use_is_one_line_at_once() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message, took = _one_line_error(_workers([0], 2, f"127.0.0.1:{port}")[0])
    assert f"port {port} on 127.0.0.1 is already in use" in message
    assert took < TIMEOUT


def test_peers_that_never_come_are_one_line_within_the_timeout() -> None:
    (port,) = free_ports(1)
    message, took = _one_line_error(_workers([0], 2, f"127.0.0.1:{port}")[0])
    assert f"the process group at 127.0.0.1:{port} did not form within {TIMEOUT:g} s" in message
    assert took <= TIMEOUT + SLACK


def test_a_worker_that_dies_is_one_line_on_the_others() -> None:
    (port,) = free_ports(1)
    survivor, gone = _workers([0, 1], 2, f"127.0.0.1:{port}", mode="die")
    assert gone[0] == 0, gone[1][-3000:]
    message, _ = _one_line_error(survivor, bound=PROCESS_BOUND * 2)  # two torch imports on a shared machine
    assert message.startswith("torch.distributed rank 0 of 2 training mlp: "), message
    assert "[/" not in message  # gloo's source-file prefix is dropped


def test_training_before_start_worker_is_refused() -> None:
    assert not dist.is_initialized()
    config, data = small_config("mlp"), learnable_data()
    with pytest.raises(DistributedError, match=r"call start_worker\(cluster\) first"):
        rosetta_torch.train_data_parallel(config, asymmetric_weights(config, 11),
                                          plan(small_spec(), "mlp", len(data.train_labels)), data,
                                          Cluster(0, 1, ("127.0.0.1:1",)))


@pytest.fixture(scope="module")
def one_worker() -> Iterator[Cluster]:
    """This process as the one worker of a world of 1 (gloo, loopback); left again after the module."""
    (port,) = free_ports(1)
    cluster = Cluster(0, 1, (f"127.0.0.1:{port}",), 30.0)
    rosetta_torch.start_worker(cluster)
    try:
        yield cluster
    finally:
        rosetta_torch.stop_worker()
    assert not dist.is_initialized()


@pytest.mark.parametrize("arch", ["cnn", "lstm"])
def test_one_worker_returns_the_plain_module_trained_as_train_does(one_worker: Cluster, arch: str,
                                                                   tmp_path: Path) -> None:
    """A world of 1 is train() exactly (DDP divides by 1); the result is the module itself, not the DDP
    wrapper, in eval mode, with the LSTM's bias_hh still frozen at zero; the exports take it as it is."""
    config, data = small_config(arch), learnable_data()
    train_plan = plan(small_spec(), arch, len(data.train_labels))
    model, result = rosetta_torch.train_data_parallel(config, asymmetric_weights(config, 11), train_plan, data,
                                                      one_worker)
    single = rosetta_torch.build(config, asymmetric_weights(config, 11))
    expected = rosetta_torch.train(single, train_plan, data)

    assert type(model) is type(single) and not model.training
    assert result.workers == 1 and result.engine == "torch.distributed gloo DDP"
    assert len(result.epoch_seconds) == train_plan.epochs
    np.testing.assert_array_equal(result.step_losses, expected.step_losses)
    for name, value in rosetta_torch.to_canonical(single).items():
        np.testing.assert_array_equal(rosetta_torch.to_canonical(model)[name], value, err_msg=name)
    if arch == "lstm":
        assert not model.lstm.bias_hh_l0.requires_grad and not torch.any(model.lstm.bias_hh_l0)

    images = data.test_inputs[:5]
    rosetta_torch.export_native(model, tmp_path / "native", images[:1])
    rosetta_torch.export_onnx(model, tmp_path / "model.onnx", images[:1])
    for name, predict in rosetta_torch.load_native(tmp_path / "native").items():
        np.testing.assert_allclose(predict(images), rosetta_torch.predict(model, images), atol=1e-5, err_msg=name)
    assert (tmp_path / "model.onnx").stat().st_size > 0
