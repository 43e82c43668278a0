"""`make tpu-check`: the JAX stage on a TPU, judged against the CPU runs, at both matrix precisions.

    make tpu-check                                   # = python -m tooling.devices.tpu_check
    python -m tooling.devices.tpu_check bounds OP_ACCURACY.json --out tooling/devices/tpu_results/bounds.json
    python -m tooling.devices.tpu_check unpack PACK.tar.gz --precision highest      # into artifacts/jax@tpu/
    python -m tooling.devices.tpu_check judge --precision highest --out RESULT.json  # in the validation environment
    python -m tooling.devices.tpu_check report tooling/devices/tpu_results/result-{highest,default}.json
    python -m tooling.devices.tpu_check rejudge RESULT.json    # its nulls decided by the current rule (validation env)

A port to a TPU claims float32 products; this shows the claim holds at `highest` and that the judge catches JAX's
default TPU precision. On a TPU host, after `dvc repro` made the CPU runs, it measures the ops and derives the bounds
before any run is compared (tooling/devices/tpu_ops.py, tooling/devices/tpu_bounds.py), trains the JAX stage at
both precisions (tooling/devices/tpu_train.py), judges each (tooling/devices/tpu_judge.py), where a test cannot
judge for want of CPU replicates trains those on (tooling/devices/tpu_null.py) and judges again, and writes
reports/tpu-check/; exit 0 only if `highest` passes and the default fails naming the matrix precision. Without a TPU
it refuses in one line, exit 2; the subcommands need none. A TPU run's records are committed in
tooling/devices/tpu_results/ (RESULTS); the steps by hand and the current figures: docs/tpu.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from pipelines.environments import REPO_ROOT
from rosetta_common.spec import load_spec

OUT = Path("reports/tpu-check")
# What a TPU run recorded (the op table, the bounds, one result per precision), committed beside this module.
RESULTS = Path("tooling/devices/tpu_results")
REFUSAL = "error: make tpu-check needs a TPU that JAX can use: {why}"


def tpu_python(environ: dict[str, str] | None = None) -> str:
    """The interpreter whose JAX runs on the TPU: ROSETTA_TPU_PYTHON, else the jax environment built from
    packages/jax_impl/requirements-tpu.lock (.envs/jax-tpu), else the host's own python3 (a TPU host whose JAX
    equals the lock's, the missing packages carried: docs/tpu.md)."""
    environ = dict(os.environ) if environ is None else environ
    if environ.get("ROSETTA_TPU_PYTHON"):
        return environ["ROSETTA_TPU_PYTHON"]
    built = REPO_ROOT / ".envs" / "jax-tpu" / "bin" / "python"
    return str(built) if built.is_file() else "python3"


def refusal(dev: Path = Path("/dev"), environ: dict[str, str] | None = None) -> str:
    """"" where a TPU is visible (an accel or vfio device under `dev`, or TPU_ACCELERATOR_TYPE set) and the TPU
    interpreter imports libtpu and flax, else the one line that refuses, naming what is missing."""
    environ = dict(os.environ) if environ is None else environ
    devices = glob.glob(str(dev / "accel*")) + glob.glob(str(dev / "vfio" / "[0-9]*"))
    if not devices and not environ.get("TPU_ACCELERATOR_TYPE"):
        return REFUSAL.format(why=f"no TPU device visible ({dev}/accel* and {dev}/vfio/ list none, "
                                  "TPU_ACCELERATOR_TYPE unset)")
    python = tpu_python(environ)
    try:
        probe = subprocess.run([python, "-c", "import libtpu, flax, optax, jax2onnx"], capture_output=True,
                               text=True, check=False)
        code, said = probe.returncode, probe.stderr
    except OSError as error:
        code, said = 1, f"{type(error).__name__}: {error}"
    if code:
        missing = (said.strip().splitlines() or ["not runnable"])[-1]
        return REFUSAL.format(why=f"{python} cannot import libtpu, flax, optax and jax2onnx ({missing}); build "
                                  ".envs/jax-tpu from packages/jax_impl/requirements-tpu.lock or set "
                                  "ROSETTA_TPU_PYTHON")
    return ""


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")


def bounds(op_file: Path, out: Path) -> dict[str, Any]:
    """The bounds of every model at both precisions from a recorded op-accuracy file."""
    from pipelines import paths
    from rosetta_common.spec import load_spec
    from tooling.devices.tpu_bounds import derive

    spec = load_spec(paths.PARAMS)
    derived = derive(json.loads(op_file.read_text()), spec.tolerances, list(spec.models))
    write_json(out, derived)
    return derived


def unpack(pack: Path, precision: str) -> Path:
    """A tooling/devices/tpu_train.py archive into artifacts/<subject>/ (tpu_bounds.subject_name)."""
    import shutil
    import tempfile

    from pipelines import paths
    from tooling.devices.tpu_bounds import subject_name

    target = paths.framework_dir(subject_name(precision))
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=paths.ARTIFACTS) as scratch, tarfile.open(pack) as tar:
        tar.extractall(scratch, filter="data")
        Path(scratch, "jax@tpu").rename(target)
    return target


