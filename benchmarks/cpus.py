"""A benchmark worker's CPUs: as many as its thread count.

XLA sizes its thread pool (JAX's) by the CPUs a process may run on, and reads no thread-count flag
(pipelines/environments.py, `xla_flags`); torch and TF read the runner's variables as well. A worker that runs on
ROSETTA_THREADS of its CPUs then computes at that thread count in every framework.
"""

from __future__ import annotations

import os


def hold_to_thread_count() -> None:
    """Restrict this process (and the threads it starts) to the first ROSETTA_THREADS of its CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[: int(os.environ["ROSETTA_THREADS"])])
