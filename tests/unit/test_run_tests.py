"""`make test`'s own parts: the worker count, the environment every suite shares, the shared tiny run's
bookkeeping (made once, copied to each worker, a failure told to every later asker without running again), and
the order the workers take the files in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from support import REPO, TinyRun
from support.planted import Validated, shared_round
from tooling.build import run_tests, tiny_run


def test_the_cross_cutting_suite_runs_on_two_workers_unless_told(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.delenv("ROSETTA_TEST_WORKERS", raising=False)
    command = run_tests.cross_suite(tmp_path)
    assert command[command.index("-n") + 1] == "2"
    monkeypatch.setenv("ROSETTA_TEST_WORKERS", "0")  # one pytest process, as before
    command = run_tests.cross_suite(tmp_path)
    assert command[command.index("-n") + 1] == "0"


def test_a_bad_worker_count_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "tooling.build.run_tests", "cross"], cwd=REPO, capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "ROSETTA_TEST_WORKERS": "two"}, timeout=60,
                            check=False)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip() == ("error: ROSETTA_TEST_WORKERS='two': must be a whole number of workers, "
                                     "0 or more")


@pytest.mark.parametrize(("model", "message"), [
    ("tcn", "error: MODEL = 'tcn': not a registered architecture; allowed: mlp, cnn, attention,"),
    ("", "error: MODEL = '': name one or more of mlp, cnn, attention,")])
def test_a_model_run_names_a_registered_model_before_anything_starts(tmp_path: Path, model: str,
                                                                    message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tooling.build.run_tests", "model", "--model", model], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().startswith(message) and len(done.stderr.strip().splitlines()) == 1


def test_a_model_run_tests_that_model_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suites a model run starts see only it: the framework suites and packages/common/tests, nothing else."""
    started: list[tuple[str, list[str], str]] = []
    # main() sets the suites' variables in its own process: a copy here, so no later test inherits them
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != "ROSETTA_TEST_MODELS"})

    def fake_run(name: str, cmd: list[str], sink: object) -> int:
        started.append((name, cmd, os.environ["ROSETTA_TEST_MODELS"]))
        return 0

    monkeypatch.setattr(run_tests, "run", fake_run)
    assert run_tests.main(["model", "--model", "gru,cnn"]) == 0
    assert [name for name, _, _ in started] == [*run_tests.FRAMEWORKS, "cross"]
    assert {models for _, _, models in started} == {"cnn gru"}
    assert started[-1][1][-1] == "packages/common/tests"


def test_every_suite_compiles_jax_programs_into_one_cache_in_the_runs_own_folder(tmp_path: Path) -> None:
    env = run_tests.suite_environment(tmp_path)
    assert Path(env["JAX_COMPILATION_CACHE_DIR"]).parent == tmp_path  # empty at the start of every run
    # every program, however quick to compile: the suites' many small ones are what repeats
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "0"


def test_openmp_threads_sleep_when_idle_in_every_suite(tmp_path: Path) -> None:
    """Three or more busy processes share 2 cores: an idle OpenMP thread must not spin on one (run_tests)."""
    assert run_tests.suite_environment(tmp_path)["OMP_WAIT_POLICY"] == "PASSIVE"