def run_on_tpu(out: Path) -> int:
    """On a TPU host: the ops measured, the bounds derived, each precision trained, unpacked and judged, the report."""
    from pipelines import paths
    from pipelines.environments import FRAMEWORKS

    if not any(paths.framework_dir(fw).is_dir() for fw in FRAMEWORKS):
        print("error: no CPU run to judge against (artifacts/<framework>/): run `dvc repro` first", file=sys.stderr)
        return 2
    source = os.pathsep.join(str(REPO_ROOT / p) for p in ("", "packages/common/src", "packages/jax_impl/src"))
    env = {**os.environ, "ROSETTA_ENV": "jax",
           "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), source) if p)}
    python = tpu_python()
    ops = out / "op_accuracy.json"
    subprocess.run([python, "-m", "tooling.devices.tpu_ops", "--json", str(ops)], cwd=REPO_ROOT, env=env, check=True)
    bounds(ops, out / "bounds.json")
    results = []
    for precision in ("highest", "default"):
        pack = out / f"{precision}.tar.gz"
        subprocess.run([python, "-m", "tooling.devices.tpu_train", "--precision", precision, "--pack", str(pack)],
                       cwd=REPO_ROOT, env=env, check=True)
        unpack(pack, precision)
        results.append(out / f"result-{precision}.json")
        judge = [sys.executable, "-m", "pipelines.runner", "validation", "--", "python", "-m",
                 "tooling.devices.tpu_check", "judge", "--bounds", str(out / "bounds.json"), "--ops", str(ops),
                 "--precision", precision, "--out", str(results[-1])]
        subprocess.run(judge, cwd=REPO_ROOT, check=True)
        if deepen_cpu_nulls(results[-1]):  # the CPU nulls its tests need trained on, then judged again
            subprocess.run(judge, cwd=REPO_ROOT, check=True)
    return report(results, out, out / "bounds.json")


def deepen_cpu_nulls(result: Path) -> bool:
    """Where a judged result has tests that cannot judge for want of CPU replicates (tooling/devices/tpu_null.py),
    the CPU runs' replicates of those models trained on, each in its framework's environment; whether any were."""
    from tooling.devices.tpu_null import wanted

    alpha = load_spec(Path("params.yaml")).tolerances.null_alpha
    needed = wanted(json.loads(result.read_text()), alpha)
    for fw, models in needed.items():
        subprocess.run([sys.executable, "-m", "pipelines.runner", fw, "--", "python", "-m", "tooling.devices.tpu_null",
                        "train", fw, *models], cwd=REPO_ROOT, check=True)
    return bool(needed)


def report(results: list[Path], out: Path, bounds_file: Path | None = None) -> int:
    """reports/tpu-check/report.md from result files; exit 0 only where the verdicts are the expected ones."""
    from tooling.devices.tpu_report import expected_verdicts, write_report

    loaded = [json.loads(p.read_text()) for p in results]
    derived = json.loads(bounds_file.read_text()) if bounds_file is not None and bounds_file.is_file() else None
    write_report(loaded, out, derived)
    print(f"tpu-check: {out / 'report.md'}")
    return 0 if expected_verdicts(loaded) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("bounds")
    b.add_argument("op_file", type=Path)
    b.add_argument("--out", type=Path, required=True)
    j = sub.add_parser("judge")
    j.add_argument("--bounds", type=Path, default=RESULTS / "bounds.json")
    j.add_argument("--ops", type=Path, default=RESULTS / "op_accuracy.json")
    j.add_argument("--precision", required=True)
    j.add_argument("--cpu", nargs="*", help="the CPU frameworks to judge against (default: every one present)")
    u = sub.add_parser("unpack")
    u.add_argument("pack", type=Path)
    u.add_argument("--precision", required=True)
    j.add_argument("--out", type=Path, required=True)
    rj = sub.add_parser("rejudge")  # in the validation environment (statsmodels)
    rj.add_argument("results", type=Path, nargs="+")
    r = sub.add_parser("report")
    r.add_argument("results", type=Path, nargs="+")
    r.add_argument("--out", type=Path, default=OUT)
    r.add_argument("--bounds", type=Path, default=RESULTS / "bounds.json")
    args = parser.parse_args(argv)
    if args.command == "bounds":
        bounds(args.op_file, args.out)
        print(f"tpu-check: bounds -> {args.out}")
        return 0
    if args.command == "judge":
        from tooling.devices.tpu_judge import judge

        result = judge(json.loads(args.bounds.read_text()), args.precision, json.loads(args.ops.read_text()),
                       args.cpu)
        write_json(args.out, result)
        print(f"tpu-check: {args.precision}: {result['summary']} -> {args.out}")
        return 0
    if args.command == "unpack":
        print(f"tpu-check: {args.pack} -> {unpack(args.pack, args.precision)}")
        return 0
    if args.command == "rejudge":
        from tooling.devices.tpu_judge import rejudge

        alpha = load_spec(Path("params.yaml")).tolerances.null_alpha
        for path in args.results:
            again = rejudge(json.loads(path.read_text()), alpha)
            print(f"tpu-check: {path}: {again['passed']} of {again['checks']} checks pass under the current rule")
            for row in again["moved"]:
                print(f"  {row['model']}/{row['framework']} {row['check']}: {'pass' if row['was'] else 'fail'} -> "
                      f"{'pass' if row['now'] else 'fail'}: {row['why']}")
        return 0
    if args.command == "report":
        return report(args.results, args.out, args.bounds)
    why = refusal()
    if why:
        print(why, file=sys.stderr)
        return 2
    return run_on_tpu(OUT)


if __name__ == "__main__":
    raise SystemExit(main())
