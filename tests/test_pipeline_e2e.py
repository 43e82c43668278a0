"""The whole pipeline, for real (DVC, the three frameworks, ONNX Runtime), with tiny params in a temporary
copy of the repository. Environments are shared with the checkout (ROSETTA_ENVS_DIR), not rebuilt. The run is
conftest.py's session-wide `tiny_pipeline`, shared with test_validate_failures.py."""

from __future__ import annotations

import json

import numpy as np

from support import TINY, ran_stages, sh

MODELS = ["mlp", "cnn", "attention"]
FRAMEWORKS = ["torch", "tf", "jax"]


def test_first_repro_runs_every_stage(tiny_pipeline):
    _, _, output = tiny_pipeline
    expected = {"data", "validate"} | {f"init@{m}" for m in MODELS}
    expected |= {f"{s}@{f}-{m}" for s in ("train", "export", "bench") for f in FRAMEWORKS for m in MODELS}
    expected |= {"report"}
    assert ran_stages(output) == expected


def test_validation_report_passes_with_every_check(tiny_pipeline):
    root, _, _ = tiny_pipeline
    report = json.loads((root / "reports/validation.json").read_text())
    assert report["passed"] is True
    checks = {(r["model"], r["framework"], r["check"]) for r in report["checks"]}
    for m in MODELS:
        for f in FRAMEWORKS:
            for check in (
                "onnx_checker_model",
                "onnx_vs_native",
                "onnx_test_accuracy_equals_native",
                "init_onnx_vs_native",
                "init_onnx_vs_reference",
                "min_test_accuracy",
            ):
                assert (m, f, check) in checks
        for pair in ("torch|tf", "torch|jax", "tf|jax"):
            for check in (
                "forward_parity_init_onnx",
                "train_step1_loss_rel",
                "train_first_epoch_loss_rel",
                "test_loss_rel",
                "test_accuracy_points",
            ):
                assert (m, pair, check) in checks
    for row in report["checks"]:
        assert row["passed"] is True, row
        if row["check"] == "min_test_accuracy":  # a floor, not a tolerance
            assert row["max_abs_err"] >= row["tolerance"], row
        elif row["tolerance"] is not None:
            assert row["max_abs_err"] <= row["tolerance"], row
    assert len(report["training_parity"]) == 3 * len(MODELS)


def test_artifacts_and_metrics_are_laid_out(tiny_pipeline):
    root, _, _ = tiny_pipeline
    for m in MODELS:
        assert (root / f"artifacts/{m}/init.safetensors").is_file()
        for f in FRAMEWORKS:
            run = root / f"artifacts/{m}/{f}"
            for name in ("model.onnx", "init.onnx", "trained.safetensors", "native_outputs.npz", "export.json"):
                assert (run / name).is_file(), run / name
            assert any((run / "native").iterdir())
            metrics = json.loads((root / f"metrics/{m}/{f}.json").read_text())
            for key in ("test_accuracy", "final_train_loss", "train_seconds", "epoch_losses"):
                assert key in metrics
            assert len(metrics["epoch_losses"]) == TINY["train"]["epochs"]
            with np.load(run / "native_outputs.npz", allow_pickle=False) as outputs:
                assert outputs["validation_logits"].shape == (16, 10)
    assert not list(root.rglob("*.pkl")) and not list(root.rglob("*.pickle"))


def test_second_repro_reruns_nothing(tiny_pipeline):
    root, env, _ = tiny_pipeline
    result = sh(["dvc", "repro"], root, env)
    assert ran_stages(result.stdout) == set()
    status = sh(["dvc", "status", "--json"], root, env)
    assert json.loads(status.stdout) == {}


def test_corrupt_or_missing_onnx_fails_validation_naming_the_file(tiny_pipeline):
    root, env, _ = tiny_pipeline
    target = root / "artifacts/mlp/tf/model.onnx"
    saved = target.read_bytes()
    validate = ["python", "-m", "pipelines.runner", "validation", "--", "python", "-m", "pipelines.stages.validate"]
    try:
        for damage, message in (
            (lambda: target.write_bytes(b"this is not an onnx model"), "artifacts/mlp/tf/model.onnx: not a valid ONNX"),
            (target.unlink, "artifacts/mlp/tf/model.onnx: ONNX file is missing"),
        ):
            damage()
            result = sh(validate, root, env, check=False)
            assert result.returncode != 0
            assert message in result.stderr
    finally:
        target.write_bytes(saved)
        sh(["dvc", "checkout", "-q"], root, env, check=False)


def test_editing_torch_package_reruns_only_torch_and_downstream(tiny_pipeline):
    root, env, _ = tiny_pipeline
    source = root / "packages/torch_impl/src/rosetta_torch/models.py"
    source.write_text(source.read_text() + "\n# an edit\n")
    result = sh(["dvc", "repro"], root, env)
    ran = ran_stages(result.stdout)
    torch_stages = {f"{s}@torch-{m}" for s in ("train", "export") for m in MODELS}
    assert torch_stages <= ran
    downstream = {f"bench@torch-{m}" for m in MODELS} | {"validate", "report"}
    assert ran <= torch_stages | downstream
