"""The jax2tf environment: TensorFlow and JAX in one interpreter, from one hash-pinned lock.

    python -m tooling.build.jax2tf.env lock     # tooling/build/jax2tf/requirements-cpu.lock (resolves: network)
    python -m tooling.build.jax2tf.env build    # .envs/jax2tf-cpu from that lock (once; rebuilt when it changes)
    python -m tooling.build.jax2tf.env run -- python -m tooling.build.jax2tf.export ...

The lock is the union of the tf and jax CPU locks: it is resolved from both packages' pyprojects (and common's)
under both locks' pins as constraints, so every distribution the two environments share is the version both
already pin (numpy, ml-dtypes, protobuf, onnx, kserve, ...), and nothing had to give: the two locks agree on all
of them. tests/pipeline/test_jax2tf.py checks the lock stays that union. Built and run as pipelines/runner.py builds and
runs the others (uv venv + uv pip sync --require-hashes; the stage's variables: thread and instruction-set pins,
common's and rosetta_jax's sources and the repository root on PYTHONPATH), but not one of [tool.rosetta.environments]:
no stage, image or make target needs it, only this route and its test.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipelines.environments import (
    PLATFORM,
    PYTHON_VERSION,
    REPO_ROOT,
    envs_dir,
    lock_path,
    lock_sha256,
    stage_environment,
)

NAME = "jax2tf-cpu"
LOCK = Path(__file__).with_name("requirements-cpu.lock")
SOURCES = ("tf", "jax")  # the environments whose CPU locks this one is the union of
PYPROJECTS = ("packages/tf_impl/pyproject.toml", "packages/jax_impl/pyproject.toml", "packages/common/pyproject.toml")
# One distribution of a lock: its pin and hashes, the lines from `name==version` to the next distribution.
ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)(.*?)(?=^\S|\Z)", re.MULTILINE | re.DOTALL)
HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def entries(lock: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """Normalized name -> (version, hashes) of every distribution a lock pins."""
    return {re.sub(r"[-_.]+", "-", name).lower(): (version, frozenset(HASH.findall(rest)))
            for name, version, rest in ENTRY.findall(lock.read_text())}


def compile_lock() -> Path:
    """Resolve the union with uv (as tooling/build/env_locks.py resolves each environment) and write LOCK."""
    pins = "".join(f"{name}=={version}\n" for env in SOURCES
                   for name, (version, _) in entries(lock_path(env, "cpu")).items())
    with tempfile.NamedTemporaryFile("w", prefix="rosetta-jax2tf-pins-", suffix=".txt") as constraints:
        constraints.write(pins)
        constraints.flush()
        cmd = [sys.executable, "-m", "uv", "pip", "compile", *(str(REPO_ROOT / p) for p in PYPROJECTS),
               "--extra", "cpu", "--constraint", constraints.name, "--generate-hashes",
               "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
               "--no-header", "--no-annotate", "--quiet", "-o", str(LOCK)]
        subprocess.run(cmd, check=True, cwd=REPO_ROOT, env={**os.environ, "UV_NO_CONFIG": "1"})
    return LOCK


def env_dir() -> Path:
    return envs_dir() / NAME


def digest() -> str:
    """The key of a built environment: its lock and the interpreter it was built with (as the runner's)."""
    return lock_sha256(LOCK, f"python{sys.version_info.major}.{sys.version_info.minor}".encode())


def ensure_env() -> Path:
    """The environment's folder, built from LOCK if missing or stale; nothing half-built is left or reused."""
    target, marker = env_dir(), env_dir() / "rosetta-lock.sha256"
    if marker.is_file() and marker.read_text().strip() == digest():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(envs_dir() / f".{NAME}.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text().strip() == digest():
            return target  # another process built it while we waited
        print(f"[rosetta] building environment {NAME} from {LOCK.relative_to(REPO_ROOT)}", file=sys.stderr)
        shutil.rmtree(target, ignore_errors=True)
        uv = [sys.executable, "-m", "uv"]
        # --python everywhere: `python -m uv` otherwise installs into the interpreter that runs uv.
        for step in ([*uv, "venv", "--quiet", "--python", sys.executable, str(target)],
                     [*uv, "pip", "sync", "--require-hashes", "--python", str(target / "bin" / "python"), str(LOCK)]):
            code = subprocess.run(step, check=False).returncode
            if code != 0:
                shutil.rmtree(target, ignore_errors=True)
                raise SystemExit(f"error: {LOCK.relative_to(REPO_ROOT)}: building environment {NAME} failed (uv "
                                 f"{step[3]} exited {code}; its reason is above); nothing was left half-built")
        marker.write_text(digest() + "\n")
    return target


def environment(target: Path) -> dict[str, str]:
    """A jax stage's variables (rosetta_jax and common importable, the runner's pins), in this environment."""
    return {**stage_environment("jax", target), "ROSETTA_ENV": "jax2tf"}


def run(command: list[str]) -> int:
    target = ensure_env()
    if command and command[0] in ("python", "python3"):
        command = [str(target / "bin" / "python"), *command[1:]]
    return subprocess.run(command, env=environment(target), check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["lock", "build", "run"])
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="run: -- the command")
    args = parser.parse_args(argv)
    if args.command == "lock":
        print(f"lock -> {compile_lock().relative_to(REPO_ROOT)}")
    elif args.command == "build":
        print(ensure_env())
    else:
        command = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        if not command:
            parser.error("run: no command given after --")
        return run(command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
