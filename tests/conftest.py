"""Fixtures shared by the cross-cutting tests (unit/, pipeline/, system/) and the order their files run in;
their helpers live in the support package (its docstring says why not in a conftest)."""

import os
import sys
from pathlib import Path

import pytest

# The support package (shared helpers) sits in tests/; common and pipelines come from this checkout.
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "packages/common/src")]

from support import TinyRun, run_tiny_pipeline, shared_tiny_pipeline  # noqa: E402  (needs the path above)

# Under pytest-xdist (`make test` runs this suite on two workers, tooling/build/run_tests.py) every test file runs whole
# on one worker, so a module's fixtures are made once; what several files share across workers (the tiny run, the
# planted rounds) is made once for all of them under a file lock (support/).

# The order the workers take the files in (pytest_collection_modifyitems below). The tiny run takes minutes and
# most files wait for it, so: first a file that asks for it at once (one worker makes it), then every file that
# never needs it (the other worker runs them meanwhile), then the files that need it, the slowest first, so that
# the two workers end close together. SLOWEST: the slowest files, slowest first, as a fresh clone's `make test`
# measures them (containers, the planted rounds, lineage, report, ...); only their order is used.
# test_containers.py asks for the tiny run only once its images are built (request.getfixturevalue), so no fixture
# list shows it: it is named here.
STARTS_THE_TINY_RUN = "tests/pipeline/test_planted_porting_bugs.py"
NEEDS_THE_TINY_RUN_LATER = {"tests/system/test_containers.py"}
SLOWEST = [
    "tests/system/test_containers.py", "tests/pipeline/test_planted_porting_bugs.py",
    "tests/pipeline/test_adding_a_model.py", "tests/pipeline/test_taps_localize.py", "tests/pipeline/test_lineage.py",
    "tests/system/test_report_page.py",
    "tests/pipeline/test_stage_kills.py", "tests/pipeline/test_validate_failures.py", "tests/system/test_serving.py",
    "tests/pipeline/test_isa_pins.py", "tests/pipeline/test_bad_inputs.py", "tests/pipeline/test_serve_stage.py",
    "tests/pipeline/test_data_parallel.py", "tests/pipeline/test_jax2tf.py", "tests/pipeline/test_pipeline_e2e.py",
    "tests/system/test_serving_load.py", "tests/pipeline/test_environments.py", "tests/unit/test_report.py",
    "tests/pipeline/test_where_they_part.py",
]
TINY_FIXTURES = {"tiny_pipeline", "planted_runs"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files in the order above; each file's tests keep theirs. Every xdist worker collects the same order, and
    the scheduler (below) hands the files out in it."""
    def file(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    first = {STARTS_THE_TINY_RUN}
    waits = NEEDS_THE_TINY_RUN_LATER | {file(item) for item in items if TINY_FIXTURES & set(item.fixturenames)}
    collected = {path: i for i, path in enumerate(dict.fromkeys(map(file, items)))}

    def rank(path: str) -> tuple[int, int, int]:
        group = 0 if path in first else 2 if path in waits else 1
        return group, SLOWEST.index(path) if path in SLOWEST else len(SLOWEST), collected[path]

    items.sort(key=lambda item: rank(file(item)))  # stable: each file's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """pytest-xdist's file scheduling (`--dist loadfile`), the files handed out in the collection's order (above;
    `--no-loadscope-reorder`) instead of the most tests first."""
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False
    return LoadFileScheduling(config, log)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """The whole pipeline with TINY params, run once per session (minutes) and shared by every test that needs a
    finished run; under pytest-xdist, run once for all workers (by the first to ask) and copied to each. Tests that
    change it must leave it a valid finished run with a clean `dvc status` (rerunning `dvc repro`, or `dvc
    checkout` after damaging outputs, as test_pipeline_e2e.py does); tests that damage many artifacts work on
    their own copy (see test_validate_failures.py)."""
    own = tmp_path_factory.mktemp("rosetta") / "repo"
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return run_tiny_pipeline(own)
    # Every worker's base temporary folder is a folder of the session's (pytest-xdist's layout).
    return shared_tiny_pipeline(tmp_path_factory.getbasetemp().parent / "tiny", own)


@pytest.fixture(scope="session")
def planted_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's planted rounds (support/planted.py): each a copy of the tiny run with porting mistakes in its
    source, retrained and validated once for every worker, by whichever test asks first. test_planted_porting_bugs.py
    judges two mistakes that test_taps_localize.py plants alike (the same edit) on the round that file makes."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "planted"
