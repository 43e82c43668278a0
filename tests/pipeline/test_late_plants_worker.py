"""tooling/diagnose/late_plants_worker.py in JAX's environment, on the session's finished TINY run (read, never
changed): its trainings are the pipeline's, bit for bit, and each planted change acts only from the second half of
the epochs on: a learning rate and label smoothing from that step's loss on, a BatchNorm momentum on the running
statistics alone (every training loss the run's, the test loss not)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import TinyRun


def run_worker(tiny: TinyRun, out: Path, plant: str, size: str, replicates: int,
               model: str = "cnn") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pipelines.runner", "jax", "--", "python", "-m",
               "tooling.diagnose.late_plants_worker", "jax", model, plant, size, str(replicates), str(out)]
    return subprocess.run(command, cwd=tiny.root, env=tiny.env, capture_output=True, text=True, check=False)


def worker(tiny: TinyRun, out: Path, plant: str, size: str, replicates: int,
           model: str = "cnn") -> list[dict[str, Any]]:
    result = run_worker(tiny, out, plant, size, replicates, model)
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


def test_label_smoothing_and_a_batchnorm_momentum_act_late(tiny_pipeline: TinyRun, tmp_path: Path) -> None:
    log = json.loads((tiny_pipeline.root / "artifacts/jax/resnet/train_log.json").read_text())
    (run,) = worker(tiny_pipeline, tmp_path / "none.jsonl", "none", "0", 0, "resnet")
    assert run["step_losses"] == log["step_losses"]
    # Label smoothing from optimizer step `start` on: that step's own loss is the first smoothed one.
    (smoothed,) = worker(tiny_pipeline, tmp_path / "ls.jsonl", "ls", "0.01", 0, "resnet")
    start = smoothed["start"]
    assert 0 < start < len(run["step_losses"])
    assert smoothed["step_losses"][:start] == run["step_losses"][:start]
    assert smoothed["step_losses"][start] != run["step_losses"][start]
    # The momentum weighs the running statistics only: training normalizes by the batch's, so every training loss
    # is the run's; the model evaluated on the running statistics is not.
    (momentum,) = worker(tiny_pipeline, tmp_path / "bn.jsonl", "bn", "0.1", 0, "resnet")
    assert momentum["step_losses"] == run["step_losses"]
    assert momentum["test_loss"] != run["test_loss"]


def test_a_batchnorm_plant_in_a_model_without_batchnorm_is_one_line_and_no_file(tiny_pipeline: TinyRun,
                                                                                tmp_path: Path) -> None:
    out = tmp_path / "bn.jsonl"
    result = run_worker(tiny_pipeline, out, "bn", "0.5", 0)
    assert result.returncode == 2, result
    says = "error: plant: 'bn': the cnn model has no BatchNorm; allowed: a model with one"
    assert result.stderr.splitlines()[-1] == says, result.stderr
    assert list(tmp_path.iterdir()) == []
