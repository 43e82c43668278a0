"""Measurements of a run: timings, throughputs, latencies, resources. Kept out of the lineage on purpose.

They depend on the machine and its load, so they never repeat bit for bit; inside a DVC output they would change
every hash downstream. So stages and benchmarks write them under `measurements/`, git- and DVC-ignored and never a
stage's dependency or output (docs/lineage.md, 'Measurements are not lineage'), and every writer then regenerates
the aggregates from every record present (refresh; a benchmark runs `python -m pipelines.measurements`), so that
they are current whichever ran last: `timings.js`, which the report page loads to show them as this run's,
and `latency.csv` and `metrics/` for `dvc plots show` and `dvc metrics show` (top-level `plots:` and `metrics:` in
dvc.yaml). Each kind of record is described beside its path below; how each figure is measured:
benchmarks/README.md.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines import resources
from rosetta_common.io import dumps, write_text

ROOT = Path("measurements")
TIMINGS_JS = ROOT / "timings.js"  # loaded by reports/comparison/report.html as ../../measurements/timings.js
LATENCY_CSV = ROOT / "latency.csv"  # for `dvc plots show`
METRICS = ROOT / "metrics"  # one flat file per model and framework, for `dvc metrics show`
STAGES = ROOT / "stages"  # one record per stage: its start-up breakdown and phases
CPU = ROOT / "cpu.json"  # the CPU these measurements (and this run's last bits) came from
# The last training-throughput benchmark's table, which benchmarks/train_throughput.py (not a stage) writes for the
# report, our train() beside each framework's idiomatic loop; timings.js carries it:
# {"settings": {...}, "rows": [{"scale", "framework", "model", "samples_per_epoch", "epochs",
# "ours_samples_per_second", "idiomatic_samples_per_second", "ratio", "ratio_range": [lo, hi], "verdict", "why",
# "ours_first_epoch_seconds", "idiomatic_first_epoch_seconds", "idiomatic_loop"}, ...]}; the idiomatic figures are
# the fastest idiomatic loop's, `idiomatic_loop` its name ("idiomatic"; JAX also "idiomatic_linen"; absent in
# tables written before there was a choice). This file is the whole interface: pipelines
# never reads the benchmark's own output nor imports it.
THROUGHPUT_TABLE = ROOT / "throughput_table.json"
# The last deployment benchmark's record, written by benchmarks/deployment.py (per export format: size, cold start,
# latency, the environment it needs): {"settings": {...}, "rows": [{"model", "format", "framework", "env", "file",
# "bytes", "cold": {"interpreter_seconds", "imports_seconds", "load_seconds", "first_request_seconds",
# "total_seconds"}, "first_batch64_ms", "steady": {"1" | "64": {"median_ms", "p90_ms", "calls"}}, "max_rss_mib",
# "modules", "needs_model_code", "max_abs_vs_onnx", "repeats"}, ...], "environments": {env: {"folder", "bytes",
# "runtime_bytes", "runtime_wheels"}}, ...}; the report shows settings, rows and environments (timings.js).
DEPLOYMENT = ROOT / "deployment.json"
# The last serving load benchmark's record, written by benchmarks/serving_load.py: {"settings": {...}, "shares": "...",
# "machine": {..., "load_average": {"before", "after"}}, "rows": [{"model", "server", "protocol", "batch",
# "concurrency", "requests", "errors", "requests_per_second", "samples_per_second", "p50_ms", "p99_ms",
# "in_process_p50_ms", "overhead_ratio", "overhead_ms", "server_cpu_cores", "client_cpu_cores", ...}, ...], ...};
# the report shows settings, shares, machine and rows in its Serving section (timings.js).
SERVING_LOAD = ROOT / "serving_load.json"
# The resource probe's records (pipelines/resources.py), one per process group that was watched:
# resources/<name>.json = {"name", "what", "processes": {process: summarize()'s record}}, written by the
# train_dp stage (its workers) and benchmarks/serving_load.py (its servers under load); timings.js carries them.
RESOURCES = ROOT / "resources"
NOT_RUNS = (METRICS.name, STAGES.name, RESOURCES.name)  # folders under ROOT that hold no per-run record


# Per model and framework: the training, export and latency figures of one trained model, written by
# train_export@<framework> (`write`).
def record_path(model: str, framework: str, root: Path = ROOT) -> Path:
    return root / model / f"{framework}.json"


# Per stage: where its wall time went, start-up included (the runner, the interpreter, the imports, then each phase in
# order), so that every stage's start-up cost can be read after any run, and its threads, descriptors and memory from
# its start to its end (StageClock, `write_stage`).
def stage_path(stage: str, root: Path = ROOT) -> Path:
    return root / STAGES.name / f"{stage}.json"


def _read_records(paths: list[Path]) -> dict[Path, dict[str, Any]]:
    records = {}
    for path in paths:
        try:
            records[path] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a record being rewritten by a killed stage: the next writer replaces it
    return records


def read_all(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """"<model>/<framework>" -> its record, for every readable record under `root`."""
    found = [p for p in sorted(root.glob("*/*.json")) if p.parent.name not in NOT_RUNS]
    return {f"{p.parent.name}/{p.stem}": rec for p, rec in _read_records(found).items()}


def read_stages(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """Stage name -> its record, for every readable stage record under `root`."""
    return {p.stem: rec for p, rec in _read_records(sorted((root / STAGES.name).glob("*.json"))).items()}


def read_resources(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """Record name -> the resource probe's record, for every readable one under `root`."""
    return {p.stem: rec for p, rec in _read_records(sorted((root / RESOURCES.name).glob("*.json"))).items()}


