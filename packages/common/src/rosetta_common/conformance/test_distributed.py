"""distributed.py of the contract: two workers on the framework's own engine train as one process does.

Two worker processes on loopback (the framework's own variables, as its launcher sets them), each taking its
half of every batch, against the same framework's single-process `train` on the same weights and batches
(train_worker's run, made for test_training.py's two-process check)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import ModuleType

import numpy as np
import pytest

from rosetta_common.conformance.conftest import framework_under_test
from rosetta_common.conformance.dp_worker import ARCHS
from rosetta_common.conformance.selected import skip_unless_tested
from rosetta_common.distributed import Cluster, free_ports
from rosetta_common.errors import DistributedError
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan

WORKERS = 2
STEP_REL = 1e-5  # float32 summation order: shard means averaged vs one mean (the pipeline's first-epoch bound)
WEIGHTS_ABS = 1e-5


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, np.ndarray]]:
    framework = framework_under_test()
    out = tmp_path_factory.mktemp("dp")
    addresses = tuple(f"127.0.0.1:{port}" for port in free_ports(WORKERS))
    workers = []
    for rank in range(WORKERS):
        env = {**os.environ, **Cluster(rank, WORKERS, addresses, 120.0).environment(framework)}
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "rosetta_common.conformance.dp_worker", framework, str(out / f"{rank}.npz")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for worker in workers:
            logs.append(worker.communicate(timeout=900)[0])
    finally:
        for worker in workers:
            worker.kill()
    for rank, (worker, log) in enumerate(zip(workers, logs, strict=True)):
        assert worker.returncode == 0, f"worker {rank} exited {worker.returncode}:\n{log[-4000:]}"
    return [dict(np.load(out / f"{rank}.npz")) for rank in range(WORKERS)]


@pytest.mark.parametrize("arch", ARCHS)
def test_two_workers_train_as_one_process(backend: ModuleType, two_worker_run: list,
                                          two_runs: list[dict[str, np.ndarray]], arch: str) -> None:
    """Against the single-process run of conftest.py's two_processes (train_worker: the same weights, plan and
    data as dp_worker's, a fresh build trained by `train`)."""
    skip_unless_tested(arch)
    single = two_runs[0]
    losses = single[f"{arch}/step_losses"]
    weights = {k.split("/weights/", 1)[1]: v for k, v in single.items() if k.startswith(f"{arch}/weights/")}
    assert weights
    for rank, run in enumerate(two_worker_run):
        assert int(run[f"{arch}/workers"]) == WORKERS
        got = run[f"{arch}/step_losses"]
        assert got.shape == losses.shape, f"rank {rank}: {got.shape} steps, single process {losses.shape}"
        np.testing.assert_allclose(got, losses, rtol=STEP_REL, err_msg=f"rank {rank} step losses")
        for name, value in weights.items():
            np.testing.assert_allclose(run[f"{arch}/weights/{name}"], value, rtol=0, atol=WEIGHTS_ABS,
                                       err_msg=f"rank {rank} {name}")


@pytest.mark.parametrize("arch", ARCHS)
def test_every_worker_holds_the_same_model(backend: ModuleType, two_worker_run: list, arch: str) -> None:
    """The engine keeps the replicas in step: the workers' weights and reported losses are identical."""
    skip_unless_tested(arch)
    first, *others = two_worker_run
    for rank, run in enumerate(others, start=1):
        np.testing.assert_array_equal(run[f"{arch}/step_losses"], first[f"{arch}/step_losses"], f"rank {rank}")
        for key in first:
            if key.startswith(f"{arch}/weights/"):
                np.testing.assert_array_equal(run[key], first[key], f"rank {rank} {key}")


def test_a_batch_that_does_not_divide_is_refused(backend: ModuleType) -> None:
    data = learnable_data()
    config = small_config("mlp")
    cluster = Cluster(0, 3, ("127.0.0.1:1",))
    with pytest.raises(DistributedError, match=r"train\.batch_size = 16: must divide by the 3"):
        backend.train_data_parallel(config, asymmetric_weights(config, 11),
                                    plan(small_spec(), "mlp", len(data.train_labels)), data, cluster)


def test_resnet_is_refused(backend: ModuleType) -> None:
    data = learnable_data()
    config = small_config("resnet")
    with pytest.raises(DistributedError, match="'resnet' cannot train data-parallel"):
        backend.train_data_parallel(config, asymmetric_weights(config, 11),
                                    plan(small_spec(), "resnet", len(data.train_labels)), data,
                                    Cluster(0, 2, ("127.0.0.1:1",)))


def test_a_missing_engine_variable_is_one_line(backend: ModuleType) -> None:
    framework = framework_under_test()
    with pytest.raises(DistributedError, match="not set") as error:
        Cluster.from_environment(framework, {})
    assert "\n" not in str(error.value)
