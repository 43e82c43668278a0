"""rosetta_tf.distributed beyond the shared conformance suite: start-up failures are bounded and one line, and a
worker's input pipeline holds exactly its rows.

Start-up runs in a subprocess: TF configures its collective ops once per process, before any other TF op, which
this test session's process has long done."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from rosetta_common.distributed import Cluster
from rosetta_common.errors import DistributedError
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan
from rosetta_tf import train_data_parallel
from rosetta_tf.train import plan_batches

TIMEOUT = 5.0  # the cluster's timeout_seconds in the start-up failures
# A failed start-up may take the timeout and TF's own slack (the registration barrier), never more.
START_BOUND = TIMEOUT + 10.0
# The whole subprocess: importing TensorFlow alone takes 10-20 s on a loaded 2-core machine.
PROCESS_BOUND = 90.0

# Three failures in one process (one TF import): the first two raise before TF is touched, the last is TF's own
# registration barrier (a rank 0 whose peer never comes).
START_FAILURES = f"""
import json, socket, time
from rosetta_common.distributed import Cluster, free_ports
from rosetta_common.errors import DistributedError
import rosetta_tf

rosetta_tf.configure(0)
ports = free_ports(5)  # nothing listens on any of them, until `busy` takes the second
busy = socket.socket()
busy.bind(("127.0.0.1", ports[1]))
busy.listen()
address = [f"127.0.0.1:{{port}}" for port in ports]
cases = {{"unreachable_coordinator": (Cluster(1, 2, (address[0], address[2]), {TIMEOUT}), address[0]),
          "port_in_use": (Cluster(1, 2, (address[0], address[1]), {TIMEOUT}), str(ports[1])),
          "peer_never_joins": (Cluster(0, 2, (address[3], address[4]), {TIMEOUT}), address[3])}}
results = {{}}
for name, (cluster, named) in cases.items():
    start = time.monotonic()
    try:
        rosetta_tf.start_worker(cluster)
        results[name] = {{"error": None}}
    except DistributedError as error:
        results[name] = {{"error": str(error), "seconds": time.monotonic() - start, "address": named}}
print("RESULTS " + json.dumps(results), flush=True)
"""


@pytest.fixture(scope="module")
def start_failures() -> dict[str, dict]:
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-c", START_FAILURES], env=os.environ.copy(), capture_output=True,
                         text=True, timeout=PROCESS_BOUND)
    seconds = time.monotonic() - start
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULTS ")]
    assert run.returncode == 0 and lines, f"exit {run.returncode}:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    assert seconds < PROCESS_BOUND
    return json.loads(lines[-1].removeprefix("RESULTS "))


@pytest.mark.parametrize("case, says", [
    ("unreachable_coordinator", "did not answer within 5 s"),
    ("port_in_use", "already in use"),
    ("peer_never_joins", "not every worker joined within 5 s"),
])
def test_a_start_up_failure_is_one_line_naming_the_address_and_bounded(start_failures: dict, case: str,
                                                                         says: str) -> None:
    result = start_failures[case]
    assert result["error"] is not None, f"{case}: start_worker returned"
    assert "\n" not in result["error"]
    assert says in result["error"] and result["address"] in result["error"], result["error"]
    assert result["seconds"] < START_BOUND, f"{case}: {result['seconds']:.1f} s"


# A collective that never completes (a group of two with one member), under the run's watchdog: in a process of
# its own, since aborted collectives stay aborted in a process.
STUCK_COLLECTIVE = """
import json, time
import tensorflow as tf
from rosetta_tf.distributed import Watchdog

start = time.monotonic()
try:
    with Watchdog(2.0, "mlp on worker 0"):
        tf.raw_ops.CollectiveReduceV2(input=tf.constant([1.0]), group_size=tf.constant(2), group_key=tf.constant(1),
                                      instance_key=tf.constant(1), ordering_token=[], merge_op="Add", final_op="Id")
    found = {"error": None}
except tf.errors.OpError as error:
    found = {"error": type(error).__name__, "message": error.message, "seconds": time.monotonic() - start}
print("RESULT " + json.dumps(found), flush=True)
"""


def test_the_watchdog_ends_a_collective_that_never_completes() -> None:
    """The step's bound without a timed collective (whose thread per collective leaks): one watchdog thread."""
    run = subprocess.run([sys.executable, "-c", STUCK_COLLECTIVE], env=os.environ.copy(), capture_output=True,
                         text=True, timeout=PROCESS_BOUND)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, f"exit {run.returncode}:\n{run.stderr[-4000:]}"
    found = json.loads(lines[-1].removeprefix("RESULT "))
    assert found["error"] == "DeadlineExceededError", found
    assert "mlp on worker 0: no step finished within 2 s" in found["message"], found
    assert 2.0 <= found["seconds"] < 2.0 + 5.0, found  # the bound, plus at most the watchdog's poll and TF's abort


def test_training_before_start_worker_is_refused() -> None:
    data = learnable_data()
    config = small_config("mlp")
    with pytest.raises(DistributedError, match=r"call start_worker\(cluster\) first"):
        train_data_parallel(config, asymmetric_weights(config, 11), plan(small_spec(), "mlp", len(data.train_labels)),
                            data, Cluster(0, 2, ("127.0.0.1:1", "127.0.0.1:2")))


def test_a_workers_pipeline_holds_its_rows_of_every_batch_and_mask() -> None:
    data = learnable_data()
    train_plan = plan(small_spec(), "resnet", len(data.train_labels))
    masks = np.random.default_rng(0).random((train_plan.num_steps, train_plan.batch_size, 3), dtype=np.float32)
    whole = list(plan_batches(train_plan, data, masks))
    for rank in range(2):
        rows = Cluster(rank, 2, ("127.0.0.1:1",)).rows(train_plan.batch_size)
        mine = list(plan_batches(train_plan, data, masks, rows))
        assert len(mine) == len(whole) == train_plan.num_steps
        for (inputs, labels), (all_inputs, all_labels) in zip(mine, whole, strict=True):
            for name in inputs:
                np.testing.assert_array_equal(inputs[name].numpy(), all_inputs[name].numpy()[rows])
            np.testing.assert_array_equal(labels.numpy(), all_labels.numpy()[rows])
