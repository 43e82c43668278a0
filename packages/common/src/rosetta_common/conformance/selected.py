"""The architectures under test: every registered one, or those ROSETTA_TEST_MODELS names (`make test-model`;
rosetta_common.testing.ARCHS). A test of one architecture that is not among them is skipped, saying so."""

from __future__ import annotations

import pytest

from rosetta_common.testing import ARCHS, MODELS_VARIABLE


def skip_unless_tested(arch: str) -> None:
    if arch not in ARCHS:
        pytest.skip(f"{arch} is not under test ({MODELS_VARIABLE}={', '.join(ARCHS)})")
