"""The instruction-set pins (pipelines/environments.py ISA_PINS and XLA's cap): every stage runs with them,
whatever the caller's environment says, and a train_export run gives the same bytes with the host's own choice
as with a cap below the floor set by the caller (docs/lineage.md, "The same bytes across CPUs").

benchmarks/isa_pins.py shows, per runtime, that each switch is read (a cap below the floor, set inside the stage,
changes that framework's bytes on a CPU above the floor): that is what makes the second test able to fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.environments import ISA_FLOOR, ISA_PINS, stage_environment
from support import MODELS, TinyRun
from support.integrity import tree
from support.lineage import copy_run

# A caller's caps below the floor, per runtime (benchmarks/isa_pins.py: on a CPU above the floor, each changes
# its framework's bytes).
BELOW = {"ONEDNN_MAX_CPU_ISA": "AVX", "MKL_CBWR": "COMPATIBLE,STRICT", "XLA_FLAGS": "--xla_cpu_max_isa=AVX"}


def test_every_stage_gets_the_pins_whatever_the_caller_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in BELOW.items():
        monkeypatch.setenv(name, value)
    env = stage_environment("jax", tmp_path)
    for name, value in ISA_PINS.items():
        assert env[name] == value, name
    flags = env["XLA_FLAGS"].split()
    assert [f for f in flags if f.startswith("--xla_cpu_max_isa")] == [f"--xla_cpu_max_isa={ISA_FLOOR}"], flags


# A program each XLA framework compiles: XLA dumps, with each module, the debug options it read from XLA_FLAGS.
COMPILED = {
    "jax": "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2)(jnp.ones(3)).block_until_ready()",
    "tf": "import tensorflow as tf; tf.function(lambda x: x * 2, jit_compile=True)(tf.ones(3)).numpy()",
}


@pytest.mark.parametrize("framework", sorted(COMPILED))
def test_xla_reads_the_runners_cap_after_a_callers_word_that_ends_its_flags(framework: str, tmp_path: Path) -> None:
    """XLA stops reading XLA_FLAGS at the first word that is not a --flag (the intra_op_parallelism_threads=N often
    quoted for JAX is one), so a cap after it would go unread: with such a word in the caller's flags, the options
    XLA compiled with (its dump's debug options) hold the runner's cap."""
    caller = f"--xla_dump_to={tmp_path} intra_op_parallelism_threads=1 --xla_cpu_max_isa=AVX"
    result = subprocess.run([sys.executable, "-m", "pipelines.runner", framework, "--", "python", "-c",
                             COMPILED[framework]], env={**os.environ, "XLA_FLAGS": caller}, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    read = {path.read_text() for path in tmp_path.glob("*.debug_options")}
    assert read, f"XLA dumped nothing to {tmp_path}: it did not read the caller's --xla_dump_to"
    for options in read:
        assert f'xla_cpu_max_isa: "{ISA_FLOOR}"' in options.splitlines(), options


@pytest.fixture(scope="module")
def pinned_copy(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's finished TINY run, copied: its stages ran as a user runs them (no caps in the environment)."""
    return copy_run(tiny_pipeline.root, tmp_path_factory.mktemp("isa") / "repo")


# The tiny run's first two models, trained again in the order its stage trained them: TF names the functions it
# traces from a process-wide counter, so cnn's TF files (its ONNX graphs, its SavedModel) are the stage's only
# after what the stage did before them, mlp (measured: cnn alone moved five of its TF files, its weights none).
RETRAINED = MODELS[:2]


@pytest.mark.parametrize("framework", ["torch", "tf", "jax"])
def test_train_export_bytes_do_not_move_with_the_callers_caps(pinned_copy: Path, tiny_pipeline: TinyRun,
                                                               framework: str) -> None:
    """mlp and cnn (convolutions: oneDNN; matmuls: MKL, oneDNN's sgemm, XLA; cnn's replicates too) trained and
    exported again with every cap below the floor in the caller's environment, against the tiny run's own files,
    which `dvc repro` made as a user runs it. The pins must win: the same files, byte for byte."""
    assert RETRAINED == ["mlp", "cnn"], RETRAINED
    command = [sys.executable, "-m", "pipelines.runner", framework, "--", "python", "-m",
               "pipelines.stages.train_export", framework, *RETRAINED]
    result = subprocess.run(command, cwd=pinned_copy, env={**tiny_pipeline.env, **BELOW}, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    for model in RETRAINED:
        folder = Path("artifacts") / framework / model
        runs = [tree(tiny_pipeline.root / folder), tree(pinned_copy / folder)]
        assert runs[0], folder
        moved = sorted(k for k in runs[0].keys() | runs[1].keys() if runs[0].get(k) != runs[1].get(k))
        assert not moved, f"{framework} {model} files that a caller's caps moved: {moved}"


def test_the_benchmark_varies_exactly_the_runners_pins() -> None:
    from benchmarks.isa_pins import PINNED

    assert set(PINNED) == set(ISA_PINS) | {"OPENBLAS_CORETYPE"}, "benchmarks/isa_pins.py must vary every pin"
