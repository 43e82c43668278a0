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
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("cpu", "cuda")
RUNTIMES = ("local", "container")
FRAMEWORKS = ("torch", "tf", "jax")


def _members() -> dict[str, dict[str, str]]:
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["rosetta"]["environments"]


MEMBERS = _members()
ENVIRONMENTS: dict[str, str] = {name: spec["package"] for name, spec in MEMBERS.items()}


def lock_path(env: str, variant: str) -> Path:
    return REPO_ROOT / ENVIRONMENTS[env] / f"requirements-{variant}.lock"


def envs_dir() -> Path:
    """Where environments live; tests point temporary copies of the repo at the same folder."""
    return Path(os.environ.get("ROSETTA_ENVS_DIR", REPO_ROOT / ".envs")).resolve()


def find_links() -> str | None:
    """A local wheel folder configured for pip (uv does not read pip's config), if any."""
    for var in ("ROSETTA_FIND_LINKS", "UV_FIND_LINKS", "PIP_FIND_LINKS"):
        if os.environ.get(var):
            return os.environ[var]
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True,
        text=True,
        check=False,
    )
    value = out.stdout.strip()
    return value.split()[0] if out.returncode == 0 and value else None


def _choice(var: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(var, allowed[0])
    if value not in allowed:
        raise SystemExit(f"error: {var}={value!r} is not allowed; choose one of {', '.join(allowed)}")
    return value


def lock_digest(env: str, variant: str) -> str:
    lock = lock_path(env, variant)
    if not lock.is_file():
        raise SystemExit(
            f"error: lock file {lock.relative_to(REPO_ROOT)} is missing; run python -m pipelines.lock {env}"
        )
    digest = hashlib.sha256(lock.read_bytes())
    digest.update(f"python{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()


@contextmanager
def _exclusive(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
        subprocess.run([*uv, "venv", "--quiet", "--python", sys.executable, str(target)], check=True)
        install = [*uv, "pip", "sync", "--require-hashes", "--python", str(target / "bin" / "python"), str(lock)]
        links = find_links()
        if links:
            install += ["--find-links", links]
        subprocess.run(install, check=True)
        marker.write_text(digest + "\n")  # written last: a half-built environment is never reused
    return target


def stage_environment(env: str, env_dir: Path) -> dict[str, str]:
    """Process environment for a command in `env`: its interpreter first on PATH, our sources on PYTHONPATH."""
    paths = [REPO_ROOT / "packages/common/src"]
    if env in FRAMEWORKS:
        paths.append(REPO_ROOT / ENVIRONMENTS[env] / "src")
    paths.append(REPO_ROOT)
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    return {
        **base,
        "VIRTUAL_ENV": str(env_dir),
        "PATH": f"{env_dir / 'bin'}{os.pathsep}{base.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(str(p) for p in paths),
        "PYTHONHASHSEED": "0",
        "ROSETTA_ENV": env,
        # Quiet, deterministic framework start-up; each package switches on its own determinism API too.
        "TF_CPP_MIN_LOG_LEVEL": base.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        "TF_DETERMINISTIC_OPS": "1",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }


def run(env: str, command: list[str]) -> int:
    """Run `command` inside `env`; a leading `python` means that environment's interpreter."""
    if not command:
        raise SystemExit("error: no command given after --")
    runtime = _choice("ROSETTA_RUNTIME", RUNTIMES)
    variant = _choice("ROSETTA_VARIANT", VARIANTS)
    if runtime == "container":
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
