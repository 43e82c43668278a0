"""JAX's profiler (jax.profiler.start_trace): the XSpace it writes, read with jax.profiler.ProfileData; each
XLA-compiled instruction's run is an event with an `hlo_op` statistic (and `hlo_module`, its program)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
from flax import nnx

from benchmarks.profilers import OpTime, summed


def sync(model: Any) -> None:
    """Wait for the steps dispatched so far (JAX's dispatch runs ahead of its computation): the model holds the
    state after them."""
    jax.block_until_ready(nnx.state(model))


def start(folder: Path) -> None:
    jax.profiler.start_trace(str(folder))


def stop(folder: Path) -> list[OpTime]:
    jax.profiler.stop_trace()
    (path,) = folder.glob("plugins/profile/*/*.xplane.pb")
    events = []
    for plane in jax.profiler.ProfileData.from_file(str(path)).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    events.append((str(stats.get("hlo_module", "")), event.name, event.duration_ns / 1e9))
    return summed(events)
