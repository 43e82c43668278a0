"""Bad params.yaml: one line naming field, value and what is allowed; non-zero exit; no partial outputs."""

import subprocess
import sys

import pytest
import yaml

from support import REPO, orchestrator_env


def run_stage(cwd, *args):
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=orchestrator_env(), capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda p: p.update(models=["mlp", "resnet"]), "models.1 = 'resnet'"),
        (lambda p: p["optimizers"]["adam"].update(learning_rate=-0.01), "optimizers.adam.learning_rate = -0.01"),
        (lambda p: p["train"].update(epochs=0), "train.epochs = 0"),
        (lambda p: p["train"].update(batch_size="big"), "train.batch_size = 'big'"),
        (
            lambda p: p["data"].update(source="idx", idx_dir="no/such/folder"),
            "data.idx_dir = 'no/such/folder': folder not found",
        ),
    ],
)
@pytest.mark.parametrize("stage", ["pipelines.stages.data", "pipelines.stages.init"])
def test_bad_params_fail_cleanly(tmp_path, change, expected, stage):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    change(params)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = [stage] + (["mlp"] if stage.endswith("init") else [])
    if stage.endswith("init") and expected.startswith("data.idx_dir"):
        pytest.skip("the init stage reads prepared data, not the data source")
    result = run_stage(tmp_path, *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: params.yaml: ") and expected in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing else written
