"""Helpers for the integrity tests (test_bad_inputs.py, test_stage_kills.py, test_lineage.py): the stage commands
exactly as dvc.yaml runs them, fingerprints of every lineage output, the one-line error a failed stage must print,
and a command killed at a point of its output with the outputs it leaves checked (Started, check_outputs)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

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


class Started:
    """A command started in its own session (process group), its stdout and stderr read as they come."""

    def __init__(self, cmd: list[str], root: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 1 << 16):
            self.chunks.append(chunk)

    def output(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def kill_when(self, ready: Callable[[], bool], timeout: float = 300.0) -> None:
        """SIGKILL the whole group as soon as `ready()`; fail if the command ended first (the point was missed)."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                self.reader.join(5)
                pytest.fail(f"the command ended (exit {self.proc.returncode}) before the kill point:\n"
                            f"{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                os.killpg(self.proc.pid, signal.SIGKILL)
                pytest.fail(f"no kill point within {timeout}s:\n{self.output()[-4000:]}")
            time.sleep(0.002)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.reader.join(10)
        assert self.proc.returncode == -signal.SIGKILL, self.output()[-4000:]
        deadline = time.monotonic() + 30  # the others of the group die asynchronously (a big process takes a while)
        while group_alive(self.proc.pid):
            assert time.monotonic() < deadline, "a process of the killed group survived SIGKILL"
            time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is left in process group `pgid`."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def consistent(folder: Path) -> bool:
    """A complete run folder: export.json records the sha256 of every other file in it, and each matches."""
    record = folder / "export.json"
    if not record.is_file():
        return False
    recorded = json.loads(record.read_text())["sha256"]
    files = tree(folder)
    files.pop("export.json")
    return files == recorded


def check_outputs(root: Path, before: dict[str, str], folders: dict[str, str]) -> dict[str, str]:
    """No partial or mixed outputs: every file outside the run folders is as `before`; each run folder in `folders`
    is in a state it allows ("old": byte-identical to before; "old|absent": that or gone; "complete": consistent
    with its own export.json). Returns each folder's state."""
    assert not leftovers(root), leftovers(root)
    after = fingerprint(root)
    outside = {k: v for k, v in after.items() if not any(k.startswith(f + "/") for f in folders)}
    expected = {k: v for k, v in before.items() if not any(k.startswith(f + "/") for f in folders)}
    assert outside == expected, sorted(k for k in outside.keys() | expected.keys() if outside.get(k) != expected.get(k))
    states = {}
    for folder, allowed in folders.items():
        old = {k: v for k, v in before.items() if k.startswith(folder + "/")}
        now = {k: v for k, v in after.items() if k.startswith(folder + "/")}
        if now == old:
            state = "old"
        elif not (root / folder).exists():
            state = "absent"
        else:
            assert consistent(root / folder), f"{folder}: neither the old folder nor a complete new one: mixed"
            state = "complete"
        assert state in allowed.split("|"), f"{folder}: {state}, allowed {allowed}"
        states[folder] = state
    return states
