"""`make gpu-check`: the CUDA variant on a GPU host, end to end, with a short report.

    make gpu-check             # = python -m tooling.devices.gpu_check
    python -m tooling.devices.gpu_check report RESULT.json --out DIR     # only the report, from a result file

Without a GPU the CUDA images can show only that they build, hold the CUDA builds and pass on the CPU (make
smoke-cuda, make test-cuda); this shows the rest on a GPU host: it builds the missing or stale CUDA images,
smoke-checks each with --require-gpu (tooling/devices/cuda_smoke.py), runs the tiny pipeline twice (on the CPU, and
in the CUDA images on the GPUs), measures each model.onnx under ONNX Runtime's CUDA provider against its CPU provider,
and judges the CUDA run against the CPU run by params.yaml's tolerances, each step with the commands a user would
run.
It writes reports/gpu-check/report.json and report.md and exits 0 only if every part passes; anywhere else it
refuses in one line, exit 2. Only the refusal and the report run without a GPU (tests/unit/test_gpu_check.py).
Each step and the report: containers/README.md, "What only `make gpu-check` checks".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from pipelines import containers, paths
from pipelines.environments import ENVIRONMENTS, FRAMEWORKS, REPO_ROOT, envs_dir

OUT = Path("reports/gpu-check")  # under the checkout (git-ignored), so the containers can write into it
REFUSAL = "error: make gpu-check needs an NVIDIA GPU and the NVIDIA container runtime: {why}. Without a GPU, " \
          "make smoke-cuda and make test-cuda check the CUDA images on the CPU"
LATENCY_BATCHES = (1, 64)


# ---------------------------------------------------------------- refuse where there is no GPU


def refusal() -> str:
    """"" on a GPU host whose engine can hand GPUs to containers, else the one line that refuses."""
    if not containers.visible_gpus():
        return REFUSAL.format(why="no NVIDIA GPU visible on this host (nvidia-smi lists none)")
    from tooling.build import images  # here: it may start dockerd, which is pointless without a GPU

    problem = containers.nvidia_container_support(images.ensure_engine())
    return REFUSAL.format(why=problem) if problem else ""


# ---------------------------------------------------------------- on the GPU host (refused without one)


def orchestrator_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "ROSETTA_ENVS_DIR": str(envs_dir()), **extra}


CUDA_RUN = {"ROSETTA_RUNTIME": "container", "ROSETTA_VARIANT": "cuda", "ROSETTA_GPUS": "1"}


def ensure_images() -> dict[str, int]:
    """Build the missing or stale CUDA images; returns each image's size in bytes."""
    from tooling.build import images

    engine = images.ensure_engine()
    stale = []
    for env in ENVIRONMENTS:
        try:
            containers.check_image(engine, env, "cuda")
        except SystemExit:
            stale.append(env)
    if stale:
        images.build(stale, "cuda", None, clean=True)
    return {env: images.image_size(engine, containers.image_name(env, "cuda")) for env in ENVIRONMENTS}


def smoke(out: Path) -> dict[str, Any]:
    found = {}
    for env in ENVIRONMENTS:
        target = out / "smoke" / f"{env}.json"
        subprocess.run([sys.executable, "-m", "pipelines.runner", env, "--", "python", "-m",
                        "tooling.devices.cuda_smoke", "--require-gpu", "--json", str(target)], cwd=REPO_ROOT,
                       env=orchestrator_env(**CUDA_RUN), check=False)
        found[env] = json.loads(target.read_text()) if target.is_file() else {"passed": False, "failure": "no result"}
    return found


def tiny_pipeline(root: Path, gpus: int, **env_vars: str) -> dict[str, Any]:
    """A TINY copy of this checkout at `root`, `dvc repro` there; its validation verdict and time."""
    from tooling.build import tiny_run  # the tiny params and the copy every pipeline test uses

    env = orchestrator_env(**env_vars)
    tiny_run.copy_repo(root, env)
    if gpus < 2:  # no data-parallel run: NCCL refuses two ranks on one GPU
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["data_parallel"]["workers"] = 1
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=root, env=env, check=False)
    report = root / paths.REPORTS / "validation.json"
    checks = json.loads(report.read_text())["checks"] if report.is_file() else []
    return {"seconds": round(time.monotonic() - started, 1), "exit_code": result.returncode,
            "passed": result.returncode == 0 and bool(checks) and all(c["passed"] for c in checks),
            "checks": len(checks), "failed": [c for c in checks if not c["passed"]][:20]}


