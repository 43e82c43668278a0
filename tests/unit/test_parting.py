"""Where the trainings part: validate's parting_record on hand-made runs (every pair's step by validate's own rule),
the rows the report and tooling/diagnose/parting.py print from it (spreads, and the within-framework pairs that part
after the earliest cross-framework pair), the report's figure, and the tool's bad input as one line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.checks.replicates import parting_record
from pipelines.report import figures, tables
from tooling.diagnose import parting

# Four steps a run; a replicate parts at the first step its loss differs by more than 1e-5 relative.
RUNS = {"torch": [2.0, 1.5, 1.0, 0.5], "tf": [2.0, 1.5, 1.1, 0.6], "jax": [2.0, 1.5, 1.0, 0.5]}
REPLICATES = {"torch": [[2.0, 1.5, 1.0, 0.7], [2.0, 1.6, 1.0, 0.5]],  # part from the run at 4 and at 2
              "tf": [[2.0, 1.5, 1.1, 0.6], [2.0, 1.5, 1.1, 0.9]],  # never, and at 4
              "jax": []}
ACROSS = {"torch|tf": 3, "torch|jax": None, "tf|jax": 3}


def record() -> dict:
    runs = {fw: {"step_losses": losses, "replicates": [{"step_losses": r} for r in REPLICATES[fw]] or None}
            for fw, losses in RUNS.items()}
    return parting_record("cnn", runs, ACROSS, 1e-5)


def test_every_pair_parts_where_the_lockstep_rule_says() -> None:
    cnn = record()
    assert cnn["steps"] == 4 and cnn["across"] == ACROSS
    assert cnn["within"]["torch"] == {"run": [4, 2], "replicates": [2]}
    assert cnn["within"]["tf"] == {"run": [None, 4], "replicates": [4]}
    assert cnn["within"]["jax"] == {"run": [], "replicates": []}
    runs = {fw: {"step_losses": losses, "replicates": None} for fw, losses in RUNS.items()}
    assert parting_record("mlp", runs, ACROSS, 1e-5) is None  # no replicates: nothing to record


def test_the_report_tabulates_and_draws_it() -> None:
    inputs = SimpleNamespace(validation={"parting": [record()]})
    table = tables.parting(inputs, "cnn")
    rows = [[c.text for c in row.cells] for row in table.rows]
    assert rows == [["torch", "2 / 3 / 4 (2)", "2 / 2 / 2 (1)", "3", "1 of 3"],
                    ["tf", "4 / never / never (2)", "4 / 4 / 4 (1)", "3", "3 of 3"],
                    ["jax", "-", "-", "3", "0 of 0"]]
    assert tables.parting(inputs, "mlp") is None
    assert figures.parting("cnn", record()).startswith("data:image/png;base64,")
    assert figures.parting("mlp", None) is None


@pytest.fixture
def validation(tmp_path: Path) -> Path:
    path = tmp_path / "validation.json"
    path.write_text(json.dumps({"parting": [record()]}))
    return path


def test_the_tool_prints_the_recorded_steps(validation: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert parting.main(["--validation", str(validation), "--json", str(tmp_path / "parting.json")]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert "| cnn | torch | 2 / 3 / 4 (2) | 2 / 2 / 2 (1) | 3 | 1 of 3 |" in rows, rows
    assert "| cnn | tf | 4 / never / never (2) | 4 / 4 / 4 (1) | 3 | 3 of 3 |" in rows, rows
    assert json.loads((tmp_path / "parting.json").read_text()) == [record()]


def test_bad_input_is_one_line(validation: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert parting.main(["--validation", str(validation), "--models", "mlp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--models mlp: no parting steps" in err and "allowed: cnn" in err
    assert parting.main(["--validation", str(tmp_path / "absent.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "absent.json: unreadable" in err and "run dvc repro first" in err
