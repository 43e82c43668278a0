"""Which outputs depend on the CPU's instruction sets, and what capping each runtime's code path costs.

    .venv/bin/python benchmarks/isa_pins.py [--models mlp cnn lstm] [--frameworks torch tf jax] [--repeats 2]

The runner pins every runtime that picks its kernels by the CPU to the AVX2 floor (docs/lineage.md, "The same bytes
across CPUs"); a pin is worth having only if the runtime reads it, and only at a small cost. So in a scratch copy of
this checkout each framework's train_export stage runs with no cap (the host's own choice), with the pins, and with
each cap alone below the floor (BELOW), and the validate stage under each OpenBLAS variant (OPENBLAS). It names the
files that differ from the host run's and gives the pinned run's steady training throughput over the host run's,
the two side by side, alternating. A cap at the host's own level changes nothing; one below it shows that the
runtime reads its switch and that its bytes follow the code path, which is what a pin at the floor fixes on a CPU
above it. A measurement, not a test: it writes measurements/isa_pins.json. Method and latest figures:
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MEASUREMENTS = Path("measurements")

# The runner's pins (pipelines/environments.py ISA_PINS, and XLA's cap in its XLA_FLAGS; tests/pipeline/test_isa_pins.py
# keeps this list in step). This benchmark runs every stage through the runner, as the pipeline does, and does not
# import pipelines (benchmarks import nothing that imports them back): a variant is an `env` command in front of
# the stage, which sees the runner's environment and changes only these variables.
PINNED = ("ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "OPENBLAS_CORETYPE")
HOST = {"ONEDNN_MAX_CPU_ISA": None, "MKL_CBWR": "AUTO,STRICT", "OPENBLAS_CORETYPE": None, "XLA_MAX_ISA": None}
PINS: dict[str, str | None] = {}  # the runner's own environment, as it is
# Per framework: the runtimes whose code path its training and export go through, each capped below the floor.
BELOW = {
    "torch": {"oneDNN at AVX": {"ONEDNN_MAX_CPU_ISA": "AVX"}, "MKL at COMPATIBLE": {"MKL_CBWR": "COMPATIBLE,STRICT"}},
    "tf": {"oneDNN at AVX": {"ONEDNN_MAX_CPU_ISA": "AVX"}},
    "jax": {"XLA at AVX": {"XLA_MAX_ISA": "AVX"}, "oneDNN at AVX": {"ONEDNN_MAX_CPU_ISA": "AVX"}},
}
OPENBLAS = {"OpenBLAS host": {"OPENBLAS_CORETYPE": None}, "OpenBLAS at Haswell (pinned)": {},
            "OpenBLAS at Sandybridge": {"OPENBLAS_CORETYPE": "Sandybridge"}}


def env_prefix(variant: dict[str, str | None]) -> list[str]:
    """`env` arguments that make the stage see `variant` over the runner's environment (None: unset). XLA_MAX_ISA
    stands for XLA's flag: the runner's cap in XLA_FLAGS is replaced (or dropped) in the stage's own shell."""
    # every -u before the first NAME=VALUE: env reads no option after an assignment
    unset = [arg for name, value in variant.items() if value is None and name != "XLA_MAX_ISA" for arg in ("-u", name)]
    assign = [f"{name}={value}" for name, value in variant.items() if value is not None and name != "XLA_MAX_ISA"]
    return ["env", *unset, *assign]


def stage_command(env: str, variant: dict[str, str | None], module: str, *args: str) -> list[str]:
    command = [*env_prefix(variant), "python", "-m", module, *args]
    if "XLA_MAX_ISA" in variant:
        cap = variant["XLA_MAX_ISA"]
        flag = "" if cap is None else f" --xla_cpu_max_isa={cap}"
        shell = ('XLA_FLAGS="$(printf %s "$XLA_FLAGS" | sed "s/--xla_cpu_max_isa=[A-Z0-9_]*//")' + flag + '" exec "$@"')
        command = ["sh", "-c", shell, "sh", *command]
    return [sys.executable, "-m", "pipelines.runner", env, "--", *command]


