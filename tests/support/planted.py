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

from tooling.build.tiny_run import made_once


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
    the others wait (tooling.build.tiny_run.made_once). A round that failed to be made fails every later asker
    with its message."""

    def made() -> str:
        run = make(rounds / name / "repo")
        return json.dumps({**dataclasses.asdict(run), "root": str(run.root)})

    fields = json.loads(made_once(rounds / name, f"planted round {name}", made))
    return Validated(**{**fields, "root": Path(fields["root"])})
