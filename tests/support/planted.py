"""Planted rounds: a copy of the tiny run with porting mistakes in its source, retrained and validated once
(test_taps_localize.py, test_planted_porting_bugs.py). A round is made once for every pytest-xdist worker, by the
first to ask, and read by all: its validate result is kept as JSON beside the copy, which no test changes."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Validated:
    returncode: int
    output: str  # the exit status, stdout's end and the whole of stderr (every FAILED line)
    rows: list[dict[str, Any]]
    parity: list[dict[str, Any]]  # validation.json's training_parity figures
    taps: dict[str, dict[str, Any]]  # validation.json's "taps", by model
    root: Path


def shared_round(rounds: Path, name: str, make: Callable[[Path], Validated]) -> Validated:
    """Round `name` of the session, made by `make(root)` in `rounds/name/repo` by the first process to ask while
    the others wait on a file lock. A round that failed to be made fails every later asker with its message."""
    from filelock import FileLock  # DVC's own dependency, in the orchestrator's lock

    folder = rounds / name
    folder.mkdir(parents=True, exist_ok=True)
    record, failed = folder / "validated.json", folder / "failed.txt"
    with FileLock(str(folder / "lock")):
        if not record.is_file() and not failed.is_file():
            try:
                made = make(folder / "repo")
            except Exception as error:
                failed.write_text(f"{type(error).__name__}: {error}")
                raise
            record.write_text(json.dumps({**dataclasses.asdict(made), "root": str(made.root)}))
    if failed.is_file():
        raise AssertionError(f"planted round {name} failed:\n{failed.read_text()}")
    fields = json.loads(record.read_text())
    return Validated(**{**fields, "root": Path(fields["root"])})
