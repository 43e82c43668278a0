"""The jax environment's TPU lock: packages/jax_impl/requirements-tpu.lock, exact and hash-pinned.

    python -m tooling.devices.tpu_lock

As tooling/build/env_locks.py resolves the CUDA lock: the jax package's pyproject and common's, with `jax[tpu]` (jaxlib
and libtpu) in place of the CPU extra's jax, under the CPU lock's pins as constraints, so that everything both
install is the same version and only JAX's TPU runtime differs. For a TPU VM with network:

    python3.11 -m venv .envs/jax-tpu
    .envs/jax-tpu/bin/pip install --no-deps --require-hashes -r packages/jax_impl/requirements-tpu.lock

A TPU host without network uses its own JAX where its versions equal this lock's and carries the rest as wheels
(docs/tpu.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pipelines.environments import PYTHON_VERSION, REPO_ROOT
from tooling.build.env_locks import cpu_constraints

LOCK = Path("packages/jax_impl/requirements-tpu.lock")
TPU_REQUIREMENTS = ("jax[tpu]==0.10.2", "onnxruntime==1.32.0")  # the CPU extra's versions, JAX's TPU build
# libtpu 0.0.42.1 (jax[tpu] 0.10.2's) is built for glibc 2.31 and newer: the CPU locks' manylinux_2_28 has no wheel.
PLATFORM = "x86_64-manylinux_2_31"


def compile_lock(out: Path = LOCK) -> Path:
    """Resolve the TPU lock with uv and write it; returns its path."""
    with tempfile.TemporaryDirectory(prefix="rosetta-jax-tpu-") as scratch:
        requirements = Path(scratch, "tpu.txt")
        requirements.write_text("".join(f"{r}\n" for r in TPU_REQUIREMENTS))
        constraints = Path(scratch, "pins.txt")
        constraints.write_text(cpu_constraints("jax"))
        target = REPO_ROOT / out
        subprocess.run([sys.executable, "-m", "uv", "pip", "compile",
                        str(REPO_ROOT / "packages/jax_impl/pyproject.toml"),
                        str(REPO_ROOT / "packages/common/pyproject.toml"), str(requirements), "--constraint",
                        str(constraints), "--generate-hashes", "--python-version", PYTHON_VERSION,
                        "--python-platform", PLATFORM, "--no-header", "--no-annotate", "--quiet", "-o", str(target)],
                       check=True, cwd=REPO_ROOT, env={**os.environ, "UV_NO_CONFIG": "1"})
    return target


def main() -> int:
    print(f"lock jax (tpu) -> {compile_lock()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
