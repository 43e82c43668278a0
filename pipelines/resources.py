"""Resource probe: a process's threads, open file descriptors and resident memory, sampled over time.

A leak of threads or descriptors shows only over a run's length (one thread a step is harmless for a hundred
steps and fatal at Linux's default `pid_max` of 32,768), so a probe samples the process and every process below
it (a runner's child, a worker's child processes) with psutil on a thread of its own, and `summarize` judges the window:
"flat" when the peak of its second half exceeds the peak of its first half by at most BOUNDS. A process makes
its pools while it starts or at its first steps, which a window that starts early and runs long holds in its
first half; what it adds later, it adds per step or per request.

The bounds are stated for the method, before any run is measured: 4 threads and 4 descriptors (a lazily made
pool may still add a few; a thread a step over a half of 20 steps or more adds 10 or more), and resident memory
64 MiB or a tenth of the first half's peak, whichever is larger (allocators keep freed pages).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

MIB = 1024 * 1024
BOUNDS = {"threads": 4, "fds": 4}  # added by the second half over the first; rss: rss_bound()
RSS_BOUND_BYTES = 64 * MIB
RSS_BOUND_FRACTION = 0.1
INTERVAL_SECONDS = 0.2
RESOURCES = ("threads", "fds", "rss_bytes")


@dataclass(frozen=True)
class Sample:
    seconds: float  # since the probe started
    threads: int
    fds: int
    rss_bytes: int


def rss_bound(first_half_peak: int) -> int:
    return max(RSS_BOUND_BYTES, int(RSS_BOUND_FRACTION * first_half_peak))


def measure(pid: int) -> tuple[int, int, int] | None:
    """Threads, open descriptors and resident bytes of `pid` and its descendants; None once it is gone."""
    try:
        root = psutil.Process(pid)
        if root.status() == psutil.STATUS_ZOMBIE:  # ended, not yet reaped: nothing left to measure
            return None
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    threads = fds = rss = 0
    for process in processes:
        try:
            with process.oneshot():
                threads += process.num_threads()
                fds += process.num_fds()
                rss += process.memory_info().rss
        except psutil.Error:  # a child that ended between the listing and the reading
            continue
    return threads, fds, rss


class Probe:
    """Samples a process every `interval` seconds from `start()` until `stop()` or its end (a context manager)."""

    def __init__(self, pid: int, interval: float = INTERVAL_SECONDS) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[Sample] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rosetta-probe-{pid}", daemon=True)
        self._start = 0.0

    def start(self) -> Probe:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.samples

    def __enter__(self) -> Probe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while True:
            found = measure(self.pid)
            if found is None:
                return
            self.samples.append(Sample(time.monotonic() - self._start, *found))
            if self._done.wait(self.interval):
                return


def summarize(samples: list[Sample]) -> dict[str, Any]:
    """Counts at the start, half way and the end, each half's peak, what the second half added, and the
    verdict per resource and overall ("flat" or "grows"); "too short" with fewer than 4 samples."""
    if len(samples) < 4:
        return {"samples": len(samples), "verdict": "too short", "flat": None}
    half = len(samples) // 2
    first, second = samples[:half], samples[half:]
    record: dict[str, Any] = {"samples": len(samples), "seconds": samples[-1].seconds - samples[0].seconds,
                              "bounds": {**BOUNDS}, "resources": {}}
    grows = []
    for name in RESOURCES:
        values = [getattr(s, name) for s in samples]
        first_peak, second_peak = max(getattr(s, name) for s in first), max(getattr(s, name) for s in second)
        bound = rss_bound(first_peak) if name == "rss_bytes" else BOUNDS[name]
        added = second_peak - first_peak
        record["bounds"][name] = bound
        record["resources"][name] = {
            "start": values[0], "half_way": values[half], "end": values[-1], "peak": max(values),
            "first_half_peak": first_peak, "second_half_peak": second_peak, "added": added,
            "verdict": "flat" if added <= bound else "grows"}
        if added > bound:
            grows.append(name)
    record["flat"] = not grows
    record["verdict"] = "flat" if not grows else "grows: " + ", ".join(
        _added(name, record["resources"][name]["added"], record["bounds"][name]) for name in grows)
    return record


def _added(name: str, added: int, bound: int) -> str:
    if name == "rss_bytes":
        return f"memory +{added / MIB:.0f} MiB (bound {bound / MIB:.0f} MiB)"
    return f"{name} +{added} (bound {bound})"


def flat(record: dict[str, Any], names: tuple[str, ...] = ("threads", "fds")) -> bool:
    """Whether `names` stayed within their bounds in a summary (threads and descriptors by default)."""
    return record.get("flat") is not None and all(
        record["resources"][name]["verdict"] == "flat" for name in names)


def describe(record: dict[str, Any]) -> str:
    """One line: each resource at the start, half way, the end, and the verdict."""
    if record.get("flat") is None:
        return f"{record.get('samples', 0)} samples: too short to judge"
    parts = []
    for name in RESOURCES:
        r = record["resources"][name]
        scale, unit = (MIB, " MiB") if name == "rss_bytes" else (1, "")
        parts.append(f"{name.removesuffix('_bytes')} {r['start'] // scale}/{r['half_way'] // scale}/"
                     f"{r['end'] // scale}{unit} ({r['verdict']})")
    return f"{'; '.join(parts)} over {record['seconds']:.0f} s (start/half way/end)"

