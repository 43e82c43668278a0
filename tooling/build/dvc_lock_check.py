"""Is the committed dvc.lock in step with the code and params? Fails, one line per stage, when it is not.

    python -m tooling.build.dvc_lock_check              # a fresh copy of this checkout, without outputs (what CI sees)
    python -m tooling.build.dvc_lock_check --in-place   # this working tree as it is (outputs present or not)
    make lock-check

A lock is stale when `dvc status` reports, for some stage of dvc.yaml, a dependency or param that is modified,
new or deleted, a changed command, or when the stage has no entry in dvc.lock; and when dvc.lock keeps an entry
for a stage that dvc.yaml no longer has (`dvc repro` never removes those). Dependencies that the pipeline itself
produces (another stage's output, or a folder holding outputs, such as `artifacts`) are not judged here: a
fresh checkout has none of them, and their lineage is checked through the stage that writes them. Outputs are
not judged either: whether this workspace holds them is `dvc status`'s business, not the lock's.

The fix for a stale lock: `dvc repro` (or `rm dvc.lock && dvc repro` when stages were removed or renamed), then
commit dvc.lock.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
ACCEPTED_STRINGS = {"always changed"}  # `always_changed: true` stages: not a sign of a stale lock


def checkout_files(root: Path) -> list[str]:
    """Every file a fresh clone of `root` would hold, plus untracked files that git does not ignore (what the
    user is about to commit): outputs, caches and scratch are ignored, so they are left out."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split("\0")
    return [rel for rel in listed if rel and (root / rel).is_file()]


def fresh_copy(root: Path, dest: Path) -> Path:
    """`root`'s checkout files (no outputs, no DVC cache) in `dest`, made a git repository (DVC wants one)."""
    for rel in checkout_files(root):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True, capture_output=True)
    return dest


def dvc_status(root: Path) -> dict[str, list[Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"error: dvc status failed in {root}:\n{result.stderr.strip()}")
    return json.loads(result.stdout or "{}")


def pipeline_stages(root: Path) -> dict[str, list[str]]:
    """Each stage of dvc.yaml (matrix entries expanded) -> the paths of its outputs, relative to `root`."""
    from dvc.repo import Repo  # the orchestrator's DVC, as `dvc status` uses

    with Repo(str(root)) as repo:
        return {
            stage.name: [str(PurePosixPath(Path(out.fs_path).relative_to(root.resolve()))) for out in stage.outs]
            for stage in repo.index.stages
            if stage.path_in_repo == "dvc.yaml"
        }


def locked_stages(root: Path) -> set[str]:
    lock = root / "dvc.lock"
    if not lock.is_file():
        return set()
    return set((yaml.safe_load(lock.read_text()) or {}).get("stages", {}))


def produced(path: str, outputs: set[str]) -> bool:
    """Whether `path` is an output, lies inside one, or is a folder that holds one."""
    p = PurePosixPath(path)
    return any(p == PurePosixPath(out) or p in PurePosixPath(out).parents or PurePosixPath(out) in p.parents
               for out in outputs)


def stage_problems(entries: list[Any], outputs: set[str]) -> list[str]:
    """What in one stage's `dvc status` entries says the lock is stale, as short phrases."""
    problems = []
    for entry in entries:
        if isinstance(entry, str):
            if entry not in ACCEPTED_STRINGS:
                problems.append(entry)
            continue
        for path, state in entry.get("changed deps", {}).items():
            if isinstance(state, dict):  # a params file: {param: state}
                problems += [f"param {name} ({st})" for name, st in state.items()]
            elif not produced(path, outputs):
                problems.append(f"{path} ({state})")
    return problems


def check(root: Path) -> list[str]:
    """One line per stale stage of the DVC project at `root` (empty: the lock is in step)."""
    stages = pipeline_stages(root)
    outputs = {out for outs in stages.values() for out in outs}
    locked = locked_stages(root)
    status = dvc_status(root)
    lines = []
    for name in stages:
        if name not in locked:
            lines.append(f"{name}: not in dvc.lock")
            continue
        problems = stage_problems(status.get(name, []), outputs)
        if problems:
            lines.append(f"{name}: {', '.join(problems)}")
    lines += [f"{name}: in dvc.lock but not in dvc.yaml" for name in sorted(locked - set(stages))]
    return lines


def committed_lock(root: Path) -> dict[str, Any] | None:
    """dvc.lock as the last commit holds it (None outside git or before a first commit of it)."""
    shown = subprocess.run(["git", "show", "HEAD:dvc.lock"], cwd=root, capture_output=True, text=True, check=False)
    return (yaml.safe_load(shown.stdout) or {}).get("stages", {}) if shown.returncode == 0 else None


def moved_outputs(root: Path) -> list[str]:
    """Stages whose outputs in the working dvc.lock differ from the committed one's while nothing they depend on
    differs: the code, params and locks are the committed ones, so what moved them is the machine."""
    committed = committed_lock(root)
    if committed is None or not (root / "dvc.lock").is_file():
        return []
    working = (yaml.safe_load((root / "dvc.lock").read_text()) or {}).get("stages", {})
    outputs = {out for outs in pipeline_stages(root).values() for out in outs}

    def own(entry: dict[str, Any], kind: str) -> list[tuple[str, str]]:
        return sorted((item["path"], item.get("md5", "")) for item in entry.get(kind, [])
                      if kind == "outs" or not produced(item["path"], outputs))

    return [name for name, entry in working.items() if name in committed
            and own(entry, "deps") == own(committed[name], "deps") and entry.get("params") == committed[name].get(
                "params") and own(entry, "outs") != own(committed[name], "outs")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tooling.build.dvc_lock_check", description=__doc__.split("\n")[0])
    parser.add_argument("--in-place", action="store_true",
                        help="check this working tree as it is, instead of a fresh copy without outputs")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the repository to check (default: this one)")
    args = parser.parse_args(argv)
    root = args.repo.resolve()
    if args.in_place:
        lines = check(root)
    else:
        with tempfile.TemporaryDirectory(prefix="rosetta-lock-check-") as tmp:
            lines = check(fresh_copy(root, Path(tmp)))
    if lines:
        print(f"error: dvc.lock is stale ({len(lines)} stage(s)); run `dvc repro` (`rm dvc.lock && dvc repro` if "
              "stages were removed or renamed) and commit dvc.lock:", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"dvc.lock is in step with the code and params of {len(locked_stages(root))} stage(s)")
    moved = moved_outputs(root)  # the working dvc.lock against the committed one, whichever mode judged staleness
    if moved:
        from pipelines.measurements import cpu  # here: only this message needs it

        machine = cpu()
        print(f"note: the outputs of {', '.join(moved)} differ from the committed dvc.lock although their code, "
              f"params and locks do not: the CPU is the cause (this one: {machine['model']}, "
              f"{' '.join(machine['isa']) or 'no flags read'}); oneDNN, MKL, XLA, OpenBLAS and ONNX Runtime choose "
              "kernels by instruction set: docs/lineage.md, 'The same bytes across CPUs'", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
