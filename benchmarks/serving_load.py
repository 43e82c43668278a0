"""Serving load: the four model servers under closed-loop load on loopback, beside the same export called in process.

    .venv/bin/python benchmarks/serving_load.py                  # cnn, all four, V2 REST and gRPC
    .venv/bin/python benchmarks/serving_load.py --models mlp cnn --servers torch onnx --protocols v2-rest \
        --concurrency 1 4 --batches 1 --max-requests 200 --max-seconds 2
    .venv/bin/python benchmarks/serving_load.py --models mlp --concurrency 1 4 --batches 1 --max-requests 2500 \
        --max-seconds 600 --bad-every 10      # 10,000 requests per server, a tenth of them bad: resources flat?

It shows what serving a prediction costs beyond the model's own call, and whether the servers hold up under a burst:
on a finished run it starts the servers once, times each server's own model class in process, then drives them
side by side, per protocol, batch and concurrency, with a closed-loop client that checks every answer, sampling each
server's threads, descriptors and memory meanwhile. A benchmark, not a test: reported, never asserted (it exits 1
if a request failed). It writes measurements/serving_load.json and regenerates measurements/timings.js for the
report's Serving section. Method and latest figures: benchmarks/README.md, "serving_load.py".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "measurements" / "serving_load.json"  # pipelines.measurements.SERVING_LOAD
PROTOCOLS = ("v2-rest", "v2-grpc")
DEFAULT_MODELS = ("cnn",)
DEFAULT_CONCURRENCY = (1, 4, 16)
DEFAULT_BATCHES = (1, 64)
# Per server and cell (protocol x batch x concurrency), split over the rounds: 4 s keeps the default run (12 cells x
# 4 servers) near 3 minutes of load; 1,000 requests bound the fast cells (batch 1 answers in ~2 ms at C=1).
MAX_REQUESTS, MAX_SECONDS, ROUNDS = 1000, 4.0, 2
# One thread per runtime, servers and in-process calls alike (the serve stage's are the runner's, 2): with the client
# on the same 2 cores, a 2-thread OpenMP/Eigen pool stalls at every barrier whose other thread is descheduled (torch's
# cnn at batch 1 took 130 ms a call in process on 2 threads under load 8, where it takes well under a millisecond).
DEFAULT_THREADS = "1"


def percentiles(values: Sequence[float]) -> tuple[float | None, float | None]:
    """p50 and p99 (numpy's linear interpolation between the closest ranks); None for no values."""
    if not values:
        return None, None
    p50, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50, 99])
    return float(p50), float(p99)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(slices: list[dict[str, Any]], in_process: dict[tuple[str, int], dict[str, Any]],
              model: str) -> list[dict[str, Any]]:
    """One row per server, protocol, batch and concurrency, from the client's slices (every round pooled)."""
    cells: dict[tuple[str, str, int, int], list[dict[str, Any]]] = {}
    for found in slices:
        cells.setdefault((found["protocol"], found["batch"], found["concurrency"], found["server"]), []).append(found)
    rows = []
    for (protocol, batch, concurrency, server), parts in sorted(cells.items()):
        latencies = [x for part in parts for x in part["latencies_ms"]]
        seconds = sum(part["seconds"] for part in parts)
        p50, p99 = percentiles(latencies)
        inside = in_process.get((server, batch), {})
        server_cpu = [part["server_cpu_seconds"] for part in parts]
        rows.append({
            "model": model, "server": server, "protocol": protocol, "batch": batch, "concurrency": concurrency,
            "requests": len(latencies), "refused": sum(part.get("refused", 0) for part in parts),
            "errors": sum(part["errors"] for part in parts),
            "error_examples": list(dict.fromkeys(e for part in parts for e in part["error_examples"]))[:5],
            "seconds": seconds,
            "requests_per_second": len(latencies) / seconds if seconds else None,
            "samples_per_second": len(latencies) * batch / seconds if seconds else None,
            "rounds_requests_per_second": [len(p["latencies_ms"]) / p["seconds"] if p["seconds"] else None
                                           for p in sorted(parts, key=lambda p: p["round"])],
            "p50_ms": p50, "p99_ms": p99,
            "in_process_p50_ms": inside.get("p50_ms"), "in_process_p99_ms": inside.get("p99_ms"),
            "overhead_ratio": _ratio(p50, inside.get("p50_ms")),
            "overhead_ms": p50 - inside["p50_ms"] if p50 is not None and inside.get("p50_ms") is not None else None,
            "server_cpu_cores": (sum(server_cpu) / seconds if seconds and None not in server_cpu else None),
            "client_cpu_cores": sum(part["client_cpu_seconds"] for part in parts) / seconds if seconds else None,
        })
    order = {name: i for i, name in enumerate(dict.fromkeys(s["server"] for s in slices))}
    protocols = {name: i for i, name in enumerate(PROTOCOLS)}
    rows.sort(key=lambda r: (protocols.get(r["protocol"], 9), r["batch"], r["concurrency"], order[r["server"]]))
    return rows


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table: the servers of one cell next to each other."""
    header = ("model", "protocol", "batch", "C", "server", "req/s", "samples/s", "p50 ms", "p99 ms",
              "in-process p50 ms", "p50 / in-process", "p50 - in-process ms", "errors", "server cores",
              "client cores")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["model"], r["protocol"], str(r["batch"]), str(r["concurrency"]), r["server"],
            _fmt(r["requests_per_second"], 0), _fmt(r["samples_per_second"], 0), _fmt(r["p50_ms"], 2),
            _fmt(r["p99_ms"], 2), _fmt(r["in_process_p50_ms"], 3),
            "-" if r["overhead_ratio"] is None else f"{r['overhead_ratio']:,.1f}x", _fmt(r["overhead_ms"], 2),
            f"**{r['errors']}**" if r["errors"] else "0", _fmt(r["server_cpu_cores"], 2),
            _fmt(r["client_cpu_cores"], 2),
        ]) + " |")
    return "\n".join(lines)


def fail(message: str) -> SystemExit:
    return SystemExit(f"error: {message}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from pipelines.serving.servers import SERVERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts", help="a finished run's artifacts")
    parser.add_argument("--data", type=Path, default=REPO / "data" / "prepared", help="its prepared data (test.npz)")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="default: %(default)s")
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), help=f"any of {', '.join(SERVERS)}")
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), help=f"any of {', '.join(PROTOCOLS)}")
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(DEFAULT_CONCURRENCY), metavar="C")
    parser.add_argument("--batches", nargs="+", type=int, default=list(DEFAULT_BATCHES), metavar="N",
                        help="batch sizes: the first N test images (default: %(default)s)")
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS,
                        help="counted requests per server and cell, over all rounds (default %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=MAX_SECONDS,
                        help="seconds per server and cell, over all rounds (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns of every server per cell (default 2)")
    parser.add_argument("--bad-every", type=int, default=0, metavar="N",
                        help="every Nth request of a client worker is a bad one, to be refused (default: none)")
    parser.add_argument("--onnx-from", default="torch", help="whose model.onnx the onnx server serves")
    parser.add_argument("--threads", default=DEFAULT_THREADS,
                        help="ROSETTA_THREADS of the servers and the in-process calls (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    for flag, values, allowed in (("--servers", args.servers, SERVERS), ("--protocols", args.protocols, PROTOCOLS)):
        for value in values:
            if value not in allowed:
                raise fail(f"{flag} {value}: unknown; allowed: {', '.join(allowed)}")
    for flag, values in (("--concurrency", args.concurrency), ("--batches", args.batches)):
        for value in values:
            if not 1 <= value <= 256:
                raise fail(f"{flag} {value}: not allowed; allowed: 1 to 256")
    if args.max_requests < args.rounds or args.rounds < 1:
        raise fail(f"--max-requests {args.max_requests}, --rounds {args.rounds}: not allowed; allowed: rounds >= 1 "
                   "and at least one request per round")
    if not args.threads.isdigit() or not 1 <= int(args.threads) <= 64:
        raise fail(f"--threads {args.threads}: not allowed; allowed: a whole number from 1 to 64")
    if not 0 <= args.bad_every <= 1000 or args.bad_every == 1:
        raise fail(f"--bad-every {args.bad_every}: not allowed; allowed: 0 (none) or 2 to 1000")
    if not 0 < args.max_seconds <= 600:
        raise fail(f"--max-seconds {args.max_seconds:g}: not allowed; allowed: more than 0, at most 600")
    return args


def batches(data: Path, sizes: Sequence[int], scratch: Path) -> dict[str, str]:
    """Each batch size's first test images as a .npy in scratch (the workers and the client read them)."""
    test = data / "test.npz"
    if not test.is_file():
        raise fail(f"--data {data}: {test.name} is missing (run dvc repro first)")
    with np.load(test, allow_pickle=False) as found:
        images = np.ascontiguousarray(found["images"], dtype=np.float32)
    paths = {}
    for size in sizes:
        if size > len(images):
            raise fail(f"--batches {size}: the test split has {len(images)} images; allowed: at most that")
        paths[str(size)] = str(scratch / f"batch{size}.npy")
        np.save(paths[str(size)], images[:size])
    return paths