def write_resources(name: str, what: str, processes: dict[str, dict[str, Any]], root: Path = ROOT) -> None:
    """Write the probe's summaries of one group of processes (a stage's workers, a benchmark's servers), then
    regenerate the aggregates."""
    write_text(root / RESOURCES.name / f"{name}.json", dumps({"name": name, "what": what, "processes": processes}))
    refresh(root)


def worker_resources_dir(stage: str, root: Path = ROOT) -> Path:
    """Where each worker of `stage` leaves its own probe record until the stage gathers them."""
    return root / RESOURCES.name / stage


def write_worker_resources(stage: str, rank: int, record: dict[str, Any], root: Path = ROOT) -> None:
    write_text(worker_resources_dir(stage, root) / f"worker{rank}.json", dumps(record))


def gather_worker_resources(stage: str, what: str, root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """The workers' probe records of `stage` as one record, "worker <rank>" -> summary (written, then returned)."""
    found = _read_records(sorted(worker_resources_dir(stage, root).glob("worker*.json"),
                                 key=lambda p: int(p.stem.removeprefix("worker"))))
    processes = {f"worker {p.stem.removeprefix('worker')}": rec for p, rec in found.items()}
    write_resources(stage, what, processes, root)
    return processes


def throughput_table(root: Path = ROOT) -> dict[str, Any] | None:
    """The last training-throughput benchmark's table (THROUGHPUT_TABLE) as the report shows it, or None if it
    has not run in this checkout (or its file is unreadable or not of that form)."""
    try:
        table = json.loads((root / THROUGHPUT_TABLE.name).read_text())
        settings, rows = table.get("settings", {}), table["rows"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(settings, dict) or not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return None
    return {"settings": settings, "rows": rows}


def deployment_table(root: Path = ROOT) -> dict[str, Any] | None:
    """The last deployment benchmark's settings, rows and environments (DEPLOYMENT) as the report shows them, or
    None if it has not run in this checkout (or its file is unreadable or not of that form)."""
    try:
        record = json.loads((root / DEPLOYMENT.name).read_text())
        settings, rows, environments = record.get("settings", {}), record["rows"], record.get("environments", {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if (not isinstance(settings, dict) or not isinstance(environments, dict) or not isinstance(rows, list)
            or not all(isinstance(r, dict) for r in rows)):
        return None
    return {"settings": settings, "rows": rows, "environments": environments}


def serving_load_table(root: Path = ROOT) -> dict[str, Any] | None:
    """The last serving load benchmark's settings, shares, machine and rows (SERVING_LOAD) as the report shows them,
    or None if it has not run in this checkout (or its file is unreadable or not of that form)."""
    try:
        record = json.loads((root / SERVING_LOAD.name).read_text())
        part = {key: record[key] for key in ("settings", "shares", "machine", "rows")}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(part["rows"], list) or not all(isinstance(r, dict) for r in part["rows"]):
        return None
    return part


# The instruction sets that decide which kernels oneDNN, MKL, XLA, OpenBLAS and ONNX Runtime's MLAS run (and so
# the last bits of what they compute), in the order a CPU gains them.
ISA_FLAGS = ("sse4_2", "avx", "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """This machine's CPU model, logical cores and the instruction sets above that it has (Linux; elsewhere the
    model from platform and no flags)."""
    import platform

    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break  # every core lists the same
    except OSError:
        pass
    return {"model": model, "logical_cores": os.cpu_count(), "isa": [f for f in ISA_FLAGS if f in flags],
            "machine": platform.machine()}


def headline(record: dict[str, Any]) -> dict[str, float]:
    """The few figures `dvc metrics show` prints for one run (few columns: the table stays readable)."""
    train = record.get("train", {})
    return {key: round(float(train[key]), 3) for key in ("train_seconds", "steady_samples_per_second") if key in train}


def refresh(root: Path = ROOT) -> None:
    """Regenerate timings.js, latency.csv and metrics/ from every record present (and the benchmark's table), and
    cpu.json: the CPU they were measured on."""
    records, stages, machine = read_all(root), read_stages(root), cpu()
    write_text(root / CPU.name, dumps(machine))
    write_text(root / TIMINGS_JS.name, "window.ROSETTA_MEASUREMENTS = " + json.dumps(records, sort_keys=True) + ";\n"
               + "window.ROSETTA_STAGES = " + json.dumps(stages, sort_keys=True) + ";\n"
               + "window.ROSETTA_CPU = " + json.dumps(machine, sort_keys=True) + ";\n"
               + "window.ROSETTA_THROUGHPUT = " + json.dumps(throughput_table(root), sort_keys=True) + ";\n"
               + "window.ROSETTA_DEPLOYMENT = " + json.dumps(deployment_table(root), sort_keys=True) + ";\n"
               + "window.ROSETTA_SERVING_LOAD = " + json.dumps(serving_load_table(root), sort_keys=True) + ";\n"
               + "window.ROSETTA_RESOURCES = " + json.dumps(read_resources(root), sort_keys=True) + ";\n")
    rows = ["case,native_over_onnx,native_ms,onnx_ms"]
    for key, rec in records.items():
        for r in rec.get("latency", {}).get("results", []):
            rows.append(f"{key}/batch {r['batch']},{r['native_over_onnx']:.4g},{r['native_median_ms']:.4g},"
                        f"{r['onnx_median_ms']:.4g}")
    write_text(root / LATENCY_CSV.name, "\n".join(rows) + "\n")
    for key, rec in records.items():
        write_text(root / METRICS.name / f"{key.replace('/', '-')}.json", dumps(headline(rec)))


def write(model: str, framework: str, record: dict[str, Any], root: Path = ROOT) -> None:
    """Write one model's measurements, then regenerate the aggregates from every record present."""
    write_text(record_path(model, framework, root), dumps(record))
    refresh(root)


def write_stage(record: dict[str, Any], root: Path = ROOT) -> None:
    """Write one stage's record (StageClock.record), then regenerate the aggregates."""
    write_text(stage_path(record["stage"], root), dumps(record))
    refresh(root)


# ---- where a stage's wall time goes ----------------------------------------------------------------------------


def process_started(pid: int | str = "self") -> float | None:
    """When a process started, on time.time()'s clock (from /proc, to the kernel's 10 ms tick); None where there is
    no /proc (not Linux) or the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot (fields[0] is field 3)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _runner_started() -> float | None:
    """The start of the runner that launched this process (pipelines.runner, local runtime), if it did: what the
    runner costs (an orchestrator interpreter, the environment check) is part of every framework stage."""
    parent = os.getppid()
    try:
        command = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return process_started(parent) if b"pipelines.runner" in command else None


# A test-only hook (tests/pipeline/test_lineage.py's kill test): hold a stage at a named point until it is killed,
# so that a kill lands at that moment whatever the machine's speed. ROSETTA_TEST_HOLD is "<stage>:<point>#<n>": hold
# the n-th process of that stage (train_export, never train_export@torch: which framework runs n-th is DVC's choice)
# that reaches the point, counted in the file ROSETTA_TEST_HOLD_COUNT. A point is a boundary of StageClock's phases:
# "after:<lap>" (when a lap ends; after:inputs is just before the framework import) or "before:<phase>" (a phase
# block starting; a model's phases match without the model: before:train is any model's training). Unset, it costs
# one dictionary look-up per phase and changes nothing the stage computes or writes.
HOLD = "ROSETTA_TEST_HOLD"
HOLD_COUNT = "ROSETTA_TEST_HOLD_COUNT"
HOLD_SECONDS = 600.0  # a hold nobody kills ends the stage with an error rather than hanging the test run


def _hold(stage: str, point: str) -> None:
    wanted = os.environ.get(HOLD)
    if not wanted:
        return
    where, _, nth = wanted.partition("#")
    want_stage, _, want_point = where.partition(":")
    kind, _, name = point.partition(":")
    if stage.split("@")[0] != want_stage or want_point not in (point, f"{kind}:{name.split('.', 1)[-1]}"):
        return
    counter = Path(os.environ[HOLD_COUNT])
    seen = counter.read_text().split() if counter.is_file() else []
    if str(os.getpid()) in seen:
        return  # this process already took its turn at this point (a later model reaching it again)
    seen.append(str(os.getpid()))
    counter.write_text("\n".join(seen) + "\n")  # stages run one at a time under DVC: no concurrent writer
    if len(seen) != int(nth or 1):
        return
    print(f"[rosetta] test hold: {stage} at {point} (pid {os.getpid()}), waiting to be killed", flush=True)
    time.sleep(HOLD_SECONDS)
    raise SystemExit(f"error: {HOLD}={wanted}: held {HOLD_SECONDS:.0f} s at {point} and nobody killed {stage}")


class StageClock:
    """Wall-clock breakdown of one stage process: the runner (when it launched us), the interpreter's own start,
    the imports before `main`, then named phases in order (`lap` ends the phase running since the last lap;
    `phase` times a block). `imports_started` is when our first stage module began importing
    (pipelines.stages.IMPORTS_STARTED)."""

    def __init__(self, stage: str, imports_started: float) -> None:
        self.stage = stage
        self.runner_started = _runner_started()
        self.process_started = process_started()
        self.imports_started = imports_started
        self.main_entered = self.last = time.time()
        self.phases: dict[str, float] = {}
        # The stage's threads, descriptors and memory from here to its record (pipelines/resources.py).
        self.probe = resources.Probe(os.getpid()).start()

    def lap(self, name: str) -> float:
        now = time.time()
        seconds = now - self.last
        self.phases[name] = self.phases.get(name, 0.0) + seconds
        _hold(self.stage, f"after:{name}")
        self.last = time.time()
        return seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        _hold(self.stage, f"before:{name}")
        self.last = time.time()
        try:
            yield
        finally:
            self.lap(name)

    def record(self, **extra: Any) -> dict[str, Any]:
        now = time.time()
        first = self.runner_started or self.process_started or self.imports_started
        startup: dict[str, float | None] = {
            "runner_seconds": (self.process_started - self.runner_started
                               if self.runner_started and self.process_started else None),
            "interpreter_seconds": (self.imports_started - self.process_started if self.process_started else None),
            "imports_seconds": self.main_entered - self.imports_started,
        }
        return {
            "stage": self.stage,
            "startup": {k: None if v is None else round(v, 4) for k, v in startup.items()},
            "phases": {k: round(v, 4) for k, v in self.phases.items()},
            "total_seconds": round(now - first, 4),
            "resources": resources.summarize(self.probe.stop()),
            **extra,
        }


if __name__ == "__main__":  # python -m pipelines.measurements: regenerate the aggregates (the benchmark runs it)
    refresh()
