"""Bounded resources over time (pipelines/resources.py): the probe's verdict, then every framework's training,
single-process and data-parallel, run long enough for a per-step leak to cross the probe's bounds, holding its
threads and descriptors flat; a thread planted per step, and TF's collectives armed with a timeout each (the
thread-per-collective leak of TF's collective executor), caught as growth. The model servers under a burst of
requests are in test_serving_load.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines import resources
from pipelines.resources import Sample
from support import copy_repo, merge, orchestrator_env, run_in

FRAMEWORKS = ["torch", "tf", "jax"]
PROBED_SECONDS = 2.0  # each probed run's length, where the machine is fast enough to make it longer than MIN_EPOCHS
MIN_EPOCHS = 13  # 416 steps a run (512 samples, batch 16): a thread a step would add 400 over a bound of 4


def samples(threads: list[int], fds: int = 10, rss: int = 100 * resources.MIB) -> list[Sample]:
    return [Sample(0.1 * i, n, fds, rss) for i, n in enumerate(threads)]


def test_the_verdict_is_the_second_halfs_peak_over_the_firsts() -> None:
    steady = resources.summarize(samples([3, 40, 41, 40, 42, 41, 40, 44]))  # pools made early: +3 at most
    assert steady["flat"] and steady["verdict"] == "flat", steady
    assert steady["resources"]["threads"] == {"start": 3, "half_way": 42, "end": 44, "peak": 44,
                                              "first_half_peak": 41, "second_half_peak": 44, "added": 3,
                                              "verdict": "flat"}
    leaking = resources.summarize(samples(list(range(10, 30))))  # one thread a sample
    assert not leaking["flat"] and leaking["resources"]["threads"]["added"] == 10, leaking
    assert leaking["verdict"] == "grows: threads +10 (bound 4)"
    assert resources.summarize(samples([1, 2, 3]))["verdict"] == "too short"
    memory = resources.summarize([Sample(i, 5, 5, (1000 + (200 if i > 3 else 0)) * resources.MIB)
                                  for i in range(8)])
    assert memory["bounds"]["rss_bytes"] == 100 * resources.MIB  # a tenth of the first half's 1,000 MiB
    assert memory["resources"]["rss_bytes"]["verdict"] == "grows" and resources.flat(memory), memory


LEAKY = """
import threading, time
stop = threading.Event()
for _ in range({count}):
    if {leak}:
        threading.Thread(target=stop.wait, daemon=True).start()
    time.sleep(0.02)
"""


@pytest.mark.parametrize("leak", [False, True])
def test_the_probe_reads_a_real_process(leak: bool) -> None:
    process = subprocess.Popen([sys.executable, "-c", LEAKY.format(count=100, leak=leak)])
    with resources.Probe(process.pid, interval=0.05) as probe:
        process.wait(timeout=60)
    record = resources.summarize(probe.samples)
    assert record["samples"] >= 8, record
    assert record["flat"] is (not leak), record
    if leak:
        assert record["resources"]["threads"]["added"] >= 20, record


# One framework's small mlp trained in its own environment: a warm-up run (compiles, thread pools), then two
# identical runs back to back, each of at least MIN_EPOCHS and about PROBED_SECONDS, probed from inside the process
# as one window: each half of the window asks the same of the process (a run's start and end included), so only
# what the steps add can make the second half's peak the higher. Then PLANT adds a leak to the loop and a second
# window is probed, its runs as long as the first's but at most 2 * MIN_EPOCHS: a thread a step adds hundreds over
# the bound there, where a run of PROBED_SECONDS of a fast loop (torch's mlp: about 200 epochs) would start over
# 10,000 threads. One interpreter, one import and one warm-up for both windows.
TRAIN = """
import gc, json, math, os, time
from pipelines import resources
from rosetta_common.interface import load_backend
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan

backend = load_backend("{framework}")
backend.configure(0)
config, data = small_config("mlp"), learnable_data(n_train=512, n_test=32)

def run(epochs):
    model = backend.build(config, asymmetric_weights(config, 0))
    start = time.perf_counter()
    backend.train(model, plan(small_spec(epochs=epochs), "mlp", len(data.train_labels)), data)
    seconds = time.perf_counter() - start
    del model
    gc.collect()  # a Keras model holds a thread until it is collected: the run's, not its steps'
    return seconds

run(1)  # one-time costs: imports on first use, the first compile
epochs = max({min_epochs}, math.ceil(4 * {seconds} / run(4)))

def window(name, epochs):
    with resources.Probe(os.getpid(), interval=0.05) as probe:
        run(epochs)
        run(epochs)
    record = {{"epochs": epochs, "steps": epochs * 32, **resources.summarize(probe.samples)}}
    print(name + " " + json.dumps(record), flush=True)

window("PROBED", epochs)
{plant}
window("PLANTED", min(epochs, 2 * {min_epochs}))
"""

# A thread started at every training step, each waiting until the process ends, from the loop's per-step call:
# torch's and TF's loops update their progress bar each step, JAX's epoch loop calls its step function each step.
PLANT_BAR = """
import threading, tqdm.std
leak, bar_update = threading.Event(), tqdm.std.tqdm.update
def update(self, n=1):
    threading.Thread(target=leak.wait, daemon=True).start()
    return bar_update(self, n)
