"""The one place that knows how to run a command inside a framework's own isolated environment.

    python -m pipelines.runner torch -- python -m pipelines.stages.train torch

Environments are virtualenvs built from each member's lock file on first use and rebuilt when the lock
changes; an unchanged lock reuses its environment without touching the network. Our own code is not
installed into them: the runner puts `packages/common/src`, the framework's `src` and the repository root
on PYTHONPATH, so every run sees the checkout it was started from.

Where it runs is chosen outside params.yaml (switching must not invalidate DVC outputs):
ROSETTA_RUNTIME=local (default) or container; ROSETTA_VARIANT=cpu (default) or cuda.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipelines.environments import (
    ENVIRONMENTS,
    REPO_ROOT,
    VARIANTS,
    envs_dir,
    find_links,
    lock_path,
    lock_sha256,
    stage_environment,
    torch_cpu_index,
)

RUNTIMES = ("local", "container")


def _choice(var: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(var, allowed[0])
    if value not in allowed:
        raise SystemExit(f"error: {var}={value!r} is not allowed; choose one of {', '.join(allowed)}")
    return value


def lock_digest(env: str, variant: str) -> str:
    """The key of a built environment: its lock, and the interpreter it was built with."""
    lock = lock_path(env, variant)
    if not lock.is_file():
        raise SystemExit(
            f"error: lock file {lock.relative_to(REPO_ROOT)} is missing; run python -m tooling.build.env_locks {env}"
        )
    return lock_sha256(lock, f"python{sys.version_info.major}.{sys.version_info.minor}".encode())


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wheel_sources(env: str, variant: str) -> list[str]:
    """uv's options for where wheels come from, besides its default index (PyPI). A configured find-links
    (ROSETTA_FIND_LINKS, UV_FIND_LINKS, PIP_FIND_LINKS, pip's global.find-links) comes first; without one, the torch
    CPU lock's `+cpu` torch comes from PyTorch's CPU index (environments.torch_cpu_index), searched beside the
    default index (unsafe-best-match: every pin is exact and hash-checked, so each wheel is the one the lock names,
    wherever it is found). Says where torch comes from, in one line."""
    links = find_links()
    if links:
        if env == "torch":
            print(f"[rosetta] {env}-{variant}: torch from the configured find-links {links} (else the default index)",
                  file=sys.stderr)
        return ["--find-links", links]
    if env == "torch" and variant == "cpu":
        index = torch_cpu_index()
        print(f"[rosetta] {env}-{variant}: torch's CPU wheel from {index} (no find-links configured; "
              f"ROSETTA_TORCH_INDEX or ROSETTA_FIND_LINKS changes it)", file=sys.stderr)
        return ["--index", index, "--index-strategy", "unsafe-best-match"]
    return []


def ensure_env(env: str, variant: str = "cpu") -> Path:
    """Return the environment's folder, building it from its lock if it is missing or stale."""
    if env not in ENVIRONMENTS:
        raise SystemExit(f"error: environment {env!r} is unknown; choose one of {', '.join(ENVIRONMENTS)}")
    target = envs_dir() / f"{env}-{variant}"
    marker = target / "rosetta-lock.sha256"
    digest = lock_digest(env, variant)
    if marker.is_file() and marker.read_text().strip() == digest:
        return target
    with _exclusive(envs_dir() / f".{env}-{variant}.flock"):
        if marker.is_file() and marker.read_text().strip() == digest:
            return target  # another process built it while we waited
        lock = lock_path(env, variant)
        print(f"[rosetta] building environment {env}-{variant} from {lock.relative_to(REPO_ROOT)}", file=sys.stderr)
        shutil.rmtree(target, ignore_errors=True)
        uv = [sys.executable, "-m", "uv"]
        install = [*uv, "pip", "sync", "--require-hashes", "--python", str(target / "bin" / "python"), str(lock)]
        install += wheel_sources(env, variant)
        for step in ([*uv, "venv", "--quiet", "--python", sys.executable, str(target)], install):
            code = subprocess.run(step, check=False).returncode  # uv prints its own reason above
            if code != 0:
                shutil.rmtree(target, ignore_errors=True)
                raise SystemExit(
                    f"error: {lock.relative_to(REPO_ROOT)}: building environment {env}-{variant} failed "
                    f"(uv {step[3]} exited {code}; its reason is above); nothing was left half-built"
                )
        marker.write_text(digest + "\n")  # written last: a half-built environment is never reused
    return target


def run(env: str, command: list[str]) -> int:
    """Run `command` inside `env`; a leading `python` means that environment's interpreter."""
    if not command:
        raise SystemExit("error: no command given after --")
    runtime = _choice("ROSETTA_RUNTIME", RUNTIMES)
    variant = _choice("ROSETTA_VARIANT", VARIANTS)
    if runtime == "container":
        # Imported here: the local runtime never needs it. It imports no runner name, so there is no cycle.
        from pipelines import containers  # the container runtime: same stages, one image per environment

        return containers.run(env, variant, command)
    env_dir = ensure_env(env, variant)
    if command[0] in ("python", "python3"):
        command = [str(env_dir / "bin" / "python"), *command[1:]]
    return subprocess.run(command, env=stage_environment(env, env_dir), cwd=os.getcwd(), check=False).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--setup"]:
        # Build (or confirm) environments up front, e.g. before a first `dvc repro`.
        variant = _choice("ROSETTA_VARIANT", VARIANTS)
        for env in argv[1:] or list(ENVIRONMENTS):
            print(f"[rosetta] environment {env}-{variant}: {ensure_env(env, variant)}", file=sys.stderr)
        return 0
    parser = argparse.ArgumentParser(description="Run a command inside one of Rosetta's environments.")
    parser.add_argument("env", help=f"one of {', '.join(ENVIRONMENTS)}, or --setup [ENV...]")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.env not in ENVIRONMENTS:
        parser.error(f"env {args.env!r} is unknown; choose one of {', '.join(ENVIRONMENTS)}")
    return run(args.env, command)


if __name__ == "__main__":
    raise SystemExit(main())
