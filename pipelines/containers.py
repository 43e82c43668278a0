"""The container runtime: the same stages, each environment in its own image `rosetta-<env>:<variant>`.

    ROSETTA_RUNTIME=container dvc repro     # every runner call becomes a `docker run` (or podman)

Images hold only their environment's lock; the checkout is mounted at its own path and put on PYTHONPATH, so a
stage runs the code it was started from, as with the local runtime. The command line is built by pure functions
(`container_environment`, `run_command`) so tests can check it without an engine. Making the images (engine
start-up, base image, wheelhouses, builds) is tooling/build/images.py; this module only runs them.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines.environments import REPO_ROOT, lock_path, lock_sha256, stage_environment

ENGINES = ("docker", "podman")
VENV = Path("/opt/venv")  # where the recipe puts the environment
BUILD_HINT = "python -m tooling.build.images build --variant {variant} {env}"
# Host variables a stage may be tuned with (determinism, threads, device choice, log levels) pass through;
# everything else on the host (PATH, its virtualenv, HOME, credentials) stays out of the container.
PASS_PREFIXES = ("ROSETTA_", "TF_", "XLA_", "JAX_", "CUBLAS_", "CUDNN_", "KERAS_", "TORCH_", "OMP_", "MKL_", "NVIDIA_")
# torchrun's variables name a data-parallel worker (pipelines/workers.py); TF_CONFIG and JAX_* pass by prefix.
PASS_NAMES = frozenset({"PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK",
                        "WORLD_SIZE"})
HOST_ONLY = frozenset(
    {
        "ROSETTA_RUNTIME",  # inside, a stage runs directly; a nested runner must not start containers again
        "ROSETTA_ENVS_DIR",
        "ROSETTA_FIND_LINKS",
        "ROSETTA_CONTAINER_ENGINE",
        "ROSETTA_CONTAINER_ARGS",
        "ROSETTA_CONTAINER_TESTS",
        "ROSETTA_GPUS",
    }
)
# Where podman (and Docker with CDI) find the NVIDIA container toolkit's device spec (nvidia-ctk cdi generate).
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


def log(message: str) -> None:
    print(f"[rosetta] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Engine:
    name: str  # docker | podman
    rootless: bool = False


# ---------------------------------------------------------------- pure: what a container run looks like


def image_name(env: str, variant: str) -> str:
    return f"rosetta-{env}:{variant}"


def build_hint(env: str, variant: str) -> str:
    return BUILD_HINT.format(variant=variant, env=env) + (" (or: make images)" if variant == "cpu" else
                                                          " (or: make images-cuda)")


def _passes(name: str) -> bool:
    return name not in HOST_ONLY and (name in PASS_NAMES or name.startswith(PASS_PREFIXES))


def container_environment(env: str, variant: str, host_env: Mapping[str, str], threads: int | None = None
                          ) -> dict[str, str]:
    """The variables a stage sees inside its container.

    The stage variables (PYTHONPATH with the mounted checkout, the determinism switches, `threads` where given)
    come from `environments.stage_environment`, as for the local runtime; the image supplies PATH and the venv.
    """
    staged = stage_environment(env, VENV, threads)
    env_vars = {k: v for k, v in host_env.items() if _passes(k)}
    # What stage_environment sets or changes, not what it merely inherited from os.environ.
    env_vars.update({k: v for k, v in staged.items() if os.environ.get(k) != v or k in ("PYTHONPATH", "ROSETTA_ENV")})
    for name in ("PATH", "VIRTUAL_ENV", "HOME"):
        env_vars.pop(name, None)
    # Any uid may run the image: give it a writable HOME (caches of TF, JAX, matplotlib) and a user name
    # (getpass.getuser() fails for a uid without a passwd entry).
    env_vars.update(HOME="/tmp", USER="rosetta", ROSETTA_VARIANT=variant)
    if variant == "cuda":
        # fp32 parity: NVIDIA's libraries (cuBLAS, cuDNN) then never use TF32, whatever a framework asks for.
        # The frameworks' own switches (and ONNX Runtime's use_tf32=0) are still needed: see containers/README.md.
        env_vars.setdefault("NVIDIA_TF32_OVERRIDE", "0")
    return env_vars


def _mountable(path: Path) -> str:
    text = str(path)
    if any(c in text for c in ":,\n"):
        raise SystemExit(f"error: cannot mount {text!r} into a container: its path holds ':' or ','; move the checkout")
    return text


def run_command(
    engine: Engine,
    image: str,
    command: Sequence[str],
    *,
    env_vars: Mapping[str, str],
    repo: Path,
    cwd: Path,
    uid: int,
    gid: int,
    variant: str,
    extra_args: Sequence[str] = (),
    network: str = "none",
    gpus: bool | None = None,
    detach: bool = False,
) -> list[str]:
    """The `docker run` / `podman run` line for one stage command. Stages need no network (`none`); the workers
    of a data-parallel run share one made for that run (pipelines/workers.py), the model servers of the serve stage
    another (pipelines/serving_containers.py). Never pull.

    detach: start it in the background (`--detach`) and keep it when it exits, so that its exit code and its log can
    still be read (a served model server: the caller removes it); otherwise `--rm`, the run in the foreground.

    gpus: give the container every GPU (`--gpus all`, podman: the CDI device). None: for the CUDA variant, when this
    host can (gpu_access: a GPU and the engine's NVIDIA support); otherwise a CUDA image runs without them and its
    frameworks fall back to the CPU, which gpu_access says in one line."""
    if gpus is None:
        gpus = variant == "cuda" and gpu_access(engine)
    argv = [engine.name, "run", "--detach" if detach else "--rm", "--pull=never", f"--network={network}"]
    if engine.name == "podman" and engine.rootless:
        argv.append("--userns=keep-id")  # our uid inside is our uid outside, so the --user below owns its files
    if not (engine.name == "docker" and engine.rootless):
        # Rootless Docker maps the container's root to the invoking user; elsewhere run as the invoking user.
        argv += ["--user", f"{uid}:{gid}"]
    # The checkout at its own path: PYTHONPATH, DVC's paths and error messages read the same inside and out.
    mounts = [repo] if cwd == repo or repo in cwd.parents else [repo, cwd]
    for path in mounts:
        argv += ["--volume", f"{_mountable(path)}:{_mountable(path)}"]
    argv += ["--workdir", str(cwd)]
    if gpus:
        argv += ["--gpus", "all"] if engine.name == "docker" else ["--device", "nvidia.com/gpu=all"]
    for key in sorted(env_vars):
        argv += ["--env", f"{key}={env_vars[key]}"]
    return [*argv, *extra_args, image, *command]


# ---------------------------------------------------------------- the engine and the image


def visible_gpus() -> list[str]:
    """The GPUs this host's NVIDIA driver lists (`nvidia-smi -L`); [] without a driver, nvidia-smi or a GPU."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


def nvidia_container_support(engine: Engine) -> str:
    """Why `engine` cannot hand GPUs to a container, or "" when it can: Docker's `--gpus` needs the NVIDIA container
    toolkit (its runtime, or the hook `--gpus` calls); podman's CDI device needs the toolkit's CDI spec."""
    if engine.name == "docker":
        if shutil.which("nvidia-container-runtime-hook") or shutil.which("nvidia-container-runtime"):
            return ""
        out = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True,
                             check=False)
        if '"nvidia"' in out.stdout:
            return ""
        return "Docker has no NVIDIA container runtime (install the NVIDIA Container Toolkit)"
    specs = [p for d in CDI_DIRS if d.is_dir() for p in sorted(d.iterdir()) if p.suffix in (".yaml", ".yml", ".json")]
    if any("nvidia.com/gpu" in p.read_text(errors="replace") for p in specs):
        return ""
    return "podman finds no NVIDIA CDI spec (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)"


