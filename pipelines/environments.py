"""The isolated environments, read once from pyproject.toml's [tool.rosetta.environments]: which member folder
each is built from, where its locks are, what a stage sees inside it, and the one lock hash everything keys on.

Every other module (the runner, the lock writer, the container runtime and image builder, the report, the bench
stage) takes these facts from here. It imports only the standard library, so any environment can import it,
and nothing in pipelines/ below it: no module imports the runner for a constant.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("cpu", "cuda")
# Every lock is resolved for this interpreter and platform (tooling/build/env_locks.py); images install for
# them too.
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"


@dataclass(frozen=True)
class Environment:
    name: str
    package: str  # member folder, relative to the repository root
    framework: bool  # a framework package: its src/ goes on a stage's PYTHONPATH
    title: str
    distributions: tuple[str, ...]  # what names its framework, most telling first

    def lock(self, variant: str, root: Path = REPO_ROOT) -> Path:
        return root / self.package / f"requirements-{variant}.lock"


def read(root: Path = REPO_ROOT) -> dict[str, Environment]:
    """[tool.rosetta.environments] of `root`'s pyproject.toml, in file order."""
    with open(root / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["rosetta"]["environments"]
    return {
        name: Environment(
            name=name,
            package=spec["package"],
            framework=bool(spec.get("framework", False)),
            title=spec.get("title", name),
            distributions=tuple(spec.get("distributions", ())),
        )
        for name, spec in table.items()
    }


ENVIRONMENTS: dict[str, Environment] = read()
FRAMEWORKS: tuple[str, ...] = tuple(name for name, env in ENVIRONMENTS.items() if env.framework)


def lock_path(env: str, variant: str) -> Path:
    return ENVIRONMENTS[env].lock(variant)


def lock_sha256(lock: Path, salt: bytes = b"") -> str:
    """The one lock hash: the image label, the report's manifest and (salted with the interpreter) the key of a
    local environment all use it, so a lock edit is seen the same way everywhere."""
    digest = hashlib.sha256(lock.read_bytes())
    digest.update(salt)
    return digest.hexdigest()


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


# Where the torch CPU lock's `torch==...+cpu` comes from when no find-links is configured: PyTorch's own CPU index
# (PyPI's Linux torch is the CUDA build). ROSETTA_TORCH_INDEX names another (a mirror; the tests' loopback index).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_cpu_index() -> str:
    """TORCH_CPU_INDEX, or ROSETTA_TORCH_INDEX where it is set: the runner and the image builder both ask it."""
    return os.environ.get("ROSETTA_TORCH_INDEX") or TORCH_CPU_INDEX


# torch, TF and ONNX Runtime compute with this many CPU threads, whatever the machine has: reductions split across
# threads round differently (torch on 1 and 2 threads differed by 2.4e-7 in the loss), so bits and parity must not
# depend on the core count. 2 is the reference machine's; ROSETTA_THREADS changes it (and, with it, the last bits).
# XLA's pool, JAX's, has one thread per CPU the process may run on (xla_flags).
DEFAULT_THREADS = 2


def thread_environment(base: dict[str, str]) -> dict[str, str]:
    """The variables that pin every runtime's CPU thread pools (OpenMP for torch, TF's two pools; ONNX Runtime
    sessions read ROSETTA_THREADS themselves) and XLA's flags (xla_flags: XLA sizes its pool by the CPUs)."""
    value = base.get("ROSETTA_THREADS", str(DEFAULT_THREADS))
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"error: ROSETTA_THREADS={value!r}: must be a whole number of threads, 1 or more")
    # MKL (torch's BLAS) by Intel's own rules for reproducible results ("conditional numerical reproducibility"):
    # MKL_DYNAMIC off, so that a call always runs on the threads asked for, and one code path whatever the memory
    # alignment; the code path is the floor's (ISA_PINS). It costs nothing measurable (torch epochs of mlp, cnn
    # and attention side by side: within noise). The one run-to-run difference found in torch came from elsewhere:
    # see rosetta_torch.make_optimizer.
    # TF's oneDNN kernels off: on an AVX-512 EPYC with 2 threads (capped at AVX2 or not), TF's resnet trained
    # differently from one process to the next (6 processes: two distinct runs, step losses 6e-6 apart),
    # enable_op_determinism notwithstanding; with oneDNN off (TF's Eigen kernels) every process gave the same bits.
    return {"ROSETTA_THREADS": value, "OMP_NUM_THREADS": value, "MKL_NUM_THREADS": value, "MKL_DYNAMIC": "FALSE",
            "TF_NUM_INTRAOP_THREADS": value, "TF_NUM_INTEROP_THREADS": value, "TF_ENABLE_ONEDNN_OPTS": "0",
            "XLA_FLAGS": xla_flags(base.get("XLA_FLAGS", "")), **ISA_PINS}


