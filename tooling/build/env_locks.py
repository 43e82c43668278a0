"""Write every environment's lock files: one CPU and one CUDA lock per environment, exact and hash-pinned.

    python -m tooling.build.env_locks                 # all environments, both variants
    python -m tooling.build.env_locks torch --variant cpu

Each environment is resolved on its own (its package's pyproject plus common's), never together with
another framework: that is what keeps the three dependency sets from colliding.

A CUDA lock is resolved under its CPU lock's pins as constraints (local labels such as `+cpu` dropped): what both
variants install (numpy, protobuf, onnx, onnxruntime, keras, ...) is then the same version in both, and only what
the variant changes differs (the framework's CUDA build, its nvidia-* wheels, onnxruntime-gpu). Resolve the CPU
lock first (the default order); the CUDA one never changes it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pipelines.environments import (
    ENVIRONMENTS,
    PLATFORM,
    PYTHON_VERSION,
    REPO_ROOT,
    VARIANTS,
    find_links,
    lock_path,
    torch_cpu_index,
)

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\+]+)", re.MULTILINE)


def cpu_constraints(env: str) -> str:
    """The CPU lock's pins as constraints for the CUDA lock: `name==version`, without a local label (`+cpu`)."""
    return "".join(f"{name}=={version}\n" for name, version in PIN.findall(lock_path(env, "cpu").read_text()))


def compile_lock(env: str, variant: str) -> Path:
    """Resolve one environment with uv and write its lock; returns the lock's path."""
    package = ENVIRONMENTS[env].package
    out = lock_path(env, variant)
    cmd = [
        sys.executable,
        "-m",
        "uv",
        "pip",
        "compile",
        str(REPO_ROOT / package / "pyproject.toml"),
        str(REPO_ROOT / "packages/common/pyproject.toml"),
        "--extra",
        variant,
        "--generate-hashes",
        "--python-version",
        PYTHON_VERSION,
        "--python-platform",
        PLATFORM,
        "--no-header",
        "--no-annotate",
        "--quiet",
        "-o",
        str(out),
    ]
    links = find_links()
    if variant == "cpu" and links:
        # The CPU build of torch ("+cpu") lives on PyTorch's CPU index or a local wheel folder.
        cmd += ["--find-links", links]
    if env == "torch" and variant == "cpu" and not links:
        cmd += ["--extra-index-url", torch_cpu_index(), "--index-strategy", "unsafe-best-match"]
    with tempfile.NamedTemporaryFile("w", prefix=f"rosetta-{env}-cpu-pins-", suffix=".txt") as constraints:
        if variant == "cuda":
            constraints.write(cpu_constraints(env))
            constraints.flush()
            cmd += ["--constraint", constraints.name]
        subprocess.run(cmd, check=True, cwd=REPO_ROOT, env={**os.environ, "UV_NO_CONFIG": "1"})
    # uv writes the find-links location it used into the lock; keep locks free of machine paths.
    text = "\n".join(line for line in out.read_text().splitlines() if not line.startswith("--find-links"))
    out.write_text(text.rstrip() + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("envs", nargs="*", choices=[*ENVIRONMENTS, []], metavar="ENV")
    parser.add_argument("--variant", choices=VARIANTS, action="append")
    args = parser.parse_args(argv)
    for env in args.envs or list(ENVIRONMENTS):
        for variant in args.variant or VARIANTS:
            print(f"lock {env} ({variant}) -> {compile_lock(env, variant).relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
