"""The container runtime: the same stages, each environment in its own image `rosetta-<env>:<variant>`.

    ROSETTA_RUNTIME=container dvc repro                  # every runner call becomes a `docker run` (or podman)
    python -m pipelines.containers build --variant cpu   # build the four CPU images here, no registry needed
    python -m pipelines.containers engine                # make sure a container engine answers (starts dockerd here)

Images hold only their environment's lock; the checkout is mounted at its own path and put on PYTHONPATH, so a
stage runs the code it was started from, as with the local runtime. The command line is built by pure functions
(`container_environment`, `run_command`, `build_command`) so tests can check it without an engine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines import runner
from pipelines.lock import PYTHON_VERSION

REPO_ROOT = runner.REPO_ROOT
RECIPES = REPO_ROOT / "containers"
WHEELHOUSE = RECIPES / "wheelhouse"  # git-ignored; one build context per image: requirements.lock + wheels/
ENGINES = ("docker", "podman")
VENV = Path("/opt/venv")  # where every recipe puts its environment
CPU_BASE = "rosetta-base:bookworm"  # made here by debootstrap: Debian bookworm's python3 is the locks' 3.11
BUILD_HINT = "python -m pipelines.containers build --variant {variant} {env}"
# The package whose version labels each image.
FRAMEWORK_PACKAGES = {
    "torch": ("torch",),
    "tf": ("tensorflow", "tensorflow-cpu"),
    "jax": ("jax",),
    "validation": ("onnxruntime-gpu", "onnxruntime"),
}
# Host variables a stage may be tuned with (determinism, threads, device choice, log levels) pass through;
# everything else on the host (PATH, its virtualenv, HOME, credentials) stays out of the container.
PASS_PREFIXES = ("ROSETTA_", "TF_", "XLA_", "JAX_", "CUBLAS_", "CUDNN_", "KERAS_", "TORCH_", "OMP_", "MKL_", "NVIDIA_")
PASS_NAMES = frozenset({"PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES"})
HOST_ONLY = frozenset(
    {
        "ROSETTA_RUNTIME",  # inside, a stage runs directly; a nested runner must not start containers again
        "ROSETTA_ENVS_DIR",
        "ROSETTA_FIND_LINKS",
        "ROSETTA_CONTAINER_ENGINE",
        "ROSETTA_CONTAINER_ARGS",
        "ROSETTA_CONTAINER_TESTS",
    }
)
# pip must pick the same files uv locked for Python 3.11 on manylinux_2_28; pip does not widen a manylinux_2_x
# platform to older ones by itself, so name them all (manylinux2014 widens to 2010 and 1).
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)), "manylinux2014_x86_64")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def log(message: str) -> None:
    print(f"[rosetta] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Engine:
    name: str  # docker | podman
    rootless: bool = False


# ---------------------------------------------------------------- pure: what a container run looks like


def image_name(env: str, variant: str) -> str:
    return f"rosetta-{env}:{variant}"


def recipe(env: str) -> Path:
    return RECIPES / f"{env}.Dockerfile"


def build_hint(env: str, variant: str) -> str:
    return BUILD_HINT.format(variant=variant, env=env) + (" (or: make images)" if variant == "cpu" else "")


def _passes(name: str) -> bool:
    return name not in HOST_ONLY and (name in PASS_NAMES or name.startswith(PASS_PREFIXES))


def container_environment(env: str, variant: str, host_env: Mapping[str, str]) -> dict[str, str]:
    """The variables a stage sees inside its container.

    The runner's own stage variables (PYTHONPATH with the mounted checkout, the determinism switches) come from
    `runner.stage_environment`, so both runtimes share one definition; the image supplies PATH and the venv.
    """
    staged = runner.stage_environment(env, VENV)
    env_vars = {k: v for k, v in host_env.items() if _passes(k)}
    # What the runner sets or changes, not what it merely inherited from os.environ.
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
) -> list[str]:
    """The `docker run` / `podman run` line for one stage command."""
    argv = [engine.name, "run", "--rm", "--pull=never", "--network=none"]  # stages need no network; never pull
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
    if variant == "cuda":
        argv += ["--gpus", "all"] if engine.name == "docker" else ["--device", "nvidia.com/gpu=all"]
    for key in sorted(env_vars):
        argv += ["--env", f"{key}={env_vars[key]}"]
    return [*argv, *extra_args, image, *command]


def build_command(engine: Engine, env: str, variant: str, context: Path, build_args: Mapping[str, str]) -> list[str]:
    argv = [engine.name, "build", "--file", str(recipe(env)), "--tag", image_name(env, variant)]
    for key in sorted(build_args):
        argv += ["--build-arg", f"{key}={build_args[key]}"]
    return [*argv, str(context)]


# ---------------------------------------------------------------- the engine


def _probe(name: str) -> tuple[bool, bool, str]:
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
        answers, rootless, why = _probe(name)
        if answers:
            return Engine(name, rootless)
        problems.append(f"{name} does not answer ({why})")
    raise SystemExit(
        f"error: {'; '.join(problems)}: install or start one (python -m pipelines.containers engine starts dockerd"
        " where it can), or run with ROSETTA_RUNTIME=local"
    )


def _start_dockerd() -> bool:
    if not shutil.which("dockerd") or os.geteuid() != 0:
        return False
    logfile = Path(tempfile.gettempdir()) / "rosetta-dockerd.log"
    # No --storage-driver: dockerd takes overlay2 where the kernel and filesystem allow it and falls back to vfs
    # (e.g. on an overlay root that overlay2 cannot stack on). vfs copies a whole image for every layer and every
    # container (a TF stage then spends ~40 s starting), so it is the last resort, not the default.
    driver = os.environ.get("ROSETTA_DOCKERD_STORAGE_DRIVER")  # e.g. vfs, where overlay2 is picked but fails
    argv = ["dockerd", *([f"--storage-driver={driver}"] if driver else [])]
    log(f"no Docker daemon answers; starting one: {' '.join(argv)} (log: {logfile})")
    with open(logfile, "ab") as out:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this process: later builds and runs use it
        )
    for _ in range(60):
        if _probe("docker")[0]:
            log("dockerd is up")
            return True
        time.sleep(1)
    log(f"dockerd did not come up within 60 s; see {logfile}")
    return False


def ensure_engine() -> Engine:
    """select_engine(), but first start dockerd in the background when none answers and this machine can."""
    try:
        return select_engine()
    except SystemExit:
        wanted = os.environ.get("ROSETTA_CONTAINER_ENGINE", "docker")
        if wanted == "docker" and shutil.which("docker") and _start_dockerd():
            return Engine("docker")
        raise


def image_labels(engine: Engine, image: str) -> dict[str, str] | None:
    out = subprocess.run(
        [engine.name, "image", "inspect", "--format", "{{json .Config.Labels}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    return (json.loads(out.stdout.strip() or "null") or {}) if out.returncode == 0 else None


# ---------------------------------------------------------------- the runtime (pipelines.runner calls this)


def lock_sha256(env: str, variant: str) -> str:
    return hashlib.sha256(runner.lock_path(env, variant).read_bytes()).hexdigest()


def check_image(engine: Engine, env: str, variant: str) -> str:
    """The image's name, or a one-line error naming the command that builds it (missing, or built from another lock)."""
    image = image_name(env, variant)
    labels = image_labels(engine, image)
    if labels is None:
        raise SystemExit(f"error: image {image} is missing ({engine.name}); build it with: {build_hint(env, variant)}")
    lock = runner.lock_path(env, variant)
    if labels.get("rosetta.lock.sha256") != lock_sha256(env, variant):
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


