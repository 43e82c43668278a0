"""The runner: environments keyed by their lock, reused without rebuilding, stage environment wiring."""

import subprocess
import sys

import pytest

from pipelines import runner
from support import REPO, orchestrator_env


def test_unchanged_lock_reuses_environment_without_running_anything(monkeypatch):
    runner.ensure_env("validation")  # built once (or already there)

    def forbidden(*args, **kwargs):
        raise AssertionError(f"no process may run for an up-to-date environment: {args}")

    monkeypatch.setattr(runner.subprocess, "run", forbidden)
    assert runner.ensure_env("validation") == runner.envs_dir() / "validation-cpu"


def test_changed_lock_changes_the_key(tmp_path, monkeypatch):
    lock = tmp_path / "requirements-cpu.lock"
    lock.write_text("numpy==2.4.6 --hash=sha256:00\n")
    monkeypatch.setattr(runner, "lock_path", lambda env, variant: lock)
    before = runner.lock_digest("validation", "cpu")
    lock.write_text("numpy==2.4.5 --hash=sha256:00\n")
    assert runner.lock_digest("validation", "cpu") != before


def test_stage_environment_puts_common_and_only_its_framework_on_the_path(tmp_path):
    env = runner.stage_environment("torch", tmp_path)
    path = env["PYTHONPATH"]
    assert str(REPO / "packages/common/src") in path and str(REPO / "packages/torch_impl/src") in path
    assert "tf_impl" not in path and "jax_impl" not in path
    assert env["PATH"].startswith(str(tmp_path / "bin"))
    assert "_impl" not in runner.stage_environment("validation", tmp_path)["PYTHONPATH"]


def test_a_thread_count_given_sets_every_pool_whatever_the_caller_set(tmp_path, monkeypatch):
    """A model server runs at its export's thread count: every pool's variable, whatever the caller's."""
    monkeypatch.setenv("ROSETTA_THREADS", "2")
    env = runner.stage_environment("jax", tmp_path, threads=3)
    assert [env[k] for k in ("ROSETTA_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")] \
        == ["3"] * 4
    assert runner.stage_environment("jax", tmp_path)["ROSETTA_THREADS"] == "2"


@pytest.mark.parametrize("caller", ["", "--xla_dump_to=x", "--xla_cpu_multi_thread_eigen=false --xla_dump_to=x",
                                    "--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=2 --xla_dump_to=x",
                                    "--xla_cpu_max_isa=AVX --xla_dump_to=x"])
def test_xla_reads_the_cap_and_the_callers_flags_whatever_the_caller_set(tmp_path, monkeypatch, caller):
    """XLA stops reading XLA_FLAGS at the first word that is not a --flag (intra_op_parallelism_threads=2, no XLA
    flag, is one): every word is a flag, the caller's own kept, the runner's pool switch and cap last."""
    monkeypatch.setenv("XLA_FLAGS", caller)
    words = runner.stage_environment("jax", tmp_path)["XLA_FLAGS"].split()
    assert all(word.startswith("--") for word in words), words
    assert words[-2:] == ["--xla_cpu_multi_thread_eigen=true", "--xla_cpu_max_isa=AVX2"]
    assert ("--xla_dump_to=x" in words) == ("--xla_dump_to=x" in caller)
    assert sum(word.startswith(("--xla_cpu_max_isa", "--xla_cpu_multi_thread_eigen")) for word in words) == 2


@pytest.mark.parametrize(
    ("args", "extra", "message"),
    [
        (["nope", "--", "python", "-c", "pass"], {}, "env 'nope' is unknown"),
        (
            ["validation", "--", "python", "-c", "pass"],
            {"ROSETTA_RUNTIME": "kubernetes"},
            "ROSETTA_RUNTIME='kubernetes' is not allowed; choose one of local, container",
        ),
        (
            ["validation", "--", "python", "-c", "pass"],
            {"ROSETTA_VARIANT": "rocm"},
            "ROSETTA_VARIANT='rocm' is not allowed; choose one of cpu, cuda",
        ),
    ],
)
def test_bad_runner_input_is_one_clear_line(args, extra, message):
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.runner", *args],
        cwd=REPO,
        env=orchestrator_env(**extra),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert message in result.stderr


def test_command_exit_code_passes_through():
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.runner", "validation", "--", "python", "-c", "import sys; sys.exit(7)"],
        cwd=REPO,
        env=orchestrator_env(),
        check=False,
    )
    assert result.returncode == 7
