"""TF's profiler (tf.profiler.experimental): the XSpace it writes, read with its own schema (XPlane protobuf); each
XLA-compiled instruction's run is an event with an `hlo_op` statistic (and `hlo_module`, its program)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from benchmarks.profilers import OpTime, summed


def module_name(plane: xplane_pb2.XPlane, stat: xplane_pb2.XStat | None) -> str:
    """A statistic's text: its own string, or the plane's string it refers to."""
    if stat is None:
        return ""
    return stat.str_value or plane.stat_metadata[stat.ref_value].name


def sync(model: Any) -> None:
    """Nothing to wait for: fit's call has returned, its steps done (StepLoss's rows read)."""


def start(folder: Path) -> None:
    tf.profiler.experimental.start(str(folder))


def stop(folder: Path) -> list[OpTime]:
    tf.profiler.experimental.stop()
    (path,) = folder.glob("plugins/profile/*/*.xplane.pb")
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    events = []
    for plane in space.planes:
        names = {key: stat.name for key, stat in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                stats = {names.get(stat.metadata_id): stat for stat in event.stats}
                if "hlo_op" in stats:
                    events.append((module_name(plane, stats.get("hlo_module")),
                                   plane.event_metadata[event.metadata_id].name, event.duration_ps / 1e12))
    return summed(events)
