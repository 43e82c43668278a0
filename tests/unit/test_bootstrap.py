"""The orchestrator's bootstrap (the Makefile's `$(VENV)/.installed`): pip installs uv from requirements-uv.lock, which
must be uv's entry of requirements.lock, its version and hashes, as `make locks` writes it; common is installed
editable with the build backend requirements.lock pins, without build isolation, so nothing unpinned is fetched."""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement

from support import REPO
from tooling.build.jax2tf.env import entries


def test_the_uv_lock_is_uv_as_requirements_lock_pins_it() -> None:
    uv = entries(REPO / "requirements-uv.lock")
    assert list(uv) == ["uv"], list(uv)
    version, hashes = uv["uv"]
    assert (version, hashes) == entries(REPO / "requirements.lock")["uv"] and hashes


def test_commons_build_backend_is_pinned_in_requirements_lock() -> None:
    build = tomllib.loads((REPO / "packages/common/pyproject.toml").read_text())["build-system"]
    pins = entries(REPO / "requirements.lock")
    for requirement in map(Requirement, build["requires"]):
        assert requirement.name in pins, f"{requirement.name}: not in requirements.lock"
        assert requirement.specifier.contains(pins[requirement.name][0]), (requirement, pins[requirement.name])
    recipe = (REPO / "Makefile").read_text()
    assert "--no-build-isolation" in recipe and "-e packages/common" in recipe
