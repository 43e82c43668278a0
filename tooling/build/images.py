"""Building the images the container runtime (pipelines/containers.py) runs: one recipe,
containers/rosetta.Dockerfile, for every environment, parameterized by pyproject.toml's
[tool.rosetta.environments].

    python -m tooling.build.images build --variant cpu           # the four CPU images, locally, no registry needed
    python -m tooling.build.images build --variant cuda --clean  # the four CUDA images (several GB each)
    python -m tooling.build.images engine            # make sure an engine answers (starts dockerd when it can)

Both variants start from one Debian bookworm base made locally with debootstrap (no registry, no digest to trust):
the CUDA libraries come as the locks' nvidia-* wheels, the driver from the host. Each image's build context is a
wheelhouse downloaded on the host, so the build itself needs no network (see containers/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipelines.containers import Engine, image_labels, image_name, log, probe, select_engine
from pipelines.environments import (
    ENVIRONMENTS,
    PYTHON_VERSION,
    REPO_ROOT,
    VARIANTS,
    find_links,
    lock_path,
    lock_sha256,
    torch_cpu_index,
)

RECIPE = REPO_ROOT / "containers" / "rosetta.Dockerfile"
WHEELHOUSE = RECIPE.parent / "wheelhouse"  # git-ignored; one build context per image: requirements.lock + wheels/
# The base of every image, CPU and CUDA: made locally by debootstrap (Debian bookworm's python3 is the locks' 3.11).
BASE = "rosetta-base:bookworm"
SITE_PACKAGES = f"/opt/venv/lib/python{PYTHON_VERSION}/site-packages"  # where the recipe installs the lock
# pip must pick the same files uv locked for Python 3.11 on manylinux_2_28; pip does not widen a manylinux_2_x
# platform to older ones by itself, so name them all (manylinux2014 widens to 2010 and 1).
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)), "manylinux2014_x86_64")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
# The CUDA runtime wheel a CUDA lock pins: nvidia-cuda-runtime (CUDA 13) or nvidia-cuda-runtime-cu12 (CUDA 12).
CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)", re.MULTILINE)
SHARED_LIBRARY = re.compile(r"\.so(\.\d+)*$")


def build_stage_tag(env: str, variant: str) -> str:
    """A name for the throwaway `install` stage of env's image, so that --clean can remove exactly it."""
    return f"rosetta-build-{env}:{variant}"


def build_command(engine: Engine, env: str, variant: str, context: Path, build_args: Mapping[str, str],
                  target: str | None = None) -> list[str]:
    """The build line of env's image; with `target`, of that stage only, under build_stage_tag's name."""
    tag = image_name(env, variant) if target is None else build_stage_tag(env, variant)
    argv = [engine.name, "build", "--file", str(RECIPE), "--tag", tag, *(["--target", target] if target else [])]
    for key in sorted(build_args):
        argv += ["--build-arg", f"{key}={build_args[key]}"]
    return [*argv, str(context)]


