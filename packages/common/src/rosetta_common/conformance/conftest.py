"""Fixtures of the conformance suite: the backend under test, configured once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from rosetta_common.conformance import process_worker
from rosetta_common.interface import BACKEND_MODULES, load_backend
from rosetta_common.spec import TOKEN_ARCHITECTURES
from rosetta_common.testing import ARCHS, random_inputs, small_config


def framework_under_test() -> str:
    name = os.environ.get("ROSETTA_BACKEND") or os.environ.get("ROSETTA_ENV", "")
    if name not in BACKEND_MODULES:
        raise pytest.UsageError(
            f"ROSETTA_ENV = {name!r}: the conformance suite runs inside a framework's environment "
            f"({', '.join(BACKEND_MODULES)}): python -m pipelines.runner torch -- python -m pytest ..."
        )
    return name


@pytest.fixture(scope="session")
def backend() -> ModuleType:
    module = load_backend(framework_under_test())
    module.configure(0)
    return module


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def images() -> np.ndarray:
    return np.random.default_rng(7).random((7, 8, 8), dtype=np.float32)


@pytest.fixture
def inputs(arch: str, images: np.ndarray) -> np.ndarray:
    """A batch of 7 of what `arch`'s small model reads: the images above, or padded token ids (every row a random
    length, so that padding is always in play)."""
    if arch in TOKEN_ARCHITECTURES:
        return random_inputs(small_config(arch), 7, 7)
    return images


@pytest.fixture(scope="session")
def two_processes(backend: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two fresh processes (process_worker.py) at the same time, nothing they compute may depend on what else
    runs: each exports every architecture, then trains every architecture, the first with a StepHook, the second
    also stopped after each of the hook's first-epoch steps. Their output folders."""
    outs = [tmp_path_factory.mktemp(f"process{i}") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "rosetta_common.conformance.process_worker", backend.FRAMEWORK,
                               str(out), mode]) for out, mode in zip(outs, ("hook", "truncated"), strict=True)]
    assert [proc.wait() for proc in procs] == [0, 0]
    return outs


@pytest.fixture(scope="session")
def two_runs(two_processes: list[Path]) -> list[dict[str, np.ndarray]]:
    """What the two processes trained (train_worker.py): losses, weights, logits and the hook's states."""
    runs = []
    for out in two_processes:
        with np.load(out / process_worker.RUN, allow_pickle=False) as f:
            runs.append(dict(f))
    return runs