def test_the_shared_tiny_run_is_made_once_and_copied_whole_to_each_asker(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    made = []

    def run(root: Path) -> TinyRun:  # a finished run's stand-in: a folder with a file, and DVC's output
        made.append(root)
        (root / ".dvc").mkdir(parents=True)
        (root / ".dvc/config").write_text("[core]\n")
        return TinyRun(root, {}, "Running stage 'data'")

    monkeypatch.setattr(tiny_run, "run_tiny_pipeline", run)
    first = tiny_run.shared_tiny_pipeline(tmp_path / "shared", tmp_path / "a" / "repo")
    second = tiny_run.shared_tiny_pipeline(tmp_path / "shared", tmp_path / "b" / "repo")
    assert made == [tmp_path / "shared" / "repo"]
    for copy in (first, second):
        assert (copy.root / ".dvc/config").read_text() == "[core]\n" and copy.output == "Running stage 'data'"
    (first.root / ".dvc/config").write_text("changed")  # a copy is the asker's own
    assert (second.root / ".dvc/config").read_text() == (tmp_path / "shared/repo/.dvc/config").read_text()


def test_a_shared_tiny_run_that_failed_fails_every_later_asker_without_running_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []

    def run(root: Path) -> TinyRun:
        calls.append(root)
        raise AssertionError("dvc repro failed (1):\nERROR: failed to reproduce 'data'")

    monkeypatch.setattr(tiny_run, "run_tiny_pipeline", run)
    for asker in ("a", "b"):
        with pytest.raises(AssertionError, match="failed to reproduce 'data'"):
            tiny_run.shared_tiny_pipeline(tmp_path / "shared", tmp_path / asker / "repo")
        assert not (tmp_path / asker).exists()
    assert len(calls) == 1


def test_the_files_come_in_the_tiny_runs_order() -> None:
    """conftest.py's order, as every worker collects it: the file that makes the tiny run first, then the files
    that never need the run (a worker runs them while the other makes it), then the ones that
    need it, the slowest first."""
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                               cwd=REPO, capture_output=True, text=True, timeout=300, check=True).stdout
    files = list(dict.fromkeys(line.split("::")[0] for line in collected.splitlines() if "::" in line))
    position = {path: i for i, path in enumerate(files)}
    assert files[0] == "tests/pipeline/test_planted_porting_bugs.py", files[:4]
    never = ["tests/unit/test_report.py", "tests/pipeline/test_jax2tf.py", "packages/common/tests/test_spec.py"]
    needs = ["tests/system/test_containers.py", "tests/pipeline/test_taps_localize.py",
             "tests/pipeline/test_lineage.py", "tests/pipeline/test_stage_kills.py",
             "tests/pipeline/test_validate_failures.py", "tests/pipeline/test_pipeline_e2e.py"]
    assert max(position[f] for f in never) < min(position[f] for f in needs), files
    assert [position[f] for f in needs] == sorted(position[f] for f in needs), files


class _Worker:
    """What xdist's scheduler sees of a worker: the indexes of the tests it is sent, in sends."""

    def __init__(self, name: str) -> None:
        self.gateway, self.shutting_down = SimpleNamespace(id=name), False
        self.sends: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sends.append(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_workers_take_each_file_whole_in_the_collections_order(pytestconfig: pytest.Config) -> None:
    """conftest.py's scheduler: pytest-xdist's LoadFileScheduling, a file one work unit, the units in the
    collection's order (not xdist's default, the most tests first): the file that makes the tiny run goes first
    though it has the fewest tests."""
    collection = ["tests/pipeline/test_planted_porting_bugs.py::test_a",
                  "tests/pipeline/test_planted_porting_bugs.py::test_c", "tests/unit/test_report.py::test_d",
                  "tests/unit/test_report.py::TestE::test_f", "tests/unit/test_docs.py::test_g",
                  "tests/unit/test_docs.py::test_h", "tests/unit/test_docs.py::test_i"]
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True), getvalue={"tx": ["2*popen"]}.get)
    scheduler = pytestconfig.hook.pytest_xdist_make_scheduler(config=config, log=None)
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
    for worker in workers:
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    units = {worker.gateway.id: [[collection[i] for i in sent] for sent in worker.sends] for worker in workers}
    assert units == {"gw0": [collection[:2], collection[4:]], "gw1": [collection[2:4]]}, units


def test_a_planted_round_is_made_once_and_read_back_whole_by_every_asker(tmp_path: Path) -> None:
    """support/planted.py's shared_round: the second asker reads the first's validate result, root and all."""
    made = []

    def make(root: Path) -> Validated:
        made.append(root)
        return Validated(1, "exit 1\nFAILED cnn/x", [{"model": "cnn", "passed": False}], [], {"cnn": {}}, root)

    first = shared_round(tmp_path / "planted", "taps_round0", make)
    second = shared_round(tmp_path / "planted", "taps_round0", make)
    assert made == [tmp_path / "planted" / "taps_round0" / "repo"]
    assert first == second and isinstance(second.root, Path) and second.rows[0]["passed"] is False