def measure_ort(root: Path, out: Path) -> None:
    """Inside the validation image, on the GPU: ORT's CUDA provider vs its CPU provider for every model.onnx."""
    import numpy as np
    import onnxruntime as ort

    from pipelines import latency
    from rosetta_common.data import load_prepared
    from rosetta_common.spec import load_spec

    spec = load_spec(root / paths.PARAMS)
    images = load_prepared(root / paths.PREPARED).test_inputs
    settings = latency.Settings(batch_sizes=LATENCY_BATCHES)
    rows = []
    for fw in FRAMEWORKS:
        for model in spec.models:
            path = str(root / paths.onnx_model(model, fw))
            cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            cuda = ort.InferenceSession(path, providers=[("CUDAExecutionProvider", {"use_tf32": 0})])
            on_cpu, on_cuda = latency.onnx_predict(cpu), latency.onnx_predict(cuda)
            want = on_cpu(images)
            tol = spec.tolerances
            rows.append({
                "framework": fw, "model": model, "providers": cuda.get_providers(),
                "ort_cuda_vs_cpu_max_abs": float(np.max(np.abs(on_cuda(images) - want))),
                "tolerance": tol.onnx_vs_native_abs + tol.onnx_vs_native_rel * float(np.max(np.abs(want))),
                # latency.measure's "native" is the CPU provider here, its "onnx" the CUDA provider.
                "latency": [{"batch": r["batch"], "ort_cpu_ms": r["native_median_ms"],
                             "ort_cuda_ms": r["onnx_median_ms"]}
                            for r in latency.measure(on_cpu, on_cuda, images, settings)],
            })
    out.write_text(json.dumps(rows, indent=2) + "\n")


def native_latency(root: Path, fw: str, model: str) -> dict[int, float]:
    record = root / "measurements" / model / f"{fw}.json"  # pipelines/measurements.py's record_path
    if not record.is_file():
        return {}
    return {r["batch"]: r["native_median_ms"] for r in json.loads(record.read_text())["latency"]["results"]}


def parity(cpu_root: Path, cuda_root: Path) -> list[dict[str, Any]]:
    """The CUDA run against the CPU run, per model, by the training-parity tolerances of params.yaml: the figures of
    pipelines.checks.parity.pair_figures, the one function behind every pairwise figure."""
    import numpy as np

    from pipelines.checks.parity import Side, pair_figures
    from rosetta_common.spec import load_spec

    spec = load_spec(cuda_root / paths.PARAMS)
    rows = []
    for fw in FRAMEWORKS:
        for model in spec.models:
            tol = spec.tolerances
            sides = []
            for root in (cpu_root, cuda_root):
                metrics = json.loads((root / paths.metrics(model, fw)).read_text())
                log = json.loads((root / paths.train_log(model, fw)).read_text())
                sides.append(Side(np.asarray(log["step_losses"], np.float64), metrics["test_loss"],
                                  metrics["test_accuracy"]))
            figures = pair_figures(*sides)
            rows.append({
                "framework": fw, "model": model,
                "step1_loss_rel": figures["step1_loss_rel"], "step1_loss_rel_tolerance": tol.step1_loss_rel,
                "test_loss_rel": figures["test_loss_rel"], "test_loss_rel_tolerance": tol.test_loss_rel,
                "test_accuracy_points": figures["test_accuracy_diff_points"],
                "test_accuracy_points_tolerance": tol.test_accuracy_points,
            })
    return rows


