"""The CUDA variant without a GPU.

Always (fast): the CUDA locks are reconciled with the CPU ones (the same version of everything both install, one
ONNX Runtime flavour per environment, onnxruntime-gpu's CUDA libraries present) and containers/README.md names the one
version that cannot match.

Opt-in (ROSETTA_CUDA_TESTS=1, `make test-cuda`; several GB of wheels, so not in the default `make test`): builds
the four CUDA images with the documented command, runs the smoke check in each (CUDA builds present,
CUDAExecutionProvider listed, one clear line for the CPU fallback where there is no GPU), then
`ROSETTA_RUNTIME=container ROSETTA_VARIANT=cuda dvc repro` with tiny params in a temporary copy: every check as on
the CPU variant.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipelines import containers
from pipelines.environments import ENVIRONMENTS, FRAMEWORKS, lock_path
from support import REPO, copy_repo, orchestrator_env
from tooling.build import env_locks, images

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s|$)", re.MULTILINE)


def pins(env: str, variant: str) -> dict[str, str]:
    return dict(PIN.findall(lock_path(env, variant).read_text()))


# ---------------------------------------------------------------- the locks (always)


@pytest.mark.parametrize("env", list(ENVIRONMENTS))
def test_cuda_lock_keeps_every_version_the_cpu_lock_has(env):
    """The CUDA lock is resolved under the CPU lock's pins (tooling/build/env_locks.py): numpy, protobuf, onnx, ...
    match."""
    cpu, cuda = pins(env, "cpu"), pins(env, "cuda")
    differ = {name: (cpu[name], cuda[name]) for name in cpu.keys() & cuda.keys()
              if cpu[name].split("+")[0] != cuda[name]}
    assert not differ
    for name in ("numpy", "protobuf", "onnx"):
        assert cuda[name] == cpu[name]


def test_cuda_locks_are_resolved_under_the_cpu_pins():
    constraints = env_locks.cpu_constraints("torch").splitlines()
    assert "torch==2.13.0" in constraints and "numpy==" + pins("torch", "cpu")["numpy"] in constraints
    assert not any("+" in line or "hash" in line for line in constraints)  # local labels dropped: CUDA torch fits


@pytest.mark.parametrize("env", list(ENVIRONMENTS))
@pytest.mark.parametrize("variant", ["cpu", "cuda"])
def test_one_onnx_runtime_flavour_per_environment(env, variant):
    # Both install the module `onnxruntime`: one would overwrite the other's files.
    assert len({"onnxruntime", "onnxruntime-gpu"} & pins(env, variant).keys()) == 1


def test_onnx_runtime_versions_across_the_variants():
    # The framework environments keep the CPU build in both variants (latency on CPU, conformance tests).
    for fw in FRAMEWORKS:
        assert pins(fw, "cuda")["onnxruntime"] == pins(fw, "cpu")["onnxruntime"]
    cpu, gpu = pins("validation", "cpu")["onnxruntime"], pins("validation", "cuda")["onnxruntime-gpu"]
    # No onnxruntime-gpu of the CPU build's version is on PyPI: containers/README.md names the difference.
    readme = (REPO / "containers/README.md").read_text()
    assert f"onnxruntime-gpu {gpu}" in readme and f"onnxruntime {cpu}" in readme


def test_onnxruntime_gpu_brings_its_cuda_libraries():
    """onnxruntime-gpu[cuda,cudnn]: what its CUDA provider links or loads, as nvidia-* wheels (no CUDA base)."""
    validation = pins("validation", "cuda")
    for wheel in ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-curand", "nvidia-cufft", "nvidia-cudnn-cu13"):
        assert wheel in validation
    assert validation["nvidia-cuda-runtime"].startswith("13.")  # onnxruntime-gpu 1.31 is built for CUDA 13


# ---------------------------------------------------------------- opt-in: build and run the CUDA images

cuda = pytest.mark.skipif(
    os.environ.get("ROSETTA_CUDA_TESTS") != "1",
    reason="the CUDA images need several GB of wheels: make test-cuda runs them (ROSETTA_CUDA_TESTS=1)",
)


@pytest.fixture(scope="module")
def cuda_images() -> dict[str, int]:
    try:
        engine = images.ensure_engine()
        images.make_base(engine)
    except (SystemExit, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no container engine or base image: {exc}")
    built = subprocess.run([sys.executable, "-m", "tooling.build.images", "build", "--variant", "cuda", "--clean"],
                           cwd=REPO, env=orchestrator_env(), capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return {env: images.image_size(engine, containers.image_name(env, "cuda")) for env in ENVIRONMENTS}


@cuda
@pytest.mark.parametrize("env", list(ENVIRONMENTS))
def test_smoke_check_in_the_cuda_image(cuda_images, env):
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.runner", env, "--", "python", "-m", "tooling.devices.cuda_smoke"],
        cwd=REPO, env=orchestrator_env(ROSETTA_RUNTIME="container", ROSETTA_VARIANT="cuda"),
        capture_output=True, text=True, check=False)
    print(f"\n[cuda] rosetta-{env}:cuda ({cuda_images[env] / 1e9:.2f} GB):\n{done.stdout}", file=sys.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == f"{env}: smoke check passed"
    if not containers.visible_gpus():
        assert len([line for line in lines if "no GPU visible" in line]) == 1  # the fallback, said once
        assert any(line.startswith(f"{env}: no GPU visible: ") and "runs on CPU (CUDA build " in line
                   for line in lines)
    if env == "validation":
        assert any("CUDAExecutionProvider" in line for line in lines)


@cuda
@pytest.mark.parametrize("env", list(ENVIRONMENTS))
def test_cuda_image_is_non_root_and_says_what_the_nvidia_toolkit_reads(cuda_images, env):
    engine = images.ensure_engine()
    image = containers.image_name(env, "cuda")
    labels = containers.image_labels(engine, image)
    assert labels["rosetta.variant"] == "cuda" and labels["org.opencontainers.image.base.name"] == images.BASE
    inspect = subprocess.run([engine.name, "image", "inspect", "--format", "{{json .Config}}", image],
                             capture_output=True, text=True, check=True)
    config = json.loads(inspect.stdout)
    assert config["User"] == "10001:10001"
    environment = dict(item.split("=", 1) for item in config["Env"])
    assert environment["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert environment["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert environment["NVIDIA_REQUIRE_CUDA"] == images.cuda_requirement(env)
    assert "/site-packages/nvidia/" in environment["LD_LIBRARY_PATH"]
    absent = subprocess.run([engine.name, "run", "--rm", "--network=none", image, "test", "-e", "/opt/venv/bin/pip"],
                            check=False)
    assert absent.returncode != 0


@cuda
def test_tiny_pipeline_in_the_cuda_images_passes_on_this_machine(cuda_images):
    work = Path(tempfile.mkdtemp(prefix="rosetta-cuda-"))
    try:
        root = work / "repo"
        env = orchestrator_env(ROSETTA_RUNTIME="container", ROSETTA_VARIANT="cuda", HOME=str(work / "home"))
        copy_repo(root, env)
        (root / ".dvc/config.local").write_text(f"[core]\n    site_cache_dir = {work / 'dvc-site'}\n")
        (work / "home").mkdir()
        done = subprocess.run(["dvc", "repro"], cwd=root, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        report = json.loads((root / "reports/validation.json").read_text())
        checks = report["checks"]
        print(f"\n[cuda] ROSETTA_VARIANT=cuda dvc repro (tiny params): "
              f"{sum(c['passed'] for c in checks)}/{len(checks)} checks passed", file=sys.stderr)
        assert report["passed"] is True and all(c["passed"] for c in checks)
        ran = set(re.findall(r"Running stage '([^']+)'", done.stdout))
        assert {"data", "validate"} <= ran and {f"train_export@{f}" for f in FRAMEWORKS} <= ran
        if not containers.visible_gpus():
            assert "CUDA images run without --gpus" in done.stdout + done.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
