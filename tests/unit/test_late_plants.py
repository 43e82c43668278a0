"""tooling/diagnose/late_plants.py's judge: the design run on pools of trainings. Synthetic pools (no framework):
what is checked is that the judge sees what the pipeline's test must see (a moved framework, figures within their
float32 bound, replicates that never parted), not the table's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.checks.parity import END_OF_TRAINING
from pipelines.checks.replicate_null import pooled_p
from rosetta_common.spec import load_spec
from support import REPO
from tooling.diagnose import late_plants

SPEC = load_spec(REPO / "params.yaml")
TOLERANCE = SPEC.tolerances.lockstep_loss_rel


def training(framework: str, plant: str, index: int, rng: np.random.Generator, shift: float,
             parts: bool = True) -> dict[str, Any]:
    """One worker line: step losses that leave the run's (index 0) at step 3 unless `parts` is False; a test loss
    and accuracy spread like a trained cnn's; predictions of 200 images, a few flipped at random."""
    losses = [1.0, 0.9, 0.8, 0.7]
    if index and parts:
        losses[2:] = [x + 1e-3 * index for x in losses[2:]]
    loss = 0.05 + 0.002 * rng.standard_normal() + 0.002 * shift
    predictions = np.zeros(200, int)
    predictions[rng.choice(200, 4 + int(2 * shift), replace=False)] = 1
    return {"framework": framework, "model": "cnn", "seed": 0, "plant": plant, "size": 0.1 if plant != "none" else 0,
            "start": 2, "index": index, "step_losses": losses, "test_loss": loss,
            "test_accuracy": 0.97 - 0.01 * loss, "test_predictions": predictions.tolist()}


def pools_file(tmp_path: Path, shift: float, replicates: int = 8, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    rows = [training(fw, "none", i, rng, 0.0) for fw in ("torch", "tf", "jax") for i in range(replicates + 1)]
    rows += [training("jax", "lr", i, rng, shift) for i in range(replicates + 1)]
    path = tmp_path / f"pools-{shift}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_moved_framework_fails_and_a_faithful_one_mostly_passes(tmp_path: Path) -> None:
    pools = late_plants.read_pools([pools_file(tmp_path, 6.0)], TOLERANCE)
    rows = late_plants.judge(SPEC, pools, draws=12, families=[3])
    faithful, planted = rows
    assert faithful["plant"] == "none" and planted["plant"] == "lr"
    assert faithful["failed"][3] <= 0.25, faithful
    assert planted["failed"][3] == 1.0, planted
    assert planted["shift_sd"] > 3, planted


def test_replicates_that_never_part_are_dropped_and_too_few_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rows = [training("jax", "none", i, rng, 0.0, parts=i <= 3) for i in range(8)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool = late_plants.read_pools([path], TOLERANCE)[(0, "cnn", "jax", "none", 0.0)]
    assert [r["index"] for r in pool.replicates] == [1, 2, 3]
    other = [training(fw, "none", i, rng, 0.0) for fw in ("torch", "tf") for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + other))
    with pytest.raises(late_plants.RosettaError, match=r"\[3\] parted replicates"):
        late_plants.judge(SPEC, late_plants.read_pools([path], TOLERANCE), draws=1, families=[3])


def test_a_figure_within_its_float32_bound_is_not_judged() -> None:
    run = {"test_loss": 0.05, "test_accuracy": 0.97, "test_predictions": np.zeros(10, int)}
    close = {**run, "test_loss": 0.05 * (1 + SPEC.tolerances.test_loss_rel / 2)}
    far = {**run, "test_loss": 0.05 * (1 + SPEC.tolerances.test_loss_rel * 2)}
    assert late_plants.beyond_bound(SPEC, [run, close, run]) == {
        "test_loss_rel": False, "test_accuracy_diff_points": False, "prediction_disagreement": False}
    flipped = {**far, "test_predictions": np.eye(10, dtype=int)[0]}
    assert late_plants.beyond_bound(SPEC, [run, close, flipped]) == {
        "test_loss_rel": True, "test_accuracy_diff_points": False, "prediction_disagreement": True}


@pytest.mark.parametrize(("args", "says"), [
    (["judge", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (["judge", "{pools}", "--draws", "0"], "--draws 0"),
    (["train", "--models", "transformer", "--out", "x"], "--models ['transformer']: not in params.yaml's models"),
    (["train", "--replicates", "2", "--out", "x"], "--replicates: 2: at least replicates.parted"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    pools = pools_file(tmp_path, 0.0)
    result = subprocess.run([sys.executable, "-m", "tooling.diagnose.late_plants",
                             *(a.format(pools=pools) for a in args)], cwd=REPO, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 2, result
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and says in result.stderr, result.stderr


def test_the_worker_refuses_a_plant_outside_jax_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = subprocess.run([sys.executable, "-m", "tooling.diagnose.late_plants_worker", "torch", "cnn", "lr",
                             "0.1", "1", str(out)], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and result.stderr == "error: plant: 'lr' in 'torch': a late plant is planted in " \
        "jax only\n", result
    assert not out.exists()


def test_each_draws_p_is_the_validate_stages_pooled_p(tmp_path: Path) -> None:
    """At the interim look (three groups of 3: every relabelling) the judge's p is pooled_p's, figure by figure."""
    pools = late_plants.read_pools([pools_file(tmp_path, 3.0)], TOLERANCE)
    groups = [pools[(0, "cnn", fw, "none" if fw != "jax" else "lr", 0.0 if fw != "jax" else 0.1)]
              for fw in ("torch", "tf", "jax")]
    first = [[g.run, *g.replicates[:2]] for g in groups]
    labels = late_plants.relabellings(3)
    for key, distance in END_OF_TRAINING.items():
        chosen = np.concatenate([[start, start + 1, start + 2] for start in (0, 9, 18)])
        squared = late_plants.squared_distances(groups, key)[np.ix_(chosen, chosen)]
        assert late_plants.p_value(squared, labels) == pooled_p(first, distance)[1], key
