"""Helpers for test_lineage.py: reading hashes out of dvc.lock, comparing two locks, and running `dvc repro`
until a chosen moment, then SIGKILLing its whole process group (DVC and the stage it runs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from support import sh

GIT = ["git", "-c", "user.name=rosetta", "-c", "user.email=rosetta@localhost"]


def read_lock(root: Path) -> dict[str, Any]:
    return (yaml.safe_load((root / "dvc.lock").read_text()) or {}).get("stages", {})


def lock_hashes(root: Path, kinds: tuple[str, ...] = ("outs",), stages: set[str] | None = None) -> dict[str, str]:
    """"<stage> <kind> <path>" -> md5 for every entry of those kinds in root/dvc.lock (only of `stages`, if given:
    dvc.lock keeps the entries of stages that dvc.yaml no longer has until it is regenerated)."""
    hashes = {}
    for stage, entry in read_lock(root).items():
        if stages is not None and stage not in stages:
            continue
        for kind in kinds:
            for item in entry.get(kind, []):
                hashes[f"{stage} {kind} {item['path']}"] = item.get("md5", "?")
    return hashes


def differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per key whose hash differs or that only one side has."""
    return [f"{key}: {before.get(key, 'absent')} -> {after.get(key, 'absent')}"
            for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]


def manifest(root: Path, md5: str) -> dict[str, str]:
    """relpath -> md5 of every file of an output folder, from the .dir manifest in root's DVC cache ({} if absent)."""
    path = root / ".dvc/cache/files/md5" / md5[:2] / md5[2:]
    try:
        return {entry["relpath"]: entry["md5"] for entry in json.loads(path.read_text())}
    except (OSError, ValueError):
        return {}


def subset_differences(full_root: Path, part_root: Path, full: dict[str, str], part: dict[str, str],
                       models: list[str]) -> list[str]:
    """A run of some of the models (`part`, its lock hashes) against a finished run of all of them (`full`), output
    by output, file by file from the two caches' manifests: every file the part run wrote must be the full run's,
    byte for byte, and every file of its `models` (a folder or a file named for the model) must be there. Outputs
    that are one file must be equal."""
    lines = []
    for key in sorted(full.keys() | part.keys()):
        old, new = full.get(key, "absent"), part.get(key, "absent")
        if old == new:
            continue
        if not (old.endswith(".dir") and new.endswith(".dir")):
            lines.append(f"{key}: {old} -> {new}")
            continue
        a, b = manifest(full_root, old), manifest(part_root, new)
        if not a or not b:
            lines.append(f"{key}: {old} -> {new} (manifests not in the caches)")
            continue
        differ = [rel for rel in sorted(b) if a.get(rel) != b[rel]]
        missing = [rel for rel in sorted(a) if rel not in b and rel.split("/")[0].split(".")[0] in models]
        if differ or missing:
            lines.append(f"{key}: files that differ from the full run: {', '.join(differ[:20]) or '-'}; "
                         f"files of {', '.join(models)} missing: {', '.join(missing[:20]) or '-'}")
    return lines


def copy_run(source: Path, dest: Path) -> Path:
    """A finished run (work tree, git, DVC cache) copied whole, so a test can change it freely."""
    shutil.copytree(source, dest, symlinks=True)
    return dest


def lock_parses(root: Path) -> bool:
    try:
        return isinstance(yaml.safe_load((root / "dvc.lock").read_text()), dict)
    except (OSError, yaml.YAMLError):
        return False


def rwlock_entries(root: Path) -> int | None:
    """How many paths DVC's .dvc/tmp/rwlock still holds (None: unreadable, as a kill mid-write leaves it)."""
    path = root / ".dvc/tmp/rwlock"
    if not path.is_file():
        return 0
    try:
        lock = json.loads(path.read_text())
    except ValueError:
        return None
    return len(lock.get("read", {})) + len(lock.get("write", {}))


