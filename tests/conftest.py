"""Fixtures shared by the cross-cutting tests; their helpers live in support.py (see its docstring for why
they are not imported from here)."""

import os
import sys
from pathlib import Path

import pytest

# support.py (shared helpers) sits beside the tests; common and pipelines come from this checkout.
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "packages/common/src")]

from support import TinyRun, run_tiny_pipeline, shared_tiny_pipeline  # noqa: E402  (needs the path above)

# Under pytest-xdist (`make test` runs this suite on two workers, tooling/run_tests.py) every test file runs whole on
# one worker, so a module's fixtures are made once; test_planted_porting_bugs.py runs beside test_taps_localize.py,
# whose planted rounds it judges too (planted_runs below).
SAME_WORKER = {"tests/test_planted_porting_bugs.py": "tests/test_taps_localize.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's file scheduling (`--dist loadfile`) with the files of SAME_WORKER joined. (Its `loadgroup`
    with an xdist_group mark per file would say the same, but does not group under pytest 9.2: pytest-xdist
    issue 1386.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SAME_WORKER.get(path, path)

    return FileScheduling(config, log)


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
def planted_runs() -> dict:
    """Validate runs of planted copies of the tiny run, by the round's plant ids: test_planted_porting_bugs.py
    judges two mistakes that test_taps_localize.py plants alike (the same edit), on the round that file makes
    (minutes of retraining each, made by whichever test needs it first)."""
    return {}
