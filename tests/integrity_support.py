"""Helpers for the integrity tests (test_bad_inputs.py, test_stage_kills.py): the stage commands exactly as dvc.yaml
runs them, fingerprints of every lineage output, and the one-line error a failed stage must print."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

# The folders that hold every stage's lineage outputs (DVC outs); measurements/ and .rosetta/ are not lineage.
OUTPUT_DIRS = ("data", "artifacts", "reports")
SCRATCH = Path(".rosetta/tmp")

PY = sys.executable  # the orchestrator's interpreter (dvc.yaml's `python` under support.orchestrator_env)
DATA = [PY, "-m", "pipelines.stages.data"]


def init(model: str) -> list[str]:
    return [PY, "-m", "pipelines.stages.init", model]


def train_export(framework: str, model: str) -> list[str]:
    return [PY, "-m", "pipelines.runner", framework, "--", "python", "-m", "pipelines.stages.train_export",
            framework, model]


VALIDATE = [PY, "-m", "pipelines.runner", "validation", "--", "python", "-m", "pipelines.stages.validate"]


def fingerprint(root: Path, dirs: tuple[str, ...] = OUTPUT_DIRS) -> dict[str, str]:
    """Relative path -> sha256 of every file under `dirs` (symbolic links by their target, as a reader sees them)."""
    found = {}
    for name in dirs:
        for path in sorted((root / name).rglob("*")):
            if path.is_file():
                found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def tree(folder: Path) -> dict[str, str]:
    """One folder's files, relative to it, with their sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(root: Path) -> list[str]:
    """Temporary files where no stage may leave one: *.tmp anywhere under the lineage folders."""
    return sorted(str(p.relative_to(root)) for name in OUTPUT_DIRS for p in (root / name).rglob("*")
                  if p.name.endswith(".tmp") or ".tmp" in p.name.split("."))


def scratch(root: Path) -> list[str]:
    """What the stages' scratch space holds (staged outputs that were never published)."""
    folder = root / SCRATCH
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


_PROGRESS = re.compile(r"^\S.*\d+%\|")  # a tqdm bar, as it is redrawn after \r


def message_lines(stderr: str) -> list[str]:
    """stderr's lines that are not progress bars (tqdm redraws after \\r; leave=False clears with blanks)."""
    lines = [part.strip() for part in re.split(r"[\r\n]", stderr)]
    return [line for line in lines if line and not _PROGRESS.match(line)]


def env_without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