# What a held stage prints (pipelines.measurements._hold): the kill comes as soon as it is read.
HELD = r"^\[rosetta\] test hold: "


class Kill(NamedTuple):
    """When to kill: `delay` seconds after the `occurrence`-th line of `dvc repro`'s output matching `pattern`.

    With `hold` ("<stage>:<point>#<n>", pipelines.measurements' ROSETTA_TEST_HOLD), the stage waits at that point
    until it is killed, so the kill lands there on a machine of any speed; a moment inside DVC's own work (no stage
    of ours to hold) is keyed to DVC's output line alone."""

    moment: str
    pattern: str
    occurrence: int
    delay: float
    hold: str = ""

    @classmethod
    def held(cls, moment: str, hold: str) -> Kill:
        return cls(moment, HELD, 1, 0.0, hold)


class KillEvent(NamedTuple):
    moment: str
    killed: bool
    seconds: float  # from the start of `dvc repro` to the kill (or to its end)
    stage: str | None  # the last stage DVC had started
    lock_parsed: bool  # whether dvc.lock was still valid YAML after the kill
    rwlock_entries: int | None  # entries left in .dvc/tmp/rwlock (None: unreadable)
    output: str


def repro_and_kill(root: Path, env: dict[str, str], kill: Kill, limit: float = 900,
                   targets: tuple[str, ...] | list[str] = ()) -> KillEvent:
    """Start `dvc repro [targets]` in its own session; SIGKILL its process group at the moment `kill` names."""
    hold = {}
    if kill.hold:
        counter = root / ".dvc/tmp/test-hold-count"
        counter.unlink(missing_ok=True)  # a fresh count for each run: "#2" is the second process of this run
        hold = {"ROSETTA_TEST_HOLD": kill.hold, "ROSETTA_TEST_HOLD_COUNT": str(counter)}
    proc = subprocess.Popen(
        ["dvc", "repro", *targets], cwd=root, env={**env, **hold, "PYTHONUNBUFFERED": "1"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    lines: list[str] = []
    deadline: list[float] = []

    def read() -> None:
        seen = 0
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if not deadline and re.search(kill.pattern, line):
                seen += 1
                if seen == kill.occurrence:
                    deadline.append(time.monotonic() + kill.delay)

    reader = threading.Thread(target=read, daemon=True)
    started = time.monotonic()
    reader.start()
    killed = False
    while proc.poll() is None:
        now = time.monotonic()
        if (deadline and now >= deadline[0]) or now - started > limit:
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.005)
    seconds = time.monotonic() - started
    proc.wait()
    reader.join(timeout=30)
    output = "".join(lines)
    stages = re.findall(r"(?:Running stage|Stage) '([^']+)'", output)
    if seconds > limit:
        raise AssertionError(f"dvc repro ran past {limit}s without reaching {kill.moment!r}:\n{output[-4000:]}")
    return KillEvent(kill.moment, killed, round(seconds, 1), stages[-1] if stages else None, lock_parses(root),
                     rwlock_entries(root), output)


def recover(root: Path, env: dict[str, str], event: KillEvent) -> list[str]:
    """What a user does after a kill, done the same way; returns what was done.

    DVC rewrites dvc.lock (and .dvc/tmp/rwlock) in place, not through a rename: a kill in the middle of that
    write leaves it truncated and every later DVC command refuses to parse it. The user restores dvc.lock from
    git; `dvc repro` then takes every stage that had finished from the run cache instead of running it again.
    Stale entries of killed processes in .dvc/tmp/rwlock need nothing: DVC drops them itself (with a warning)."""
    done = []
    if not event.lock_parsed:
        sh([*GIT, "checkout", "--", "dvc.lock"], root, env)
        done.append("dvc.lock truncated by the kill: restored with `git checkout -- dvc.lock`")
    if event.rwlock_entries is None:
        (root / ".dvc/tmp/rwlock").unlink()
        done.append(".dvc/tmp/rwlock truncated by the kill: removed")
    return done
