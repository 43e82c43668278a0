"""Fixtures shared by the cross-cutting tests; their helpers live in support.py (see its docstring for why
they are not imported from here)."""

import sys
from pathlib import Path

import pytest

# support.py (shared helpers) sits beside the tests; common and pipelines come from this checkout.
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "packages/common/src")]

from support import TinyRun, run_tiny_pipeline  # noqa: E402  (needs the path above)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """The whole pipeline with TINY params, run once per session (minutes) and shared by every test that needs a
    finished run. Tests that change it must leave it a valid finished run with a clean `dvc status` (rerunning
    `dvc repro`, or `dvc checkout` after damaging outputs, as test_pipeline_e2e.py does); tests that damage many
    artifacts work on their own copy (see test_validate_failures.py)."""
    return run_tiny_pipeline(tmp_path_factory.mktemp("rosetta") / "repo")


@pytest.fixture(scope="session")
def planted_runs() -> dict:
    """Validate runs of planted copies of the tiny run, by the round's plant ids: test_planted_porting_bugs.py
    judges two mistakes that test_taps_localize.py plants alike (the same edit), on the round that file makes
    (minutes of retraining each, made by whichever test needs it first)."""
    return {}
