"""tooling/diagnose/parting.py on a small hand-made run: every pair's parting step by the validate stage's rule,
the table's spreads and its count of within-framework pairs that part after the earliest cross-framework pair,
and bad input as one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from support import REPO
from tooling.diagnose import parting

# Four steps a run; a replicate parts at the first step its loss differs by more than 1e-5 relative.
RUNS = {"torch": [2.0, 1.5, 1.0, 0.5], "tf": [2.0, 1.5, 1.1, 0.6], "jax": [2.0, 1.5, 1.0, 0.5]}
REPLICATES = {"torch": [[2.0, 1.5, 1.0, 0.7], [2.0, 1.6, 1.0, 0.5]],  # part from the run at 4 and at 2
              "tf": [[2.0, 1.5, 1.1, 0.6], [2.0, 1.5, 1.1, 0.9]],  # never, and at 4
              "jax": []}


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["models"] = ["mlp", "cnn"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for fw, losses in RUNS.items():
        for model in ("mlp", "cnn"):
            folder = tmp_path / "artifacts" / fw / model
            folder.mkdir(parents=True)
            (folder / "train_log.json").write_text(json.dumps({"step_losses": losses}))
        if REPLICATES[fw]:
            folder = tmp_path / "artifacts" / "replicates" / fw / "cnn"
            folder.mkdir(parents=True)
            (folder / "replicates.json").write_text(json.dumps(
                {"replicates": [{"step_losses": r} for r in REPLICATES[fw][:1]]}))
            more = tmp_path / "artifacts" / "replicates_more" / fw / "cnn"
            more.mkdir(parents=True)
            (more / "replicates.json").write_text(json.dumps(
                {"replicates": [{"step_losses": r} for r in REPLICATES[fw][1:]]}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_pair_parts_where_the_validate_stage_says(run: Path, capsys: pytest.CaptureFixture) -> None:
    assert parting.main(["--json", str(run / "parting.json")]) == 0
    (cnn,) = json.loads((run / "parting.json").read_text())  # mlp has no replicates
    assert cnn["within"]["torch"] == {"run": [4, 2], "replicates": [2]}
    assert cnn["within"]["tf"] == {"run": [None, 4], "replicates": [4]}
    assert cnn["within"]["jax"] == {"run": [], "replicates": []}
    assert cnn["across"] == {"torch|tf": 3, "torch|jax": None, "tf|jax": 3}
    rows = capsys.readouterr().out.splitlines()
    assert "| cnn | torch | 2 / 3 / 4 (2) | 2 / 2 / 2 (1) | 3 | 1 of 3 |" in rows, rows
    assert "| cnn | tf | 4 / never / never (2) | 4 / 4 / 4 (1) | 3 | 3 of 3 |" in rows, rows
    assert "| cnn | jax | - | - | 3 | 0 of 0 |" in rows, rows


def test_a_model_without_replicates_is_one_line(run: Path, capsys: pytest.CaptureFixture) -> None:
    assert parting.main(["--models", "mlp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--models mlp: no end-of-training replicates" in err and "allowed: cnn" in err
    shutil.rmtree(run / "artifacts" / "tf" / "cnn")
    assert parting.main([]) == 2
    assert "run dvc repro first" in capsys.readouterr().err