tqdm.std.tqdm.update = update
"""
PLANT_STEP = """
import sys, threading
leak, loop = threading.Event(), sys.modules["rosetta_jax.train"]
epochs_loop = loop.run_epochs
def run_epochs(plan, state, step, *args, **kwargs):
    def leaky(*step_args):
        threading.Thread(target=leak.wait, daemon=True).start()
        return step(*step_args)
    return epochs_loop(plan, state, leaky, *args, **kwargs)
loop.run_epochs = run_epochs
"""
PLANT = {"torch": PLANT_BAR, "tf": PLANT_BAR, "jax": PLANT_STEP}


Probed = Callable[[str], dict[str, dict[str, Any]]]  # a framework -> its windows' records, by name


@pytest.fixture(scope="module")
def probed_training() -> Probed:
    """TRAIN run once per framework (on first use): its two windows' records, by name ("PROBED": as shipped,
    "PLANTED": a thread leaked per step)."""
    records: dict[str, dict[str, dict[str, Any]]] = {}

    def get(framework: str) -> dict[str, dict[str, Any]]:
        if framework not in records:
            result = run_in(framework, TRAIN.format(framework=framework, seconds=PROBED_SECONDS,
                                                    min_epochs=MIN_EPOCHS, plant=PLANT[framework]))
            found = dict(line.split(" ", 1) for line in result.stdout.splitlines()
                         if line.startswith(("PROBED ", "PLANTED ")))
            assert result.returncode == 0 and found.keys() == {"PROBED", "PLANTED"}, result.stderr[-3000:]
            records[framework] = {name: json.loads(record) for name, record in found.items()}
        return records[framework]

    return get


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_training_holds_threads_and_descriptors_flat(framework: str, probed_training: Probed) -> None:
    record = probed_training(framework)["PROBED"]
    assert record["steps"] >= 20 * (resources.BOUNDS["threads"] + 1), record  # a leak a step would show
    assert resources.flat(record), resources.describe(record)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_thread_planted_per_step_is_caught(framework: str, probed_training: Probed) -> None:
    record = probed_training(framework)["PLANTED"]
    assert record["steps"] >= 20 * (resources.BOUNDS["threads"] + 1), record
    assert not resources.flat(record), resources.describe(record)
    assert record["resources"]["threads"]["verdict"] == "grows", record


# TF's data-parallel step with its collectives given a timeout each, as CommunicationOptions(timeout_seconds=...)
# does: TF's collective executor then holds a sleeping thread per collective for the whole timeout.
TIMED_COLLECTIVES = """
import tensorflow as tf

options = tf.distribute.experimental.CommunicationOptions
tf.distribute.experimental.CommunicationOptions = lambda **kw: options(**{"timeout_seconds": 60.0, **kw})

from pipelines.stages import stage_main
from pipelines.stages.train_dp_worker import main

stage_main(main)
"""


@pytest.fixture(scope="module")
def dp_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout with its own prepared data and init weights, training the mlp data-parallel on two
    workers for 20 epochs (880 steps on digits), then its one replicate, the same length: each half of a worker's
    window asks the same of it."""
    root = tmp_path_factory.mktemp("resources") / "repo"
    env = orchestrator_env()
    copy_repo(root, env)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params = merge(params, {"models": ["mlp"], "train": {"epochs": 20},
                            "replicates": {"models": ["mlp"], "count": 1, "first": 1, "parted": 1, "at_most": 1},
                            "data_parallel": {"workers": 2, "models": ["mlp"]}})
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for stage in ("data", "init"):
        subprocess.run([sys.executable, "-m", f"pipelines.stages.{stage}"], cwd=root, env=env, check=True,
                       capture_output=True)
    (root / "artifacts/null_plan.json").write_text(json.dumps({"replicates": ["mlp"]}))  # mlp's one replicate
    (root / "timed_collectives_worker.py").write_text(TIMED_COLLECTIVES)
    return root


def data_parallel_run(root: Path, framework: str, worker: str | None = None) -> dict[str, Any]:
    shutil.rmtree(root / "artifacts/data_parallel", ignore_errors=True)
    command = [sys.executable, "-m", "pipelines.stages.train_dp", framework]
    started = time.monotonic()
    result = subprocess.run(command + (["--worker", worker] if worker else []), cwd=root, env=orchestrator_env(),
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((root / f"measurements/resources/train_dp@{framework}.json").read_text())
    assert record["processes"].keys() == {"worker 0", "worker 1"}, record
    assert all(p["seconds"] < time.monotonic() - started for p in record["processes"].values())
    assert all(f"train_dp@{framework}: {name}: " in result.stdout for name in record["processes"]), result.stdout
    return record["processes"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_data_parallel_workers_hold_threads_and_descriptors_flat(dp_copy: Path, framework: str) -> None:
    for name, record in data_parallel_run(dp_copy, framework).items():
        assert resources.flat(record), f"{framework} {name}: {resources.describe(record)}"


def test_tf_collectives_with_a_timeout_each_are_caught(dp_copy: Path) -> None:
    for name, record in data_parallel_run(dp_copy, "tf", worker="timed_collectives_worker").items():
        assert record["resources"]["threads"]["verdict"] == "grows", f"{name}: {resources.describe(record)}"
        assert record["resources"]["threads"]["added"] > 100, record

