"""The tiny run: this checkout copied with params small enough that every model, stage and check runs in
minutes, and `dvc repro` there. The cross-cutting tests (through tests/support/) and `make gpu-check` share it; it
lives in tooling/, not in tests/, so the GPU check needs no test file on its path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import yaml

from pipelines.environments import REPO_ROOT as REPO
from pipelines.environments import envs_dir
from rosetta_common.registry import ARCHITECTURES, REGISTRY


def orchestrator_env(**extra: str) -> dict[str, str]:
    """The orchestrator's interpreter first on PATH (dvc.yaml says `python`), common importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "packages/common/src"), str(REPO)])
    return {**env, **extra}


def sh(cmd: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command; with `check`, a failure raises with the tail of its output (DVC's is long)."""
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


# Params small enough for a whole-pipeline test: every model, stage and check runs, in minutes.
# Every registered model, at its entry's tiny settings and floor (rosetta_common.registry).
MODELS = list(ARCHITECTURES)
TINY = {
    "models": MODELS,
    "train": {"epochs": 2, "batch_size": 32, "optimizer": "adam"},
    "data": {"text": {"vocab_size": 2000, "max_length": 32}},
    "architecture": {name: dict(e.tiny) for name, e in REGISTRY.items() if e.tiny},
    "quality": {"min_test_accuracy": {name: e.tiny_floor for name, e in REGISTRY.items()}},
    "export": {"validation_batch_size": 16, "parity_batch_sizes": [1, 7, 1024]},
    # count: 5 lockstep-window replicates, as params.yaml. first: 2 to the end per framework before the interim look
    # (params.yaml's); the look sends the cnn on (it trains data-parallel too), parted: 4 in all, so that a
    # data-parallel test's two groups of 5 (the run and its 4 parted replicates each side) allow p down to 1/126,
    # below Holm's first threshold in a family of up to 6 (groups of 4 allow 1/35: no rejection at all in a
    # family of 2); the three single-process groups of 5, p down to 1e-4. at_most 30: a cap far above the 4, for
    # a replicate that ends in lockstep with its run counts for nothing.
    # models: cnn alone, the one model whose runs part in TINY (torch|tf at step 37): every other model keeps the
    # strict end-of-training bounds (test_planted_porting_bugs' learning-rate plant in mlp meets them).
    "replicates": {"count": 5, "parted": 4, "at_most": 30, "models": ["cnn"]},
    # train_dp@<framework> on, two workers: mlp and cnn (cnn with its replicates, data-parallel too); attention's
    # data-parallel path is the conformance suite's (test_distributed), as every model's is.
    "data_parallel": {"workers": 2, "models": ["mlp", "cnn"]},
}


def merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


def copy_checkout(root: Path) -> None:
    """This checkout as the user sees it (tracked and untracked files, not ignored) in `root`."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)


def copy_repo(root: Path, env: dict[str, str]) -> None:
    """This checkout (copy_checkout) in `root` with TINY params, committed to a fresh git repository (DVC wants
    one)."""
    copy_checkout(root)
    params = merge(yaml.safe_load((REPO / "params.yaml").read_text()), TINY)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git = ["git", "-c", "user.name=rosetta", "-c", "user.email=rosetta@localhost"]
    for cmd in (["git", "init", "-q"], [*git, "add", "-A"], [*git, "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)


class TinyRun(NamedTuple):
    """A finished `dvc repro` of a TINY copy: its root, the environment it ran with, and DVC's output."""

    root: Path
    env: dict[str, str]
    output: str


def tiny_env() -> dict[str, str]:
    """The tiny run's environment: the orchestrator's, sharing this checkout's framework environments."""
    return orchestrator_env(ROSETTA_ENVS_DIR=str(envs_dir()))


def run_tiny_pipeline(root: Path) -> TinyRun:
    """Copy this checkout to `root` with TINY params and run the whole pipeline there for real. The copy
    shares this checkout's environments (ROSETTA_ENVS_DIR), so nothing is rebuilt."""
    env = tiny_env()
    copy_repo(root, env)
    first = sh(["dvc", "repro"], root, env)
    return TinyRun(root, env, first.stdout + first.stderr)


def made_once(folder: Path, what: str, make: Callable[[], str]) -> str:
    """The text `make()` returns, made once in `folder` for every process that asks: the first to ask makes it
    while the others wait on a file lock, and it is kept in the folder for them. A `make` that raised fails every
    later asker with its message, without running again."""
    from filelock import FileLock  # DVC's own dependency, in the orchestrator's lock

    folder.mkdir(parents=True, exist_ok=True)
    made, failed = folder / "made.txt", folder / "failed.txt"
    with FileLock(str(folder / "lock")):
        if not made.is_file() and not failed.is_file():
            try:
                text = make()
            except Exception as error:
                failed.write_text(str(error))
                raise
            made.write_text(text)
    if failed.is_file():
        raise AssertionError(f"{what} failed:\n{failed.read_text()}")
    return made.read_text()


def shared_tiny_pipeline(shared: Path, root: Path) -> TinyRun:
    """The tiny run made once in `shared` for every process that asks (made_once), and copied whole (work tree,
    git, DVC cache) to `root` for this one: no one changes the run in `shared`, so each process's tests change
    only their own copy."""
    output = made_once(shared, "the shared tiny run", lambda: run_tiny_pipeline(shared / "repo").output)
    shutil.copytree(shared / "repo", root, symlinks=True)
    return TinyRun(root, tiny_env(), output)
