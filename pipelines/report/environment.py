"""The environment manifest: for each isolated environment its Python, key package versions (as locked, and as
the bench stage found them installed) and lock hash, plus the orchestrator's own, the git revision and the params
used. Read from files (pyproject.toml, the locks, each environment's pyvenv.cfg, reports/latency records), never
by importing a framework or the bench code."""

from __future__ import annotations

import platform
import re
import subprocess
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
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
    measured: dict[str, str] = field(default_factory=dict)  # name -> version the bench stage found installed
    note: str = ""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(text: str) -> dict[str, str]:
    return {normalize(name): version for name, version in _PIN.findall(text)}


def sha256(path: Path) -> str | None:
    try:
        return environments.lock_sha256(path)  # the hash the runner and the image labels use
    except OSError:
        return None


def installed(names: Iterable[str]) -> dict[str, str]:
    """Versions installed in this (the orchestrator's) environment."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _direct_dependencies(member: Path, variant: str) -> list[str]:
    try:
        project = tomllib.loads((member / "pyproject.toml").read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return []
    specs = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get(variant, [])]
    names = [normalize(m.group(1)) for s in specs if (m := _NAME.match(s))]
    return [n for n in names if n not in ("pytest", "ruff")]  # test tools are not what the model runs on


def _python_of(env_dir: Path) -> str | None:
    try:
        for line in (env_dir / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version_info", "version"):
                return value.strip()
    except OSError:
        pass
    return None


def _members(root: Path) -> dict[str, environments.Environment]:
    try:
        return environments.read(root)
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return {}


def environment_rows(
    root: Path,
    envs_dir: Path | None,
    variant: str = "cpu",
    measured: Mapping[str, Mapping[str, str]] | None = None,
) -> list[EnvironmentRow]:
    """One row per environment of root's pyproject.toml, then the orchestrator's. `measured`: environment ->
    the versions its bench records hold (what actually ran, next to what the lock pins)."""
    rows = []
    for name, member in _members(root).items():
        package = member.package
        lock = member.lock(variant, root)
        try:
            pins = lock_pins(lock.read_text())
        except OSError:
            pins = {}
        wanted = [*_direct_dependencies(root / package, variant), *NOTABLE]
        packages = {n: pins[n] for n in dict.fromkeys(wanted) if n in pins}
        env_dir = envs_dir / f"{name}-{variant}" if envs_dir else None
        python = _python_of(env_dir) if env_dir else None
        rows.append(
            EnvironmentRow(
                name=name,
                lock=str(lock.relative_to(root)),
                lock_sha256=sha256(lock),
                python=python,
                packages=packages,
                measured=dict((measured or {}).get(name, {})),
                note="" if python else "environment not built here: Python version unknown",
            )
        )
    packages = installed(ORCHESTRATOR)
    rows.append(
        EnvironmentRow(
            name="orchestrator (this report)",
            lock="requirements.lock",
            lock_sha256=sha256(root / "requirements.lock"),
            python=platform.python_version(),
            packages=packages,
        )
    )
    return rows


def git_revision(root: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        revision = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout, or git is missing)"
    return f"{revision} (uncommitted changes)" if dirty else revision
