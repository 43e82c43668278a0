"""Fixtures shared by the cross-cutting tests; their helpers live in support.py (see its docstring for why
they are not imported from here)."""

import shutil
import sys
from pathlib import Path

import pytest
from filelock import FileLock

# support.py (shared helpers) sits beside the tests; common and pipelines come from this checkout.
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "packages/common/src")]

from pipelines.environments import envs_dir  # noqa: E402
from support import TinyRun, orchestrator_env, run_tiny_pipeline  # noqa: E402  (needs the path above)

FIXTURE = "tiny_pipeline"


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> TinyRun:
    """The whole pipeline with TINY params, run once per session (minutes) and shared by every test that needs a
    finished run. Tests that change it must leave it a valid finished run with a clean `dvc status` (rerunning
    `dvc repro`, or `dvc checkout` after damaging outputs, as test_pipeline_e2e.py does); tests that damage many
    artifacts work on their own copy (see test_validate_failures.py).

    Under pytest-xdist (make test: `-n 2 --dist loadfile`) the first worker that asks makes the one run, in the
    workers' common base folder, while the others wait on its lock; each worker then takes its own copy (work
    tree, git, DVC cache), so a test that changes the run in place never meets another worker's."""
    if not hasattr(request.config, "workerinput"):  # one process: the run itself
        return run_tiny_pipeline(tmp_path_factory.mktemp("rosetta") / "repo")
    shared = tmp_path_factory.getbasetemp().parent / "tiny-run"
    with FileLock(f"{shared}.lock"):
        if not (shared / "finished").is_file():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            run = run_tiny_pipeline(shared / "repo")
            (shared / "output.txt").write_text(run.output)
            (shared / "finished").touch()
    root = tmp_path_factory.mktemp("rosetta") / "repo"
    shutil.copytree(shared / "repo", root, symlinks=True)
    env = orchestrator_env(ROSETTA_ENVS_DIR=str(envs_dir()))  # as run_tiny_pipeline's own
    return TinyRun(root, env, (shared / "output.txt").read_text())


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The first file that needs the tiny run, then every file that needs none, then the rest (each group in
    its collection order): under xdist's loadfile, one worker starts the tiny run at once while the others run what
    does not wait for it. (One process runs everything anyway; the order only moves when the run is made.)"""
    def needs_run(item: pytest.Item) -> bool:
        return FIXTURE in getattr(item, "fixturenames", ())

    files = list(dict.fromkeys(item.path for item in items))
    needing = {item.path for item in items if needs_run(item)}
    first = [path for path in files if path in needing][:1]
    order = first + [p for p in files if p not in needing] + [p for p in files if p in needing and p not in first]
    rank = {path: i for i, path in enumerate(order)}
    items.sort(key=lambda item: rank[item.path])  # stable: each file's tests keep their order
