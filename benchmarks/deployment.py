"""Deployment comparison of a finished run's export formats: size, cold start, latency, and what each one needs.

    .venv/bin/python -m benchmarks.deployment                           # the cnn, 5 repeats
    .venv/bin/python -m benchmarks.deployment --models mlp cnn lstm --repeats 3 --calls 100 --threads 1

Which file to deploy depends on what serving it costs, so each format (pipelines/deployment_formats.FORMATS) is
measured as a deployment meets it: a fresh process of the format's own environment (benchmarks/deployment_worker.py)
imports what the format needs and nothing else, loads the file and answers, timed from the spawn; then its steady
latency at batch 1 and 64, its peak memory, and the environment's size on disk. Every figure is a median over
fresh processes, every case once per repeat in a rotated order, so the machine's load falls on all alike. A
benchmark, not a test: reported, never asserted. Run with the orchestrator's Python from the repository root (`-m`:
it imports pipelines); it writes measurements/deployment.json and regenerates measurements/timings.js for the
report's Deployment section. The method in full and the latest figures: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import stat
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from pipelines import deployment_formats
from pipelines.deployment_formats import FORMATS
from rosetta_common.io import write_text
from rosetta_common.registry import of_reading

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "measurements" / "deployment.json"
WORKER = REPO / "benchmarks" / "deployment_worker.py"
FRAMEWORKS = ("torch", "tf", "jax")
MODELS = of_reading("images")  # the registry's image models (the text model reads token ids)
FORMAT_NAMES = tuple(f.name for f in FORMATS)
PHASES = ("interpreter_seconds", "imports_seconds", "load_seconds", "first_request_seconds")


def tree_bytes(path: Path) -> int:
    """Bytes of a file, or of every regular file under a folder, each inode once (hard links: one copy on disk) and
    symlinks not followed (a venv's links point at the interpreter outside it): what `du -sb` counts."""
    if path.is_symlink():
        return 0
    if path.is_file():
        return path.stat().st_size
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, _, names in os.walk(path):  # os.walk does not descend into symlinked folders
        for name in names:
            info = (Path(folder) / name).lstat()
            key = (info.st_dev, info.st_ino)
            if not stat.S_ISREG(info.st_mode) or key in seen:  # regular files only, once each
                continue
            seen.add(key)
            total += info.st_size
    return total


def record_bytes(record: str) -> int:
    """The installed size of one wheel: the sum of the sizes its RECORD lists (path, hash, size; the RECORD itself
    and .pyc files written later have no size there)."""
    return sum(int(row[2]) for row in csv.reader(io.StringIO(record)) if len(row) >= 3 and row[2].isdigit())


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def distributions_bytes(site_packages: Path, names: tuple[str, ...]) -> dict[str, int]:
    """{distribution: installed bytes} for each of `names` installed in site_packages (absent ones left out)."""
    wanted = {_normalized(n): n for n in names}
    found = {}
    for info in sorted(site_packages.glob("*.dist-info")):
        dist = _normalized(info.name[: -len(".dist-info")].rsplit("-", 1)[0])
        if dist in wanted and (info / "RECORD").is_file():
            found[wanted[dist]] = record_bytes((info / "RECORD").read_text())
    return found


def quantile(values: list[float], q: float) -> float:
    """The q-quantile, linear between the order statistics (numpy's default): p90 of 50 calls is between the 45th
    and the 46th."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def phases(spawned: float, result: dict[str, Any]) -> dict[str, float]:
    """One cold start's phases from the worker's readings (one clock) and the parent's at the spawn."""
    figures = {
        "interpreter_seconds": result["started"] - spawned,
        "imports_seconds": result["imports_done"] - result["started"],
        "load_seconds": result["load_done"] - result["imports_done"],
        "first_request_seconds": result["first_request_seconds"],
    }
    figures["total_seconds"] = sum(figures[p] for p in PHASES)
    return figures


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of one (model, format): each phase, the batch-64 first request, and per batch size
    the median and p90 of its steady calls (each repeat's own, then the median of those)."""
    cold = {key: statistics.median(run["phases"][key] for run in runs) for key in (*PHASES, "total_seconds")}
    steady = {}
    for batch in ("1", "64"):
        per_run = [run["steady_seconds"][batch] for run in runs]
        steady[batch] = {"median_ms": 1e3 * statistics.median(statistics.median(t) for t in per_run),
                         "p90_ms": 1e3 * statistics.median(quantile(t, 0.9) for t in per_run),
                         "calls": len(per_run[0])}
    return {
        "cold": cold,
        "cold_total_per_repeat": [run["phases"]["total_seconds"] for run in runs],
        "first_batch64_ms": 1e3 * statistics.median(run["first_batch64_seconds"] for run in runs),
        "steady": steady,
        "max_rss_mib": statistics.median(run["max_rss_kib"] for run in runs) / 1024,
        "modules": runs[0]["modules"],
        "repeats": len(runs),
    }


def cases(artifacts: Path, models: list[str], formats: list[str]) -> list[dict[str, Any]]:
    """Every (model, format, whose export) to measure, ONNX once per framework; an error line if a file is missing."""
    found = []
    for model in models:
        for fmt in FORMATS:
            if fmt.name not in formats:
                continue
            for framework in (FRAMEWORKS if fmt.framework == "*" else (fmt.framework,)):
                path = artifacts / framework / model / fmt.file
                if not path.exists():
                    raise SystemExit(f"error: {path}: missing; --artifacts must be a finished run's folder "
                                     f"(artifacts/<framework>/<model>/{fmt.file} for every --models and --formats)")
                found.append({"model": model, "format": fmt.name, "framework": framework, "env": fmt.env,
                              "path": path})
    return found


def case_key(case: dict[str, Any]) -> str:
    return f"{case['model']}/{case['format']}/{case['framework']}"


def interleaved(items: list[Any], repeat: int) -> list[Any]:
    """The run order of one repeat: rotated by the repeat's index, so each case takes each place in turn."""
    shift = repeat % len(items) if items else 0
    return items[shift:] + items[:shift]


def built_environment(env: str) -> Path:
    """The environment's folder, built by the runner (`python -m pipelines.runner --setup`); spawned directly, not
    through the runner, so that its own interpreter start is not counted as the format's."""
    from pipelines.environments import envs_dir

    folder = envs_dir() / f"{env}-{os.environ.get('ROSETTA_VARIANT', 'cpu')}"
    if not (folder / "bin" / "python").exists():
        raise SystemExit(f"error: environment {folder.name} is not built; build it with "
                         f"`.venv/bin/python -m pipelines.runner --setup {env}`")
    return folder


def run_case(case: dict[str, Any], images: Path, calls: int, scratch: Path, environments: dict[str, Any]) -> dict:
    env_dir = environments.setdefault(case["env"], built_environment(case["env"]))
    tag = case_key(case).replace("/", "-")
    result_path, logits_path = scratch / f"{tag}.json", scratch / f"{tag}.npy"
    command = [str(env_dir / "bin" / "python"), str(WORKER), case["format"], str(case["path"]), str(images),
               str(calls), str(result_path), str(logits_path)]
    from pipelines.environments import stage_environment

    environment = stage_environment(case["env"], env_dir)  # the runner's variables, exactly
    spawned = time.monotonic()  # the clock the worker reads first (CLOCK_MONOTONIC: the same in every process)
    done = subprocess.run(command, env=environment, cwd=REPO, check=False, capture_output=True, text=True)
    if done.returncode != 0 or not result_path.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: {case_key(case)}: the worker exited {done.returncode}: {last}")
    result = json.loads(result_path.read_text())
    result["phases"] = phases(spawned, result)
    result["logits_file"] = str(logits_path)
    return result


def logits_difference(rows: list[dict[str, Any]], logits: dict[str, Any]) -> None:
    """A sanity figure, not a check: each row's batch-64 logits against its framework's ONNX file's (the same trained
    model; validate judges parity). Rows without an ONNX row of their framework get none."""
    import numpy as np

    for row in rows:
        reference = logits.get(f"{row['model']}/onnx/{row['framework']}")
        mine = logits.get(case_key(row))
        row["max_abs_vs_onnx"] = (None if reference is None or mine is None or row["format"] == "onnx"
                                  else float(np.max(np.abs(mine.astype(np.float64) - reference))))


def keras_classes(path: Path) -> list[str]:
    """The registered classes a .keras file names (its config.json, read as JSON from the zip: no pickle): the
    Python code that must be importable to load it."""
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = node.get("registered_name")
            if isinstance(name, str) and ">" in name:  # "package>Class": a registered custom class
                found.add(name)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    return sorted(found)


def environment_sizes(environments: dict[str, Path]) -> dict[str, dict[str, Any]]:
    sizes = {}
    for env, env_dir in sorted(environments.items()):
        site = next(iter(sorted((env_dir / "lib").glob("python3*/site-packages"))), env_dir)
        runtime = {name for fmt in FORMATS if fmt.env == env for name in fmt.distributions}
        wheels = distributions_bytes(site, tuple(sorted(runtime)))
        sizes[env] = {"folder": f".envs/{env_dir.name}", "bytes": tree_bytes(env_dir), "runtime_wheels": wheels,
                      "runtime_bytes": sum(wheels.values())}
    return sizes


def build_rows(measured: dict[str, list[dict[str, Any]]], case_list: list[dict[str, Any]],
               artifacts: Path) -> list[dict[str, Any]]:
    rows = []
    for case in case_list:
        fmt = deployment_formats.by_name(case["format"])
        row = {"model": case["model"], "format": case["format"], "framework": case["framework"], "env": case["env"],
               "file": str(case["path"].relative_to(artifacts)), "bytes": tree_bytes(case["path"]),
               **summarize(measured[case_key(case)])}
        row["needs_model_code"] = any(m.startswith("rosetta_") and m != "rosetta_common" for m in row["modules"])
        if fmt.name == "keras":
            row["registered_classes"] = keras_classes(case["path"])
        rows.append(row)
    return rows


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def table(rows: list[dict[str, Any]], environments: dict[str, dict[str, Any]]) -> str:
    header = ("model", "format", "export of", "size", "interpreter s", "imports s", "load s", "1st request ms",
              "cold total s", "1st batch-64 ms", "b1 median / p90 ms", "b64 median / p90 ms", "peak RSS",
              "environment (runtime wheels)", "model code", "max abs vs ONNX")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        env = environments.get(r["env"], {})
        cold, s1, s64 = r["cold"], r["steady"]["1"], r["steady"]["64"]
        diff = r.get("max_abs_vs_onnx")
        lines.append("| " + " | ".join([
            r["model"], r["format"], r["framework"], _size(r["bytes"]), f"{cold['interpreter_seconds']:.2f}",
            f"{cold['imports_seconds']:.2f}", f"{cold['load_seconds']:.2f}",
            f"{1e3 * cold['first_request_seconds']:.1f}", f"**{cold['total_seconds']:.2f}**",
            f"{r['first_batch64_ms']:.1f}", f"{s1['median_ms']:.3f} / {s1['p90_ms']:.3f}",
            f"{s64['median_ms']:.3f} / {s64['p90_ms']:.3f}", _size(r["max_rss_mib"] * 2**20),
            f"{r['env']} {_size(env.get('bytes', 0))} ({_size(env.get('runtime_bytes', 0))})",
            "yes" if r["needs_model_code"] else "no", "—" if diff is None else f"{diff:.1e}",
        ]) + " |")
    lines += ["", "| format | needs Python to serve | needs the model's code | loaded by | Rosetta serves it with |",
              "|---|---|---|---|---|"]
    lines += [f"| {f.name} | {f.python} | {f.model_code} | {f.servers} | {f.rosetta} |" for f in FORMATS]
    lines += ["", "Not measured:"] + [f"- {k}: {v}" for k, v in deployment_formats.NOT_MEASURED.items()]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts",
                        help="a finished run's folder (default: artifacts)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["cnn"])
    parser.add_argument("--formats", nargs="+", choices=FORMAT_NAMES, default=list(FORMAT_NAMES))
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per case, interleaved (default 5)")
    parser.add_argument("--calls", type=int, default=50, help="steady calls per batch size per process (default 50)")
    parser.add_argument("--threads", default=None,
                        help="ROSETTA_THREADS for the workers (default: the runner's, 2, as the servers run)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    for name in ("repeats", "calls"):
        value = getattr(args, name)
        if value < 1:
            raise SystemExit(f"error: --{name} {value} is not allowed; it must be a whole number, 1 or more")
    if args.threads is not None and (not args.threads.isdigit() or int(args.threads) < 1):
        raise SystemExit(f"error: --threads {args.threads!r} is not allowed; it must be a whole number, 1 or more")
    if not args.artifacts.is_dir():
        raise SystemExit(f"error: --artifacts {args.artifacts}: not a folder; allowed: a finished run's artifacts "
                         "folder (artifacts/<framework>/<model>/...)")
    return args


def test_images(count: int = 64) -> Any:
    """The first test images of the run's data (data/prepared/test.npz), as the latency measurement takes them."""
    import numpy as np

    path = REPO / "data" / "prepared" / "test.npz"
    try:
        with np.load(path, allow_pickle=False) as data:
            images = data["images"]
    except (OSError, KeyError) as error:
        raise SystemExit(f"error: {path}: no test images ({error}); run the data stage first") from None
    reps = -(-count // len(images))
    return np.ascontiguousarray(np.concatenate([images] * reps)[:count], dtype=np.float32)


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    args = parse_args(argv)
    if args.threads is not None:  # the runner's pins read it (pipelines.environments.thread_environment)
        os.environ["ROSETTA_THREADS"] = args.threads
    started = time.perf_counter()
    artifacts = args.artifacts.resolve()
    case_list = cases(artifacts, args.models, args.formats)
    measured: dict[str, list[dict[str, Any]]] = {case_key(c): [] for c in case_list}
    environments: dict[str, Path] = {}
    logits: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rosetta-deployment-") as scratch:
        images = Path(scratch) / "images.npy"
        np.save(images, test_images(), allow_pickle=False)
        for repeat in range(args.repeats):
            for case in interleaved(case_list, repeat):
                result = run_case(case, images, args.calls, Path(scratch), environments)
                measured[case_key(case)].append(result)
                logits[case_key(case)] = np.load(result["logits_file"], allow_pickle=False)
                print(f"[deployment] repeat {repeat + 1}/{args.repeats} {case_key(case)}: cold start "
                      f"{result['phases']['total_seconds']:.2f} s", file=sys.stderr, flush=True)
    rows = build_rows(measured, case_list, artifacts)
    logits_difference(rows, logits)
    env_sizes = environment_sizes(environments)
    report = table(rows, env_sizes)
    print(report)
    from pipelines.measurements import cpu

    write_text(args.out, json.dumps({
        "what": "per export format: size, cold start in a fresh process (interpreter, imports, load, first request), "
                "steady latency at batch 1 and 64, the environment it needs; medians over interleaved repeats",
        "settings": {"models": args.models, "formats": args.formats, "repeats": args.repeats, "calls": args.calls,
                     "threads": os.environ.get("ROSETTA_THREADS", "2"), "clock": "time.monotonic (CLOCK_MONOTONIC)",
                     "file_cache": "warm after the first repeat"},
        "machine": {**cpu(), "platform": platform.platform(), "load_average_at_end": list(os.getloadavg())},
        "rows": rows, "environments": env_sizes,
        "facts": [vars(f) for f in FORMATS], "not_measured": deployment_formats.NOT_MEASURED,
        "table": report, "seconds": time.perf_counter() - started,
    }, indent=1) + "\n")  # atomically: a killed run leaves the last complete record
    if args.out.resolve() == OUT.resolve():  # the report page's copy of the figures (timings.js)
        subprocess.run([sys.executable, "-m", "pipelines.measurements"], cwd=REPO, check=True)
    print(f"\nwrote {args.out} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
