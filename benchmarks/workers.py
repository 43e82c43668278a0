"""A benchmark's worker: one framework's measurement in that framework's environment, through the pipeline's runner.

The job goes in as JSON, the result comes back as JSON (no pickle); the worker runs at the job's thread count
(ROSETTA_THREADS, which the worker holds to as many CPUs: benchmarks/cpus.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_worker(framework: str, module: str, job: dict[str, Any], threads: int, scratch: Path,
               tag: str) -> dict[str, Any]:
    """Run `python -m <module> <job.json> <result.json>` in `framework`'s environment; its result, or one line
    naming the worker that failed (its own reason is printed above it)."""
    job_path, result_path = scratch / f"{tag}-job.json", scratch / f"{tag}-result.json"
    job_path.write_text(json.dumps({**job, "framework": framework}))
    command = [sys.executable, "-m", "pipelines.runner", framework, "--", "python", "-m", module, str(job_path),
               str(result_path)]
    code = subprocess.run(command, cwd=REPO, env={**os.environ, "ROSETTA_THREADS": str(threads)},
                          check=False).returncode
    if code != 0 or not result_path.is_file():
        raise SystemExit(f"error: the {framework} worker exited {code} (its reason is above)")
    return json.loads(result_path.read_text())