def xla_flags(caller: str) -> str:
    """The caller's XLA flags, then Eigen's thread pool on and XLA's instruction-set cap (whatever the caller's
    flags say, as every pin below: a cap set elsewhere must not move bytes).

    XLA reads XLA_FLAGS up to the first word that is not a `--flag` and silently ignores the rest: the
    `intra_op_parallelism_threads=N` often quoted for JAX is such a word (no XLA flag of that name exists), and
    a cap after it is never read. Such words are dropped. XLA has no thread-count flag: its pool has one thread per
    CPU the process may run on (its affinity), so ROSETTA_THREADS reaches TF's pools, not JAX's."""
    words = [w for w in caller.split() if w.startswith("--") and not w.startswith(("--xla_cpu_max_isa",
                                                                                 "--xla_cpu_multi_thread_eigen"))]
    return " ".join([*words, "--xla_cpu_multi_thread_eigen=true", f"--xla_cpu_max_isa={ISA_FLOOR}"])


# Every runtime that picks its kernels by the CPU's instruction sets is held to the floor of the machines this project
# targets, so that the same code, params, locks and data give the same bytes on any x86-64 CPU with AVX2 (an AVX-512
# CPU otherwise runs other kernels: other last bits, and training that parts elsewhere). benchmarks/isa_pins.py
# measures, per runtime, that the switch is read (a cap below the floor changes that framework's bytes) and what the
# cap costs. XLA's cap is in XLA_FLAGS (xla_flags). ONNX Runtime's MLAS has no such switch: docs/lineage.md
# says which outputs depend on it.
ISA_FLOOR = "AVX2"
ISA_PINS = {
    "ONEDNN_MAX_CPU_ISA": ISA_FLOOR,  # oneDNN: torch's convolutions, TF's convolutions and matmuls, XLA's calls to it
    "MKL_CBWR": f"{ISA_FLOOR},STRICT",  # MKL (torch's BLAS): the floor's code path, by Intel's reproducibility rules
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's OpenBLAS (the validator's float64 reference): the AVX2 kernels
}
# A cap above what a CPU has changes nothing there; the one pin that would not run below the floor is OpenBLAS's
# (Haswell kernels need AVX2), so a CPU without AVX2 keeps its own choice (and its own last bits).
if Path("/proc/cpuinfo").is_file() and " avx2" not in Path("/proc/cpuinfo").read_text():
    del ISA_PINS["OPENBLAS_CORETYPE"]


def installed_versions(names: list[str]) -> dict[str, str]:
    """The installed version of each distribution that is installed (what ran, beside what the locks pin)."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def stage_environment(env: str, env_dir: Path, threads: int | None = None) -> dict[str, str]:
    """Process environment for a command in `env`: its interpreter first on PATH, our sources on PYTHONPATH;
    with `threads`, every thread pool of that size instead of the caller's ROSETTA_THREADS (a model server runs
    with the count its export recorded).

    Both runtimes use it (the local runner as is, the container runtime with the image's venv), so a stage sees
    the same variables wherever it runs."""
    paths = [REPO_ROOT / "packages/common/src"]
    if ENVIRONMENTS[env].framework:
        paths.append(REPO_ROOT / ENVIRONMENTS[env].package / "src")
    paths.append(REPO_ROOT)
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    if threads is not None:
        base = {**base, "ROSETTA_THREADS": str(threads)}
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
        **thread_environment(base),
    }