def run_stage(root: Path, env: str, variant: dict[str, str | None], module: str, *args: str) -> float:
    started = time.perf_counter()
    result = subprocess.run(stage_command(env, variant, module, *args), cwd=root, capture_output=True, text=True,
                            check=False, env={"ROSETTA_ENVS_DIR": str(REPO / ".envs"), **os.environ,
                                                         "PYTHONPATH": f"{REPO}"})  # this checkout's environments
    if result.returncode != 0 and module != "pipelines.stages.validate":  # validate may fail its checks: hashed
        raise SystemExit(f"error: {module} {' '.join(args)} under {variant} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - started


def scratch_copy(dest: Path) -> Path:
    """This checkout's files as a user sees them (tracked, and untracked but not ignored), without outputs."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


def file_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def throughput(root: Path, framework: str, models: list[str]) -> dict[str, float]:
    out = {}
    for model in models:
        record = json.loads((root / MEASUREMENTS / model / f"{framework}.json").read_text())
        out[model] = record["train"]["steady_samples_per_second"]
    return out


def differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "lstm"])
    parser.add_argument("--frameworks", nargs="+", default=["torch", "tf", "jax"])
    parser.add_argument("--repeats", type=int, default=2, help="host and pinned runs, alternating")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"models": args.models, "frameworks": {}}
    with tempfile.TemporaryDirectory(prefix="rosetta-isa-") as tmp:
        root = scratch_copy(Path(tmp) / "repo")
        params = root / "params.yaml"
        spec = yaml.safe_load(params.read_text())
        spec["replicates"]["count"] = 0  # replicates train the same code again: nothing this measures
        spec["models"] = args.models  # what the validate variants judge
        params.write_text(yaml.safe_dump(spec, sort_keys=False))
        for stage in ("data", "init"):
            subprocess.run([sys.executable, "-m", f"pipelines.stages.{stage}"], cwd=root, check=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": f"{REPO / 'packages/common/src'}"
                                                     f"{os.pathsep}{root}"})
        for fw in args.frameworks:
            folder = root / "artifacts" / fw
            runs: dict[str, Any] = {"host": [], "pinned": []}
            hashes: dict[str, dict[str, str]] = {}
            for _ in range(args.repeats):
                for name, variant in (("host", HOST), ("pinned", PINS)):
                    seconds = run_stage(root, fw, variant, "pipelines.stages.train_export", fw, *args.models)
                    hashes.setdefault(name, file_hashes(folder))
                    if file_hashes(folder) != hashes[name]:
                        print(f"[isa] {fw} {name}: a repeat gave other bytes", file=sys.stderr)
                    runs[name].append({"seconds": seconds, "samples_per_second": throughput(root, fw, args.models)})
                    print(f"[isa] {fw} {name}: {seconds:.1f} s", file=sys.stderr, flush=True)
            for name, variant in BELOW[fw].items():
                run_stage(root, fw, variant, "pipelines.stages.train_export", fw, *args.models)
                hashes[name] = file_hashes(folder)
                print(f"[isa] {fw} {name}: done", file=sys.stderr, flush=True)
            run_stage(root, fw, HOST, "pipelines.stages.train_export", fw, *args.models)  # for the validate runs
            ratios = {m: statistics.median(p["samples_per_second"][m] / h["samples_per_second"][m]
                                           for h, p in zip(runs["host"], runs["pinned"], strict=True))
                      for m in args.models}
            results["frameworks"][fw] = {
                "differs_from_host": {name: differing(hashes["host"], h) for name, h in hashes.items()
                                      if name != "host"},
                "pinned_over_host_samples_per_second": ratios,
                "runs": runs,
            }
        if set(args.frameworks) == {"torch", "tf", "jax"}:
            validation: dict[str, str] = {}
            for name, variant in OPENBLAS.items():
                run_stage(root, "validation", variant, "pipelines.stages.validate")
                validation[name] = hashlib.sha256((root / "reports/validation.json").read_bytes()).hexdigest()
            results["validation_json_sha256"] = validation
        results["cpu"] = json.loads((root / MEASUREMENTS / "cpu.json").read_text())  # what the stages ran on
    out = REPO / MEASUREMENTS / "isa_pins.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"CPU: {results['cpu']['model']} ({', '.join(results['cpu']['isa'])})")
    for fw, r in results["frameworks"].items():
        for name, files in r["differs_from_host"].items():
            print(f"{fw:5} {name:20} files differing from the host run: {len(files)} {files[:4]}")
        print(f"{fw:5} pinned / host steady samples/s: "
              + ", ".join(f"{m} {v:.3f}" for m, v in r["pinned_over_host_samples_per_second"].items()))
    for name, digest in results.get("validation_json_sha256", {}).items():
        print(f"validate {name:24} validation.json {digest[:12]}")
    print(f"-> {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
