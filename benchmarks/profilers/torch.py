"""torch.profiler over the CPU: each ATen operator's self time (its own work, not the operators it calls)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

from benchmarks.profilers import OpTime

_SESSION: list[profile] = []


def sync(model: Any) -> None:
    """Nothing to wait for: torch's CPU operators return when done."""


def start(folder: Path) -> None:
    session = profile(activities=[ProfilerActivity.CPU])
    session.start()
    _SESSION.append(session)


def stop(folder: Path) -> list[OpTime]:
    session = _SESSION.pop()
    session.stop()
    ops = [OpTime(event.key, event.self_cpu_time_total / 1e6, event.count) for event in session.key_averages()]
    return sorted((op for op in ops if op.seconds > 0), key=lambda op: -op.seconds)
