"""Bad params.yaml: one line naming field, value and what is allowed; non-zero exit; no partial outputs."""

import subprocess
import sys

import pytest
import yaml

from support import REPO, orchestrator_env

SPEC_CASES = [
    (lambda p: p.update(models=["mlp", "vit"]), "models.1 = 'vit'"),
    (lambda p: p["optimizers"]["adam"].update(learning_rate=-0.01), "optimizers.adam.learning_rate = -0.01"),
    (lambda p: p["train"].update(epochs=0), "train.epochs = 0"),
    (lambda p: p["train"].update(batch_size="big"), "train.batch_size = 'big'"),
]
DATA_CASES = [
    (
        lambda p: p["data"].update(source="idx", idx_dir="no/such/folder"),
        "data.idx_dir = 'no/such/folder': folder not found",
    ),
]


def check_clean_failure(tmp_path, change, expected, args):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    change(params)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=tmp_path, env=orchestrator_env(), capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: params.yaml: ") and expected in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing else written


@pytest.mark.parametrize(("change", "expected"), SPEC_CASES + DATA_CASES)
def test_data_stage_fails_cleanly(tmp_path, change, expected):
    check_clean_failure(tmp_path, change, expected, ["pipelines.stages.data"])


# The init stage reads prepared data, not the data source: it shares the spec-level cases only.
@pytest.mark.parametrize(("change", "expected"), SPEC_CASES)
def test_init_stage_fails_cleanly(tmp_path, change, expected):
    check_clean_failure(tmp_path, change, expected, ["pipelines.stages.init", "mlp"])
