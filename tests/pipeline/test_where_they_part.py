"""tooling.diagnose.where_they_part: a user's own weights through each framework (in its own environment) and the
float64 reference, tap by tap. Bad input is one line and exit 2; one real run through torch's environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rosetta_common.reference import forward_with_taps
from rosetta_common.spec import ModelConfig, load_spec
from rosetta_common.testing import asymmetric_weights
from rosetta_common.weights import load_weights, save_weights
from support import REPO, orchestrator_env

TOOL = [sys.executable, "-m", "tooling.diagnose.where_they_part"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TOOL, *args], cwd=REPO, env=orchestrator_env(), capture_output=True, text=True,
                          check=False)


def image_shape() -> tuple[int, int]:
    """The shape the tool's batch has: the prepared data's, else its --image-shape default (8x8)."""
    if (REPO / "data/prepared").is_dir():
        from rosetta_common.data import load_prepared
        return load_prepared(REPO / "data/prepared").image_shape
    return (8, 8)


@pytest.fixture(scope="module")
def mlp_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A canonical mlp file as params.yaml configures it, for the tool's batch shape."""
    config = ModelConfig.of(load_spec(REPO / "params.yaml"), "mlp", image_shape(), 10)
    path = tmp_path_factory.mktemp("weights") / "mlp.safetensors"
    save_weights(path, asymmetric_weights(config, 7), "mlp")
    return path


@pytest.mark.parametrize(("args", "says"), [
    (("transformer", "w.safetensors"), "arch = 'transformer': unknown; allowed: mlp, cnn"),
    (("mlp", "/nonexistent/w.safetensors"), "weights = /nonexistent/w.safetensors: no such file"),
    (("mlp", "README.md"), "README.md: not a readable safetensors file"),
    (("cnn", "{mlp}"), "architecture 'mlp', expected 'cnn'"),
    (("mlp", "{mlp}", "--images", "0"), "--images = 0: must be at least 1"),
    (("mlp", "{mlp}", "--frameworks", "mxnet"), "--frameworks = mxnet: unknown; allowed: torch, tf, jax"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], says: str, mlp_weights: Path) -> None:
    result = run(*(a.format(mlp=mlp_weights) for a in args))
    assert result.returncode == 2, result
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and says in result.stderr, result.stderr


def test_weights_that_do_not_fit_the_arch_are_refused(tmp_path: Path) -> None:
    config = ModelConfig.of(load_spec(REPO / "params.yaml"), "mlp", (image_shape()[0] + 1, image_shape()[1]), 10)
    path = tmp_path / "other.safetensors"
    save_weights(path, asymmetric_weights(config, 8), "mlp")  # made for one more image row: hidden.kernel's rows
    result = run("mlp", str(path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "hidden.kernel has shape" in result.stderr and "architecture.mlp" in result.stderr


def test_a_real_run_prints_every_tap_and_that_they_agree(mlp_weights: Path) -> None:
    """torch, in its own environment, against the reference at the forward tolerance: every tap agrees (exit 0).
    (One framework: each costs an interpreter and a framework import; the tool treats them alike.)"""
    agree = run("mlp", str(mlp_weights), "--frameworks", "torch", "--images", "4")
    assert agree.returncode == 0, agree.stderr
    lines = agree.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("tap "))
    assert lines[header].split() == ["tap", "torch-ref"]
    assert [line.split()[0] for line in lines[header + 1:header + 4]] == ["hidden", "hidden.relu", "logits"]
    assert "  torch-ref: none (every tap agrees)" in lines


def test_a_framework_that_parts_is_named_at_its_first_divergent_tap(
        mlp_weights: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """In process, with two frameworks' taps stood in for (the reference's, one of them off from hidden.relu
    on): the table marks the taps over the tolerance, and each comparison names where it parts (exit 1)."""
    from tooling.diagnose import where_they_part

    def planted(framework: str, arch: str, weights: Path, images: object, classes: int,
                scratch: Path) -> dict[str, np.ndarray]:
        config = ModelConfig.of(load_spec(REPO / "params.yaml"), arch, image_shape(), classes)
        taps = forward_with_taps(config, load_weights(weights, config), images)
        if framework == "tf":
            taps = {k: v + (1e-3 if k != "hidden" else 0.0) for k, v in taps.items()}
        return {k: v.astype(np.float32) for k, v in taps.items()}

    monkeypatch.setattr(where_they_part, "framework_taps", planted)
    assert where_they_part.main(["mlp", str(mlp_weights), "--frameworks", "torch", "tf", "--images", "3"]) == 1
    out = capsys.readouterr().out.splitlines()
    row = next(line for line in out if line.startswith("hidden.relu "))
    assert row.split()[1:] == [row.split()[1], "1.0e-03*", "1.0e-03*"] and not row.split()[1].endswith("*")
    assert "  torch-ref: none (every tap agrees)" in out
    assert any(line.startswith("  tf-ref: hidden.relu (max abs 1.00e-03)") for line in out), out
    assert any(line.startswith("  torch|tf: hidden.relu (max abs 1.00e-03)") for line in out), out
