"""The environment manifest: for each isolated environment the Python it requires, key package versions (as
locked, and as the train_export stage found them installed: export.json's `versions`) and lock hash, plus the
orchestrator's own, and the params used.

Read from files the report stage depends on (pyproject.toml, the locks, each run's export.json), never from the
machine building the report (no importlib.metadata, no pyvenv.cfg, no git): the manifest, like the whole
report, is a pure function of the stage's inputs."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipelines import environments

# Worth showing although no member names them directly (they come in through a framework).
NOTABLE = ("numpy", "keras", "jaxlib", "protobuf")
ORCHESTRATOR = ("dvc", "numpy", "onnx", "matplotlib", "jinja2", "pydantic", "safetensors")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", re.MULTILINE)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass
class EnvironmentRow:
    name: str
    lock: str
    lock_sha256: str | None
    python: str | None
    packages: dict[str, str] = field(default_factory=dict)  # name -> pinned version
    measured: dict[str, str] = field(default_factory=dict)  # name -> version train_export found installed
    note: str = ""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(text: str) -> dict[str, str]:
    return {normalize(name): version for name, version in _PIN.findall(text)}


def _read_pins(path: Path) -> dict[str, str]:
    try:
        return lock_pins(path.read_text())
    except OSError:
        return {}


def sha256(path: Path) -> str | None:
    try:
        return environments.lock_sha256(path)  # the hash the runner and the image labels use
    except OSError:
        return None


def _project(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _direct_dependencies(member: Path, variant: str) -> list[str]:
    project = _project(member / "pyproject.toml")
    specs = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get(variant, [])]
    names = [normalize(m.group(1)) for s in specs if (m := _NAME.match(s))]
    return [n for n in names if n not in ("pytest", "ruff")]  # test tools are not what the model runs on


def _members(root: Path) -> dict[str, environments.Environment]:
    try:
        return environments.read(root)
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return {}


def environment_rows(
    root: Path,
    variant: str = "cpu",
    measured: Mapping[str, Mapping[str, str]] | None = None,
) -> list[EnvironmentRow]:
    """One row per environment of root's pyproject.toml, then the orchestrator's. `measured`: environment ->
    the versions its runs' export.json records (what actually ran, next to what the lock pins); a recorded
    "python" is shown as the environment's Python, else the Python the project requires."""
    required = _project(root / "pyproject.toml").get("requires-python")
    rows = []
    for name, member in _members(root).items():
        lock = member.lock(variant, root)
        pins = _read_pins(lock)
        wanted = [*_direct_dependencies(root / member.package, variant), *NOTABLE]
        installed = dict((measured or {}).get(name, {}))
        python = installed.pop("python", None)
        rows.append(
            EnvironmentRow(
                name=name,
                lock=str(lock.relative_to(root)),
                lock_sha256=sha256(lock),
                python=python or required,
                packages={n: pins[n] for n in dict.fromkeys(wanted) if n in pins},
                measured=installed,
            )
        )
    pins = _read_pins(root / "requirements.lock")
    rows.append(
        EnvironmentRow(
            name="orchestrator (this report)",
            lock="requirements.lock",
            lock_sha256=sha256(root / "requirements.lock"),
            python=required,
            packages={n: pins[n] for n in ORCHESTRATOR if n in pins},
        )
    )
    return rows
