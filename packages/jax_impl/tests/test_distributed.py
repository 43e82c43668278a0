"""JAX specifics of data-parallel training: start_worker's failures are one line and bounded (jax's own client
would abort the process), and the global-mesh step on one worker is train()'s step.

The failures run start_worker in a fresh process: jax.distributed.initialize must come before JAX starts its
backend, and jax allows it once per process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import rosetta_jax
from rosetta_common.distributed import Cluster, free_ports
from rosetta_common.errors import DistributedError
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan

TIMEOUT = 5.0  # ROSETTA_DP_TIMEOUT of the failing workers
BOUND = 30.0  # a failing worker must have exited within this (process start and imports included)

WORKER = textwrap.dedent("""
    import sys
    import rosetta_jax
    from rosetta_common.distributed import Cluster
    from rosetta_common.errors import DistributedError
    rosetta_jax.configure(0)
    if "--jax-started" in sys.argv:
        import jax
        jax.devices()  # JAX's backend is up: too late to join an engine
    try:
        rosetta_jax.start_worker(Cluster.from_environment("jax"))
    except DistributedError as error:
        print(f"DistributedError: {error}")
        sys.exit(3)
    rosetta_jax.stop_worker()
""")


def _start_worker(coordinator: str, rank: int, world: int = 2, *flags: str
                  ) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, **Cluster(rank, world, (coordinator,), TIMEOUT).environment("jax")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WORKER, *flags], env=env, capture_output=True, text=True,
                          timeout=60)
    return done, time.monotonic() - start


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 3, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("DistributedError: ")]
    assert len(lines) == 1, done.stdout
    return lines[0]


def test_an_unreachable_coordinator_is_one_line_within_the_timeout() -> None:
    (port,) = free_ports(1)  # nothing listens there: rank 0 never started
    done, seconds = _start_worker(f"127.0.0.1:{port}", rank=1)
    message = _one_line_error(done)
    assert f"127.0.0.1:{port} unreachable" in message
    assert seconds < BOUND, f"start_worker gave up after {seconds:.1f} s"
    print(f"unreachable coordinator: {seconds:.1f} s: {message}")


def test_a_coordinator_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done, seconds = _start_worker(f"127.0.0.1:{port}", rank=0)
    message = _one_line_error(done)
    assert f"127.0.0.1:{port}: port {port} is already in use" in message
    assert seconds < BOUND


def test_a_coordinator_address_that_is_not_rank_0s_is_one_line() -> None:
    done, _ = _start_worker("192.0.2.1:4321", rank=0)  # TEST-NET-1: never an address of this machine
    assert "192.0.2.1:4321: rank 0 cannot serve it here" in _one_line_error(done)


def test_start_worker_after_jax_started_is_one_line() -> None:
    (port,) = free_ports(1)
    done, _ = _start_worker(f"127.0.0.1:{port}", 0, 1, "--jax-started")
    assert "must be called before any JAX calls" in _one_line_error(done)


def test_training_before_start_worker_is_refused() -> None:
    data, config = learnable_data(), small_config("mlp")
    with pytest.raises(DistributedError, match="call start_worker"):
        rosetta_jax.train_data_parallel(config, asymmetric_weights(config, 11),
                                        plan(small_spec(), "mlp", len(data.train_labels)), data,
                                        Cluster(0, 2, ("127.0.0.1:1",)))


@pytest.mark.parametrize("arch", ["mlp", "gru"])
def test_one_worker_on_the_global_mesh_trains_as_train_does(arch: str) -> None:
    """The mesh, the replicated state and the copy back into a local model, without a second process (one
    worker needs no jax.distributed): the same losses and weights as train(), and an ordinary model after."""
    data, config = learnable_data(), small_config(arch)
    train_plan = plan(small_spec(), arch, len(data.train_labels))
    model, result = rosetta_jax.train_data_parallel(config, asymmetric_weights(config, 11), train_plan, data,
                                                    Cluster(0, 1, ("127.0.0.1:1",)))
    reference = rosetta_jax.build(config, asymmetric_weights(config, 11))
    expected = rosetta_jax.train(reference, train_plan, data)
    np.testing.assert_allclose(result.step_losses, expected.step_losses, rtol=1e-6)
    got, want = rosetta_jax.to_canonical(model), rosetta_jax.to_canonical(reference)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(rosetta_jax.predict(model, data.test_inputs),
                               rosetta_jax.predict(reference, data.test_inputs), rtol=0, atol=1e-5)
    assert result.workers == 1 and "jax.distributed" in result.engine
    assert len(result.epoch_seconds) == train_plan.epochs