# ---------------------------------------------------------------- building images


def lock_hashes(lock: Path) -> set[str]:
    return set(HASH.findall(lock.read_text()))


def framework_version(env: str, variant: str) -> str:
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", runner.lock_path(env, variant).read_text(), re.MULTILINE))
    return next((f"{name}=={pins[name]}" for name in FRAMEWORK_PACKAGES[env] if name in pins), "unknown")


def revision(env: str, variant: str) -> str:
    """The commit an image's contents come from: the last one touching its recipe or lock ("-dirty" if either is
    edited). Not HEAD: an image holds no other file, and a label that changed with every commit would rebuild it."""
    inputs = [str(recipe(env)), str(runner.lock_path(env, variant))]

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("log", "-1", "--format=%H", "--", *inputs) or git("rev-parse", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--", *inputs) else "")


def wheelhouse(env: str, variant: str) -> Path:
    """A build context holding exactly env's lock and its wheels, downloaded on the host.

    The build then installs with --no-index: no network, proxy or CA certificate inside the build, and no
    credential that could end up in a layer. Wheels are checked against the lock's hashes twice (here by pip
    download, in the image by pip install).
    """
    lock = runner.lock_path(env, variant)
    context = WHEELHOUSE / f"{env}-{variant}"
    wheels = context / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lock, context / "requirements.lock")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--require-hashes"]
    cmd += ["--no-deps", "--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION]
    cmd += ["--abi", f"cp{PYTHON_VERSION.replace('.', '')}"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    links = runner.find_links()
    if links:
        cmd += ["--find-links", links]
    elif env == "torch" and variant == "cpu":
        cmd += ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]  # where the +cpu wheel lives
    log(f"wheelhouse {context.relative_to(REPO_ROOT)} from {lock.relative_to(REPO_ROOT)}")
    subprocess.run([*cmd, "-r", str(lock), "-d", str(wheels)], check=True)
    wanted = lock_hashes(lock)
    for wheel in wheels.iterdir():  # drop what an older lock left behind: the context is exactly this lock
        if hashlib.sha256(wheel.read_bytes()).hexdigest() not in wanted:
            wheel.unlink()
    return context


def make_cpu_base(engine: Engine) -> None:
    """rosetta-base:bookworm from Debian's archive (debootstrap): CPU builds where no image registry is reachable."""
    if image_labels(engine, CPU_BASE) is not None:
        return
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise SystemExit(
            f"error: base image {CPU_BASE} is missing and cannot be made here (needs root and debootstrap:"
            " apt-get install debootstrap); or pass --base python:3.11-slim-bookworm where a registry is reachable"
        )
    mirror = os.environ.get("ROSETTA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rosetta-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"making {CPU_BASE}: debootstrap --variant=minbase --include=python3,python3-venv bookworm ({mirror})")
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm", str(rootfs), mirror],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        changes = ["--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["/bin/bash"]']
        subprocess.run([engine.name, "import", *changes, "-", CPU_BASE], stdin=tar.stdout, check=True)
        tar.stdout.close()  # type: ignore[union-attr]
        if tar.wait() != 0:
            raise SystemExit(f"error: tar of the {CPU_BASE} root filesystem failed")
    log(f"made {CPU_BASE} in {time.monotonic() - started:.0f} s")


def image_size(engine: Engine, image: str) -> int:
    out = subprocess.run(
        [engine.name, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True, check=False
    )
    return int(out.stdout.strip() or 0)


def build(envs: Sequence[str], variant: str, base: str | None) -> dict[str, float]:
    """Build each env's image; returns seconds per image."""
    engine = ensure_engine()
    log(f"engine: {engine.name}{' (rootless)' if engine.rootless else ''}")
    if variant == "cpu" and base is None:
        make_cpu_base(engine)
        base = CPU_BASE
    times: dict[str, float] = {}
    for env in envs:
        started = time.monotonic()
        context = wheelhouse(env, variant)
        build_args = {
            "VARIANT": variant,
            "REVISION": revision(env, variant),
            "FRAMEWORK_VERSION": framework_version(env, variant),
            "LOCK_SHA256": lock_sha256(env, variant),
        }
        if base:
            build_args["BASE_IMAGE"] = base  # else the recipe's own pinned CUDA base
        argv = build_command(engine, env, variant, context, build_args)
        log(" ".join(shlex.quote(a) for a in argv))
        subprocess.run(argv, check=True)
        times[env] = time.monotonic() - started
        size = image_size(engine, image_name(env, variant)) / 1e9
        log(f"built {image_name(env, variant)} in {times[env]:.0f} s ({size:.2f} GB)")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rosetta's container images and engine.")
    sub = parser.add_subparsers(dest="action", required=True)
    build_p = sub.add_parser("build", help="build images from containers/<env>.Dockerfile")
    build_p.add_argument("envs", nargs="*", metavar="ENV", help=f"default: all of {', '.join(runner.ENVIRONMENTS)}")
    build_p.add_argument("--variant", choices=runner.VARIANTS, default="cpu")
    build_p.add_argument(
        "--base", help=f"base image (cpu default: {CPU_BASE}, made here with debootstrap; cuda: the recipe's own)"
    )
    sub.add_parser("engine", help="make sure a container engine answers (starts dockerd here when it can)")
    args = parser.parse_args(argv)
    if args.action == "engine":
        engine = ensure_engine()
        print(f"{engine.name}{' (rootless)' if engine.rootless else ''}")
        return 0
    unknown = sorted(set(args.envs) - set(runner.ENVIRONMENTS))
    if unknown:
        parser.error(f"unknown environment(s) {', '.join(unknown)}; choose from {', '.join(runner.ENVIRONMENTS)}")
    times = build(args.envs or list(runner.ENVIRONMENTS), args.variant, args.base)
    log("build times: " + ", ".join(f"{env} {seconds:.0f} s" for env, seconds in times.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
