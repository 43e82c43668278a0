"""Atomic file writes and all-or-nothing stage outputs: a reader (or DVC, or a later stage) never sees a
half-written output, and a stage's outputs appear together or not at all.

Temporary files live in `.rosetta/tmp/` at the repository root (git- and DVC-ignored), never inside a folder
that another stage depends on, so a killed stage leaves nothing a later stage or DVC could pick up. Outside a
repository (tests writing under /tmp) they fall back to a sibling of the target.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

SCRATCH = ".rosetta"  # at the repository root, beside dvc.yaml


def scratch_dir(target: Path, kind: str = "tmp") -> Path:
    """`<repo>/.rosetta/<kind>` for a target inside a repository (the nearest folder up holding dvc.yaml), on
    the same file system so that a rename publishes; else the target's own folder."""
    target = target.resolve()
    for folder in target.parents:
        if (folder / "dvc.yaml").is_file():
            scratch = folder / SCRATCH / kind
            scratch.mkdir(parents=True, exist_ok=True)
            return scratch
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.parent


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path for `path`; on success it is renamed onto `path`, on failure removed.

    Works for files and for folders (a folder that already exists at `path` is replaced whole).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=scratch_dir(target)))
    staged = tmp / target.name
    try:
        yield staged
        _replace(staged, target, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace(staged: Path, target: Path, scratch: Path) -> None:
    """Put `staged` at `target`. A folder cannot be renamed over a non-empty one, so the old folder is first
    moved aside (into scratch, not deleted in place): a kill between the two renames leaves `target` absent,
    which DVC reruns, never a mix of old and new files."""
    if target.is_dir() and not target.is_symlink():
        os.replace(target, scratch / ".old")
    os.replace(staged, target)


@contextmanager
def staged_outputs(target: str | os.PathLike[str]) -> Iterator[Path]:
    """A stage's whole output folder, built in scratch and published at `target` in one step when the block
    succeeds; on any failure (or a kill) `target` keeps its previous contents."""
    with atomic_path(target) as staged:
        staged.mkdir()
        yield staged


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    write_bytes(path, text.encode())


def dumps(obj: Any) -> str:
    """JSON as every output writes it: indented, NaN refused (a NaN is a bug, never a figure)."""
    return json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n"


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, dumps(obj))


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def losses_sha256(losses: Any) -> str:
    """A run's step losses as one digest (their float64 bytes): what ties a folder of replicates to the run they
    parted from."""
    return hashlib.sha256(np.asarray(losses, np.float64).tobytes()).hexdigest()