def gpu_problem(engine: Engine) -> str:
    """Why containers of `engine` get no GPU on this host, or "" when they can (a GPU, and the engine's support)."""
    gpus = visible_gpus()
    if not gpus:
        return "no NVIDIA GPU visible on this host (nvidia-smi lists none)"
    return nvidia_container_support(engine)


@functools.cache
def gpu_access(engine: Engine) -> bool:
    """Whether CUDA containers get `--gpus all` on this host. ROSETTA_GPUS=1 or 0 decides instead of looking. Without
    GPUs it says so, once per process: the CUDA build still runs, on the CPU."""
    forced = os.environ.get("ROSETTA_GPUS", "")
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise SystemExit(f"error: ROSETTA_GPUS={forced!r} is not allowed; choose 1 (pass GPUs), 0 (none) or unset")
    problem = gpu_problem(engine)
    if problem:
        log(f"{problem}: CUDA images run without --gpus, and their frameworks fall back to the CPU")
    return not problem


def probe(name: str) -> tuple[bool, bool, str]:
    """(answers, rootless, why not) for an installed engine."""
    fmt = "{{json .SecurityOptions}}" if name == "docker" else "{{.Host.Security.Rootless}}"
    try:
        out = subprocess.run([name, "info", "--format", fmt], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, False, str(exc)
    if out.returncode != 0:
        lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
        return False, False, lines[-1] if lines else f"exit {out.returncode}"
    return True, "rootless" in out.stdout or out.stdout.strip() == "true", ""


def select_engine(host_env: Mapping[str, str] | None = None) -> Engine:
    """The engine that answers: ROSETTA_CONTAINER_ENGINE if set, else docker, else podman. One-line error if none."""
    host_env = os.environ if host_env is None else host_env
    wanted = host_env.get("ROSETTA_CONTAINER_ENGINE", "")
    if wanted and wanted not in ENGINES:
        raise SystemExit(
            f"error: ROSETTA_CONTAINER_ENGINE={wanted!r} is not allowed; choose one of {', '.join(ENGINES)}"
        )
    names = [wanted] if wanted else [name for name in ENGINES if shutil.which(name)]
    if not names:
        raise SystemExit(
            "error: no container engine found (docker or podman): install one, or run with ROSETTA_RUNTIME=local"
        )
    problems = []
    for name in names:
        if not shutil.which(name):
            problems.append(f"{name} is not installed")
            continue
        answers, rootless, why = probe(name)
        if answers:
            return Engine(name, rootless)
        problems.append(f"{name} does not answer ({why})")
    raise SystemExit(
        f"error: {'; '.join(problems)}: install or start one (python -m tooling.build.images engine starts dockerd"
        " where it can), or run with ROSETTA_RUNTIME=local"
    )


def image_labels(engine: Engine, image: str) -> dict[str, str] | None:
    out = subprocess.run(
        [engine.name, "image", "inspect", "--format", "{{json .Config.Labels}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    return (json.loads(out.stdout.strip() or "null") or {}) if out.returncode == 0 else None


def check_image(engine: Engine, env: str, variant: str) -> str:
    """The image's name, or a one-line error naming the command that builds it (missing, or built from another lock)."""
    image = image_name(env, variant)
    labels = image_labels(engine, image)
    if labels is None:
        raise SystemExit(f"error: image {image} is missing ({engine.name}); build it with: {build_hint(env, variant)}")
    lock = lock_path(env, variant)
    if labels.get("rosetta.lock.sha256") != lock_sha256(lock):
        raise SystemExit(
            f"error: image {image} was not built from the current {lock.relative_to(REPO_ROOT)};"
            f" rebuild it with: {build_hint(env, variant)}"
        )
    return image


def run(env: str, variant: str, command: list[str]) -> int:
    """Run `command` in env's image, as the invoking user, with the checkout mounted; returns its exit code."""
    engine = select_engine()
    image = check_image(engine, env, variant)
    argv = run_command(
        engine,
        image,
        command,
        env_vars=container_environment(env, variant, os.environ),
        repo=REPO_ROOT,
        cwd=Path.cwd().resolve(),
        uid=os.getuid(),
        gid=os.getgid(),
        variant=variant,
        extra_args=shlex.split(os.environ.get("ROSETTA_CONTAINER_ARGS", "")),  # e.g. --security-opt label=disable
    )
    return subprocess.run(argv, check=False).returncode