def in_environment(environment: str, module: str, job: dict[str, Any], scratch: Path, name: str) -> dict[str, Any]:
    """Run `python -m module JOB RESULT` in an environment with the variables its server got (stage_environment:
    the same threads and instruction-set pins); its result."""
    from pipelines.environments import envs_dir, stage_environment

    env_dir = envs_dir() / f"{environment}-{os.environ.get('ROSETTA_VARIANT', 'cpu')}"
    job_path, result_path = scratch / f"{name}-job.json", scratch / f"{name}-result.json"
    job_path.write_text(json.dumps(job))
    code = subprocess.run([str(env_dir / "bin" / "python"), "-m", module, str(job_path), str(result_path)],
                          cwd=REPO, env=stage_environment(environment, env_dir), check=False).returncode
    if code != 0 or not result_path.is_file():
        raise fail(f"{module} ({name}, {environment} environment) exited with code {code} (its reason is above)")
    return json.loads(result_path.read_text())


def measure_in_process(servers: list[Any], model: str, batch_paths: dict[str, str],
                       scratch: Path) -> dict[tuple[str, int], dict[str, Any]]:
    from pipelines.serving.servers import SERVERS

    found = {}
    for server in servers:
        environment, module = SERVERS[server.name]
        job = {"module": module, "artifacts": str(server.artifacts.resolve()), "model": model,
               "batches": batch_paths}
        print(f"[serving_load] in process: {server.name} {model}", file=sys.stderr, flush=True)
        result = in_environment(environment, "benchmarks.serving_load_inprocess", job, scratch,
                                f"inprocess-{server.name}-{model}")
        for size, timed in result.items():
            p50, p99 = percentiles(timed["times_ms"])
            found[(server.name, int(size))] = {"p50_ms": p50, "p99_ms": p99, "calls": len(timed["times_ms"])}
    return found


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    from pipelines import resources
    from pipelines.serving import servers as serving

    batch_paths = batches(args.data, args.batches, scratch)
    for model in args.models:
        for name in args.servers:
            folder = serving.served_folder(name, args.artifacts, args.onnx_from) / model
            if not folder.is_dir():
                raise fail(f"--models {model}: {folder} is missing; allowed: a model of the finished run")
    rows, in_process_rows, warmup_errors, probed = [], [], {}, {}
    load = {"before": os.getloadavg()}
    started = time.perf_counter()
    with serving.running(args.servers, args.artifacts, args.models, onnx_from=args.onnx_from,
                         log_dir=scratch / "logs") as servers:
        ready = time.perf_counter() - started
        print(f"[serving_load] {', '.join(args.servers)} ready in {ready:.0f} s", file=sys.stderr, flush=True)
        for model in args.models:
            in_process = measure_in_process(servers, model, batch_paths, scratch)
            in_process_rows += [{"model": model, "server": s, "batch": b, **v} for (s, b), v in in_process.items()]
            job = {"servers": {s.name: {"url": s.url, "grpc": s.grpc_target, "pid": s.process.pid} for s in servers},
                   "model": model, "batches": batch_paths, "protocols": args.protocols,
                   "concurrency": args.concurrency, "max_requests": args.max_requests,
                   "max_seconds": args.max_seconds, "rounds": args.rounds, "bad_every": args.bad_every}
            # Each server's threads, descriptors and memory while the client runs (pipelines/resources.py).
            probes = {s.name: resources.Probe(s.process.pid).start() for s in servers}
            try:
                result = in_environment("validation", "benchmarks.serving_load_client", job, scratch,
                                        f"client-{model}")
            finally:
                for name, probe in probes.items():
                    probed[f"{name} ({model})"] = resources.summarize(probe.stop())
            warmup_errors[model] = {k: v for k, v in result["warmup_errors"].items() if v}
            rows += summarize(result["slices"], in_process, model)
    load["after"] = os.getloadavg()
    return {"rows": rows, "in_process": in_process_rows, "warmup_errors": warmup_errors, "load_average": load,
            "ready_seconds": ready, "resources": probed}


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))  # run as a script: pipelines and rosetta_common from this checkout
    args = parse_args(argv)
    from pipelines.measurements import cpu, write_resources
    from pipelines.resources import describe
    from rosetta_common.io import write_text

    started = time.perf_counter()
    # The servers and the in-process workers take their thread pins from it (pipelines.environments); put back after,
    # for a caller that goes on (a test).
    previous = os.environ.get("ROSETTA_THREADS")
    os.environ["ROSETTA_THREADS"] = args.threads
    try:
        with tempfile.TemporaryDirectory(prefix="rosetta-serving-load-") as scratch:
            found = run(args, Path(scratch))
    finally:
        if previous is None:
            os.environ.pop("ROSETTA_THREADS", None)
        else:
            os.environ["ROSETTA_THREADS"] = previous
    report = table(found["rows"])
    cores = os.cpu_count()
    shares = (f"The client and the {len(args.servers)} servers share this machine's {cores} cores "
              "(server cores and client cores: CPU seconds over wall seconds).")
    print(report)
    print(shares)
    for name, record in found["resources"].items():
        print(f"{name}: {describe(record)}")
    errors = sum(r["errors"] for r in found["rows"])
    if errors or any(found["warmup_errors"].values()):
        print(f"errors: {errors} counted requests failed; warm-up failures: {found['warmup_errors']}")
    settings = {"models": args.models, "servers": args.servers, "protocols": args.protocols,
                "concurrency": args.concurrency, "batches": args.batches, "max_requests": args.max_requests,
                "max_seconds": args.max_seconds, "rounds": args.rounds, "onnx_from": args.onnx_from,
                "threads": args.threads, "bad_every": args.bad_every,
                "bounds": f"per server and cell: at most {args.max_requests} counted requests and "
                          f"{args.max_seconds:g} s, over {args.rounds} rounds (whichever first; requests in flight "
                          "at the time bound finish)",
                "warmup": "10 requests per server, protocol and batch before any cell; 2 per worker per slice; "
                          "not counted",
                "latency": "from sending a request to having read its whole answer (client side, ms)"}
    write_text(args.out, json.dumps({
        "what": "closed-loop load on the model servers on 127.0.0.1, side by side in one run, against the same "
                "export called in process",
        "settings": settings, "shares": shares,
        "machine": {**cpu(), "load_average": found["load_average"]},
        "ready_seconds": found["ready_seconds"], "in_process": found["in_process"],
        "warmup_errors": found["warmup_errors"], "rows": found["rows"], "table": report,
        "resources": found["resources"],
        "seconds": time.perf_counter() - started,
    }, indent=1, allow_nan=False) + "\n")
    if args.out.resolve() == OUT:  # the report's Serving section shows it, through timings.js
        write_resources("serving_load", f"model servers under load: {', '.join(args.servers)}, "
                        f"{', '.join(args.protocols)}; bad requests: every {args.bad_every or 'none'}",
                        found["resources"], root=OUT.parent)
        subprocess.run([sys.executable, "-m", "pipelines.measurements"], cwd=REPO, check=True)
    print(f"wrote {args.out} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
