"""`make gpu-check` where it can be tested, which is anywhere: its refusal without a GPU (one line, exit 2), and
its report, written from a fake result file; and the pure parts of the CUDA images' smoke check
(tooling/devices/cuda_smoke.py). What needs a GPU (the runs themselves) is `make gpu-check`'s alone."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import containers
from pipelines.containers import Engine
from support import REPO, orchestrator_env
from tooling.build import images
from tooling.devices import cuda_smoke, gpu_check

FAKE = {
    "host": {"gpus": ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"]},
    "images": {"torch": 6_900_000_000, "tf": 5_100_000_000, "jax": 5_200_000_000, "validation": 2_830_000_000},
    "smoke": {
        env: {"env": env, "framework": fw, "version": version, "cuda_build": build, "gpu": True,
              "devices": ["NVIDIA H100 80GB HBM3"], "facts": [], "passed": True, "failure": ""}
        for env, fw, version, build in [("torch", "torch", "2.13.0", "13.0"), ("tf", "tensorflow", "2.21.0", "12.5"),
                                        ("jax", "jax", "0.10.2", "12"), ("validation", "onnxruntime-gpu", "1.31.1",
                                                                         "13.0")]
    },
    "runs": {"cpu": {"seconds": 131.5, "exit_code": 0, "passed": True, "checks": 412, "failed": []},
             "cuda": {"seconds": 97.2, "exit_code": 0, "passed": True, "checks": 412, "failed": []}},
    "ort": [
        {"framework": "torch", "model": "mlp", "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
         "ort_cuda_vs_cpu_max_abs": 2.4e-7, "tolerance": 1.3e-5,
         "latency": [{"batch": 1, "ort_cpu_ms": 0.031, "ort_cuda_ms": 0.081, "native_cuda_ms": 0.092},
                     {"batch": 64, "ort_cpu_ms": 0.412, "ort_cuda_ms": 0.104, "native_cuda_ms": 0.118}]},
        {"framework": "jax", "model": "cnn", "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
         "ort_cuda_vs_cpu_max_abs": 1.9e-6, "tolerance": 2.9e-5,
         "latency": [{"batch": 1, "ort_cpu_ms": 0.2, "ort_cuda_ms": 0.15, "native_cuda_ms": None}]},
    ],
    "parity": [
        {"framework": "torch", "model": "mlp", "step1_loss_rel": 1.1e-7, "step1_loss_rel_tolerance": 1e-6,
         "test_loss_rel": 2.0e-5, "test_loss_rel_tolerance": 1e-3, "test_accuracy_points": 0.0,
         "test_accuracy_points_tolerance": 0.6},
    ],
}


def report(tmp_path: Path, result: dict) -> tuple[subprocess.CompletedProcess[str], Path]:
    fake = tmp_path / "result.json"
    fake.write_text(json.dumps(result))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tooling.devices.gpu_check", "report", str(fake), "--out", str(out)],
                          cwd=REPO, env=orchestrator_env(), capture_output=True, text=True, check=False)
    return done, out


# ---------------------------------------------------------------- refusal


def test_gpu_check_refuses_without_a_gpu_in_one_line():
    env = orchestrator_env()
    env["PATH"] = str(Path(sys.executable).parent)  # no nvidia-smi on it, whatever this host has
    done = subprocess.run([sys.executable, "-m", "tooling.devices.gpu_check"], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: make gpu-check needs an NVIDIA GPU and the NVIDIA container runtime: no NVIDIA GPU visible on this"
        " host (nvidia-smi lists none). Without a GPU, make smoke-cuda and make test-cuda check the CUDA images on"
        " the CPU"]


def test_gpu_check_refuses_a_gpu_the_engine_cannot_hand_to_containers(monkeypatch):
    monkeypatch.setattr(containers, "visible_gpus", lambda: ["GPU 0: NVIDIA H100"])
    monkeypatch.setattr(images, "ensure_engine", lambda: Engine("docker"))
    monkeypatch.setattr(containers, "nvidia_container_support",
                        lambda engine: "Docker has no NVIDIA container runtime (install the NVIDIA Container Toolkit)")
    assert gpu_check.refusal().startswith("error: make gpu-check needs an NVIDIA GPU and the NVIDIA container runtime:"
                                          " Docker has no NVIDIA container runtime")
    monkeypatch.setattr(containers, "nvidia_container_support", lambda engine: "")
    assert gpu_check.refusal() == ""


# ---------------------------------------------------------------- the report, from a fake result file


def test_report_from_a_fake_result_file(tmp_path):
    done, out = report(tmp_path, FAKE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"gpu-check report: {out / 'report.md'} (passed)"
    written = json.loads((out / "report.json").read_text())
    assert written["passed"] is True
    assert written["verdicts"] == {"smoke": True, "cpu_run": True, "cuda_run": True, "ort_cuda_vs_cpu": True,
                                   "parity_vs_cpu": True}
    assert written["ort"] == FAKE["ort"]  # the figures as measured, beside their verdicts
    md = (out / "report.md").read_text()
    assert md.startswith("# GPU check\n\n**PASSED**: smoke ok, cpu_run ok, cuda_run ok, ort_cuda_vs_cpu ok,"
                         " parity_vs_cpu ok\n")
    assert "Host: GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)" in md
    assert "| rosetta-validation:cuda | onnxruntime-gpu 1.31.1 | 13.0 | NVIDIA H100 80GB HBM3 | ok |" in md
    assert "| cuda | passed | 412 | 97.2 |" in md
    header = "| framework | model | CUDA vs CPU max abs | tolerance | batch | native CUDA | ORT CUDA | ORT CPU |"
    assert header in md
    assert "| torch | mlp | 2.40e-07 | 1.30e-05 | 64 | 0.118 | 0.104 | 0.412 |" in md
    assert "| jax | cnn | 1.90e-06 | 2.90e-05 | 1 | - | 0.150 | 0.200 |" in md  # no native record: a dash
    assert "| torch | mlp | 1.10e-07 (tol 1e-06) | 2.00e-05 (tol 1e-03) | 0.00 (tol 0.6) |" in md


@pytest.mark.parametrize(
    ("part", "spoil"),
    [
        ("smoke", lambda r: r["smoke"]["tf"].update(gpu=False)),  # a framework that did not see the GPU
        ("cuda_run", lambda r: r["runs"]["cuda"].update(passed=False)),
        ("ort_cuda_vs_cpu", lambda r: r["ort"][0].update(ort_cuda_vs_cpu_max_abs=1e-3)),
        ("ort_cuda_vs_cpu", lambda r: r["ort"][1].update(providers=["CPUExecutionProvider"])),  # fell back to CPU
        ("parity_vs_cpu", lambda r: r["parity"][0].update(test_accuracy_points=1.2)),
        ("parity_vs_cpu", lambda r: r.pop("parity")),  # nothing measured is not a pass
    ],
)
def test_report_fails_naming_the_part(tmp_path, part, spoil):
    result = copy.deepcopy(FAKE)
    spoil(result)
    done, out = report(tmp_path, result)
    assert done.returncode == 1
    written = json.loads((out / "report.json").read_text())
    assert written["passed"] is False
    assert [name for name, ok in written["verdicts"].items() if not ok] == [part]
    assert f"{part} FAILED" in (out / "report.md").read_text().splitlines()[2]


# ---------------------------------------------------------------- the smoke check's pure parts


def test_smoke_names_the_library_a_load_lacks():
    assert cuda_smoke.missing_library("libcuda.so.1: cannot open shared object file: No such file or directory") \
        == "libcuda.so.1"
    assert cuda_smoke.missing_library("/x/libcudnn_engines_runtime_compiled.so.9: libcuda.so.1: cannot open shared"
                                     " object file: No such file or directory") == "libcuda.so.1"
    assert cuda_smoke.missing_library("/x/libfoo.so: undefined symbol: bar") == ""


def test_smoke_tells_the_driver_apart_from_a_missing_library():
    lacks = "{}: cannot open shared object file: No such file or directory".format
    loaded, driver, fabric, broken = cuda_smoke.classify_loads({
        "cu13/lib/libcublas.so.13": "",
        "cudnn/lib/libcudnn_engines_runtime_compiled.so.9": lacks("libcuda.so.1"),
        "nvshmem/lib/nvshmem_transport_ucx.so.3": lacks("libucs.so.0"),
        "cudnn/lib/libcudnn.so.9": lacks("libcublasLt.so.13"),
    })
    assert loaded == ["cu13/lib/libcublas.so.13"]
    assert driver == ["cudnn/lib/libcudnn_engines_runtime_compiled.so.9"]  # a GPU host supplies it
    assert fabric == {"nvshmem/lib/nvshmem_transport_ucx.so.3": "libucs.so.0"}  # a multi-node plugin, never loaded
    assert list(broken) == ["cudnn/lib/libcudnn.so.9"]  # a lock or library path that is incomplete


def test_smoke_says_cpu_fallback_in_one_line():
    assert cuda_smoke.no_gpu_line("torch", "13.0") == "no GPU visible: torch runs on CPU (CUDA build 13.0)"
    a, b, want = cuda_smoke.matmul_operands()
    assert cuda_smoke.relative_error(a @ b, want) < cuda_smoke.MATMUL_RTOL  # float32 on the CPU passes
    tf32 = (a.view("uint32") & 0xFFFFE000).view("float32")  # TF32: 10 mantissa bits kept of 23
    assert cuda_smoke.relative_error(tf32 @ b, want) > cuda_smoke.MATMUL_RTOL  # ... and TF32 inputs would fail
