"""tooling/diagnose/late_plants_worker.py in JAX's environment, on the session's finished TINY run (read, never
changed): its trainings are the pipeline's, bit for bit, and a planted learning-rate change acts only from the
second half of the epochs on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import TinyRun


def worker(tiny: TinyRun, out: Path, plant: str, size: str, replicates: int) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "pipelines.runner", "jax", "--", "python", "-m",
               "tooling.diagnose.late_plants_worker", "jax", "cnn", plant, size, str(replicates), str(out)]
    result = subprocess.run(command, cwd=tiny.root, env=tiny.env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_workers_trainings_are_the_pipelines_and_a_late_plant_acts_late(tiny_pipeline: TinyRun,
                                                                            tmp_path: Path) -> None:
    root = tiny_pipeline.root
    run, first = worker(tiny_pipeline, tmp_path / "none.jsonl", "none", "0", 1)
    # The run is train_export's and replicate 1 the replicates stage's (the tiny run trains cnn's to the end).
    assert run["step_losses"] == json.loads((root / "artifacts/jax/cnn/train_log.json").read_text())["step_losses"]
    record = json.loads((root / "artifacts/replicates/jax/cnn/replicates.json").read_text())["replicates"][0]
    assert record["replicate"] == 1 and first["step_losses"] == record["step_losses"]
    assert first["test_loss"] == record["test_loss"]
    # Learning rate x 1.1 from optimizer step `start` on: every loss up to the one that step's update first
    # reaches is the unplanted run's, bit for bit, and that one is not.
    (planted,) = worker(tiny_pipeline, tmp_path / "lr.jsonl", "lr", "0.1", 0)
    start = planted["start"]
    assert 0 < start < len(run["step_losses"]) - 1
    assert planted["step_losses"][:start + 1] == run["step_losses"][:start + 1]
    assert planted["step_losses"][start + 1] != run["step_losses"][start + 1]