def run_on_gpu(out: Path) -> dict[str, Any]:
    gpus = containers.visible_gpus()
    result: dict[str, Any] = {"host": {"gpus": gpus}, "images": ensure_images(), "smoke": smoke(out)}
    work = Path(tempfile.mkdtemp(prefix="rosetta-gpu-check-"))
    try:
        cpu_root, cuda_root = work / "cpu", work / "cuda"
        result["runs"] = {"cpu": tiny_pipeline(cpu_root, len(gpus), ROSETTA_RUNTIME="local", ROSETTA_VARIANT="cpu"),
                          "cuda": tiny_pipeline(cuda_root, len(gpus), **CUDA_RUN)}
        if result["runs"]["cuda"]["exit_code"] == 0:
            ort_json = cuda_root / OUT / "ort.json"
            ort_json.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "pipelines.runner", "validation", "--", "python", "-m",
                            "tooling.devices.gpu_check", "measure-ort", str(cuda_root), str(ort_json)],
                           cwd=cuda_root, env=orchestrator_env(**CUDA_RUN), check=False)
            ort_rows = json.loads(ort_json.read_text()) if ort_json.is_file() else []
            for row in ort_rows:
                native = native_latency(cuda_root, row["framework"], row["model"])
                for point in row["latency"]:
                    point["native_cuda_ms"] = native.get(point["batch"])
            result["ort"] = ort_rows
        if result["runs"]["cpu"]["exit_code"] == 0 and result["runs"]["cuda"]["exit_code"] == 0:
            result["parity"] = parity(cpu_root, cuda_root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


# ---------------------------------------------------------------- the report (pure: tested with a fake result)


def verdicts(result: dict[str, Any]) -> dict[str, bool]:
    """What passed, by part; a part with no rows has not passed."""
    smoke_ = result.get("smoke", {})
    ort_rows, parity_rows = result.get("ort", []), result.get("parity", [])
    runs = result.get("runs", {})
    return {
        "smoke": bool(smoke_) and all(s.get("passed") and s.get("gpu") for s in smoke_.values()),
        "cpu_run": bool(runs.get("cpu", {}).get("passed")),
        "cuda_run": bool(runs.get("cuda", {}).get("passed")),
        "ort_cuda_vs_cpu": bool(ort_rows) and all(
            r["providers"][:1] == ["CUDAExecutionProvider"] and r["ort_cuda_vs_cpu_max_abs"] <= r["tolerance"]
            for r in ort_rows),
        "parity_vs_cpu": bool(parity_rows) and all(
            r[k] <= r[f"{k}_tolerance"] for r in parity_rows
            for k in ("step1_loss_rel", "test_loss_rel", "test_accuracy_points")),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_markdown(result: dict[str, Any]) -> str:
    verdict = verdicts(result)
    passed = all(verdict.values())
    lines = ["# GPU check", "", f"**{'PASSED' if passed else 'FAILED'}**: "
             + ", ".join(f"{part} {'ok' if ok else 'FAILED'}" for part, ok in verdict.items()), ""]
    lines += ["## Devices seen", "", f"Host: {'; '.join(result.get('host', {}).get('gpus', [])) or 'none'}", "",
              "| image | framework | CUDA build | devices | smoke |", "| --- | --- | --- | --- | --- |"]
    for env, s in result.get("smoke", {}).items():
        devices = ", ".join(s.get("devices", [])) or "none"
        lines.append(f"| rosetta-{env}:cuda | {s.get('framework', '')} {s.get('version', '')}"
                     f" | {s.get('cuda_build', '')} | {devices} | {'ok' if s.get('passed') else s.get('failure')} |")
    lines += ["", "## Tiny pipeline", "", "| run | validation | checks | seconds |", "| --- | --- | --- | --- |"]
    for name, run in result.get("runs", {}).items():
        lines.append(f"| {name} | {'passed' if run['passed'] else 'FAILED'} | {run['checks']} | {run['seconds']} |")
    lines += ["", "## ONNX Runtime: CUDA provider vs CPU provider, and latency (median ms)", "",
              "| framework | model | CUDA vs CPU max abs | tolerance | batch | native CUDA | ORT CUDA | ORT CPU |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result.get("ort", []):
        for p in r["latency"]:
            lines.append(f"| {r['framework']} | {r['model']} | {r['ort_cuda_vs_cpu_max_abs']:.2e}"
                         f" | {r['tolerance']:.2e} | {p['batch']} | {_ms(p.get('native_cuda_ms'))}"
                         f" | {_ms(p['ort_cuda_ms'])} | {_ms(p['ort_cpu_ms'])} |")
    lines += ["", "## Parity of the CUDA run with the CPU run", "",
              "| framework | model | step-1 loss rel | test loss rel | test accuracy (points) |",
              "| --- | --- | --- | --- | --- |"]
    for r in result.get("parity", []):
        cells = [f"{r[k]:.2e} (tol {r[f'{k}_tolerance']:.0e})" for k in ("step1_loss_rel", "test_loss_rel")]
        lines.append(f"| {r['framework']} | {r['model']} | {cells[0]} | {cells[1]}"
                     f" | {r['test_accuracy_points']:.2f} (tol {r['test_accuracy_points_tolerance']}) |")
    return "\n".join(lines) + "\n"


def write_report(result: dict[str, Any], out: Path) -> bool:
    """report.json (the result and its verdicts) and report.md in `out`; True if every part passed."""
    verdict = verdicts(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**result, "verdicts": verdict, "passed": all(verdict.values())},
                                                indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(result))
    return all(verdict.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action")
    report_p = sub.add_parser("report", help="write the report from a result file (no GPU needed)")
    report_p.add_argument("result", type=Path)
    report_p.add_argument("--out", type=Path, default=REPO_ROOT / OUT)
    measure_p = sub.add_parser("measure-ort", help="(inside the CUDA validation image) ORT CUDA vs CPU provider")
    measure_p.add_argument("root", type=Path)
    measure_p.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.action == "report":
        passed = write_report(json.loads(args.result.read_text()), args.out)
        print(f"gpu-check report: {args.out / 'report.md'} ({'passed' if passed else 'FAILED'})")
        return 0 if passed else 1
    if args.action == "measure-ort":
        measure_ort(args.root, args.out)
        return 0
    why = refusal()
    if why:
        print(why, file=sys.stderr)
        return 2
    out = REPO_ROOT / OUT
    result = run_on_gpu(out)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    passed = write_report(result, out)
    print(f"gpu-check: {'passed' if passed else 'FAILED'}; report: {out / 'report.md'}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