def framework_version(env: str, variant: str) -> str:
    """`name==version` of the first of env's distributions its lock pins (e.g. tensorflow-cpu in the CPU lock)."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", lock_path(env, variant).read_text(), re.MULTILINE))
    return next((f"{name}=={pins[name]}" for name in ENVIRONMENTS[env].distributions if name in pins), "unknown")


def cuda_requirement(env: str) -> str:
    """NVIDIA_REQUIRE_CUDA of env's CUDA image: the CUDA major of its lock's runtime wheel, e.g. "cuda>=13.0".

    The NVIDIA container toolkit then refuses, when the container starts, a driver too old for that major (CUDA
    minor version compatibility runs any 13.x runtime on a 13.0 driver, so the minor is not required)."""
    lock = lock_path(env, "cuda")
    majors = sorted({major for major, _ in CUDA_RUNTIME.findall(lock.read_text())})
    if len(majors) != 1:
        found = f"CUDA majors {', '.join(majors)}" if majors else "no nvidia-cuda-runtime wheel"
        raise SystemExit(f"error: {lock.relative_to(REPO_ROOT)} must pin the runtime of exactly one CUDA major"
                         f" ({found})")
    return f"cuda>={majors[0]}.0"


def cuda_library_path(wheels: Path) -> str:
    """LD_LIBRARY_PATH of a CUDA image: every folder of the nvidia-* wheels (as installed in the image) that holds a
    shared library, sorted. The frameworks find their nvidia-* libraries themselves; ONNX Runtime's CUDA provider
    (libcublas, libcudnn, libcufft, ...) finds them only on the loader's path or after onnxruntime.preload_dlls()."""
    folders = set()
    for wheel in sorted(wheels.glob("nvidia_*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                folder = posixpath.dirname(name)
                if name.startswith("nvidia/") and SHARED_LIBRARY.search(name) and "stubs" not in folder.split("/"):
                    folders.add(folder)
    return ":".join(f"{SITE_PACKAGES}/{folder}" for folder in sorted(folders))


def build_args(env: str, variant: str, base: str | None, wheels: Path | None = None) -> dict[str, str]:
    """What the one recipe needs to make env's image: the data of its pyproject table and lock, and labels.
    `wheels`: the downloaded wheelhouse, whose nvidia-* wheels give a CUDA image its library path."""
    spec = ENVIRONMENTS[env]
    args = {
        "ENV_NAME": env,
        "TITLE": spec.title,
        "BASE_IMAGE": base or BASE,
        "VARIANT": variant,
        "REVISION": revision(env, variant),
        "FRAMEWORK": spec.distributions[0] if spec.distributions else env,
        "FRAMEWORK_VERSION": framework_version(env, variant),
        "LOCK_SHA256": lock_sha256(lock_path(env, variant)),
        "RECIPE_SHA256": lock_sha256(RECIPE),  # the same sha256 of a file's bytes
    }
    if variant == "cuda":
        args["NVIDIA_REQUIRE_CUDA"] = cuda_requirement(env)
        args["CUDA_LIBRARY_PATH"] = cuda_library_path(wheels) if wheels else ""
    return args


# ---------------------------------------------------------------- the engine


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
        if probe("docker")[0]:
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


# ---------------------------------------------------------------- building images


def lock_hashes(lock: Path) -> set[str]:
    return set(HASH.findall(lock.read_text()))


def revision(env: str, variant: str) -> str:
    """The commit an image's contents come from: the last one touching the recipe or its lock ("-dirty" if either
    is edited). Not HEAD: an image holds no other file, and a label that changed with every commit would rebuild it."""
    inputs = [str(RECIPE), str(lock_path(env, variant))]

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("log", "-1", "--format=%H", "--", *inputs) or git("rev-parse", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--", *inputs) else "")


def wheelhouse(env: str, variant: str, cache: bool = True) -> Path:
    """A build context holding exactly env's lock and its wheels, downloaded on the host.

    The build then installs with --no-index: no network, proxy or CA certificate inside the build, and no
    credential that could end up in a layer. Wheels are checked against the lock's hashes twice (on the host by pip
    download, in the image by pip install).
    """
    lock = lock_path(env, variant)
    context = WHEELHOUSE / f"{env}-{variant}"
    wheels = context / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lock, context / "requirements.lock")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--require-hashes"]
    if not cache:
        cmd.append("--no-cache-dir")  # CUDA wheels are GBs: not a second copy in pip's cache
    cmd += ["--no-deps", "--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION]
    cmd += ["--abi", f"cp{PYTHON_VERSION.replace('.', '')}"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    links = find_links()
    if links:
        cmd += ["--find-links", links]
    elif env == "torch" and variant == "cpu":
        cmd += ["--extra-index-url", torch_cpu_index()]  # where the +cpu wheel lives
    log(f"wheelhouse {context.relative_to(REPO_ROOT)} from {lock.relative_to(REPO_ROOT)}")
    subprocess.run([*cmd, "-r", str(lock), "-d", str(wheels)], check=True)
    wanted = lock_hashes(lock)
    for wheel in wheels.iterdir():  # drop what an older lock left behind: the context is exactly this lock
        if hashlib.sha256(wheel.read_bytes()).hexdigest() not in wanted:
            wheel.unlink()
    return context


def make_base(engine: Engine) -> None:
    """rosetta-base:bookworm from Debian's archive (debootstrap): the base of every image, CPU and CUDA, made where no
    image registry is reachable (and with no digest to trust but Debian's signed archive)."""
    if image_labels(engine, BASE) is not None:
        return
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise SystemExit(
            f"error: base image {BASE} is missing and cannot be made (needs root and debootstrap:"
            " apt-get install debootstrap); or pass --base python:3.11-slim-bookworm where a registry is reachable"
        )
    mirror = os.environ.get("ROSETTA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rosetta-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"making {BASE}: debootstrap --variant=minbase --include=python3,python3-venv bookworm ({mirror})")
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
        subprocess.run([engine.name, "import", *changes, "-", BASE], stdin=tar.stdout, check=True)
        tar.stdout.close()  # type: ignore[union-attr]
        if tar.wait() != 0:
            raise SystemExit(f"error: tar of the {BASE} root filesystem failed")
    log(f"made {BASE} in {time.monotonic() - started:.0f} s")


def image_size(engine: Engine, image: str) -> int:
    out = subprocess.run(
        [engine.name, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True, check=False
    )
    return int(out.stdout.strip() or 0)


def is_current(engine: Engine, env: str, variant: str, base: str | None) -> bool:
    """Whether env's image exists and was built from the current lock and recipe on the same base (its labels say
    so): what the image holds is a function of those three, so a build keeps it. Asking the engine's layer cache
    instead still sends the whole build context (a GB or more of wheels) for every image: about 20 s each."""
    labels = image_labels(engine, image_name(env, variant)) or {}
    return (labels.get("rosetta.lock.sha256") == lock_sha256(lock_path(env, variant))
            and labels.get("rosetta.recipe.sha256") == lock_sha256(RECIPE)
            and labels.get("org.opencontainers.image.base.name") == (base or BASE))


def build(envs: Sequence[str], variant: str, base: str | None, clean: bool = False,
          force: bool = False) -> dict[str, float]:
    """Build each env's image, keeping one already built from the current lock and recipe on the same base
    (`is_current`; `force` builds it again, through the layer cache); returns seconds per image built.

    clean: after each image, remove its wheelhouse and its `install` stage (the wheels and a second copy of the
    environment: about twice the image's size for CUDA), and download without pip's cache. The image is the same;
    any image not current is downloaded and installed again (the layer cache no longer holds its install stage)."""
    engine = ensure_engine()
    log(f"engine: {engine.name}{' (rootless)' if engine.rootless else ''}")
    if base is None:
        make_base(engine)
    times: dict[str, float] = {}
    for env in envs:
        started = time.monotonic()
        if not force and is_current(engine, env, variant, base):
            log(f"{image_name(env, variant)} is current (built from this lock and recipe on {base or BASE}): kept")
            continue
        context = wheelhouse(env, variant, cache=not clean)
        args = build_args(env, variant, base, context / "wheels")
        # With --clean, the install stage first, under a name of its own (the full build then reuses it).
        for target in ("install", None) if clean else (None,):
            argv = build_command(engine, env, variant, context, args, target)
            log(" ".join(shlex.quote(a) for a in argv))
            subprocess.run(argv, check=True)
        if clean:
            subprocess.run([engine.name, "image", "rm", build_stage_tag(env, variant)], check=True,
                           stdout=subprocess.DEVNULL)
            shutil.rmtree(context)
            log(f"removed the wheelhouse and the install stage of {image_name(env, variant)}")
        times[env] = time.monotonic() - started
        size = image_size(engine, image_name(env, variant)) / 1e9
        log(f"built {image_name(env, variant)} in {times[env]:.0f} s ({size:.2f} GB)")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rosetta's container images and engine.")
    sub = parser.add_subparsers(dest="action", required=True)
    build_p = sub.add_parser("build", help=f"build images from {RECIPE.relative_to(REPO_ROOT)}")
    build_p.add_argument("envs", nargs="*", metavar="ENV", help=f"default: all of {', '.join(ENVIRONMENTS)}")
    build_p.add_argument("--variant", choices=VARIANTS, default="cpu")
    build_p.add_argument("--base", help=f"base image (default: {BASE}, made locally with debootstrap)")
    build_p.add_argument(
        "--clean",
        action="store_true",
        help="after each image, remove its wheelhouse and install stage (saves GBs for CUDA; rebuilds download again)",
    )
    build_p.add_argument("--force", action="store_true",
                         help="build even an image already built from the current lock and recipe on the same base")
    sub.add_parser("engine", help="make sure a container engine answers (starts dockerd when it can)")
    args = parser.parse_args(argv)
    if args.action == "engine":
        engine = ensure_engine()
        print(f"{engine.name}{' (rootless)' if engine.rootless else ''}")
        return 0
    unknown = sorted(set(args.envs) - set(ENVIRONMENTS))
    if unknown:
        parser.error(f"unknown environment(s) {', '.join(unknown)}; choose from {', '.join(ENVIRONMENTS)}")
    times = build(args.envs or list(ENVIRONMENTS), args.variant, args.base, args.clean, args.force)
    log("build times: " + (", ".join(f"{env} {seconds:.0f} s" for env, seconds in times.items())
                           or "none built, every image current"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
