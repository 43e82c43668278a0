"""The whole pipeline, for real (DVC, the three frameworks, ONNX Runtime), with tiny params in a temporary
copy of the repository. Environments are shared with the checkout (ROSETTA_ENVS_DIR), not rebuilt. The run is
conftest.py's session-wide `tiny_pipeline`, shared with test_validate_failures.py: every test here leaves it a
valid finished run (damage is undone with `dvc checkout`)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipelines import measurements, paths
from rosetta_common.spec import TOKEN_ARCHITECTURES, ModelConfig, parse_spec
from rosetta_common.weights import canonical_shapes, is_statistic
from support import MODELS, TINY, VALIDATE, TinyRun, ran_stages, sh

FRAMEWORKS = ["torch", "tf", "jax"]
PAIRS = ["torch|tf", "torch|jax", "tf|jax"]
LOCKSTEP_CHECKS = {"weights": "lockstep_weights_rel", "logits": "lockstep_logits_rel",
                   "running_statistics": "lockstep_running_stats_rel"}
STAGES = {"data", "init", "null_plan", "null_interim", "serve", "validate", "report"} | {
    f"{s}@{f}" for f in FRAMEWORKS for s in ("train_export", "replicates", "replicates_more", "train_dp")}
# What a train_export stage publishes for each model, and nothing else: one run folder per model.
RUN_FILES = {
    "trained.safetensors",
    "train_log.json",
    "metrics.json",
    "native",
    "model.onnx",
    "init.onnx",
    "native_outputs.npz",
    "taps.npz",
    "checkpoints.npz",
    "export.json",
}
METRICS_KEYS = {"test_accuracy", "test_loss", "final_train_loss", "parameters", "epochs", "optimizer"}


def test_first_repro_runs_every_stage(tiny_pipeline: TinyRun) -> None:
    assert ran_stages(tiny_pipeline.output) == STAGES


def has_batchnorm(model: str) -> bool:
    """Whether the model's canonical layout (TINY params, digits' 8x8 images) holds BatchNorm statistics."""
    if model in TOKEN_ARCHITECTURES:
        spec = parse_spec(TINY)
        config = ModelConfig.of_tokens(spec, model, spec.data.text.vocab_size, spec.data.text.max_length, 2)
    else:
        config = ModelConfig.of(parse_spec(TINY), model, (8, 8), 10)
    return any(is_statistic(name) for name in canonical_shapes(config))


def test_validation_report_passes_with_every_check(tiny_pipeline: TinyRun) -> None:
    report = json.loads((tiny_pipeline.root / "reports/validation.json").read_text())
    assert report["passed"] is True, [r for r in report["checks"] if not r["passed"]]
    checks = {(r["model"], r["framework"], r["check"]) for r in report["checks"]}
    for m in MODELS:
        for f in FRAMEWORKS:
            for check in (
                "artifacts_intact",
                "onnx_checker_model",
                "onnx_checker_init",
                "onnx_vs_native",
                "onnx_test_accuracy_equals_native",
                "init_onnx_vs_native",
                "init_onnx_vs_reference",
                "init_taps_vs_reference",
                "min_test_accuracy",
            ):
                assert (m, f, check) in checks
            own = {c for (mm, ff, c) in checks if (mm, ff) == (m, f)}
            formats = {c.removeprefix("native_roundtrip_") for c in own if c.startswith("native_roundtrip_")}
            assert formats, (m, f)
            # every export's inference mode: both ONNX files, and each native format
            assert {f"inference_mode_native_{fmt}" for fmt in formats} | {
                "inference_mode_onnx_model", "inference_mode_onnx_init"} <= own, (m, f)
        for pair in PAIRS:
            for check in (
                "forward_parity_init_onnx",
                "train_step1_loss_rel",
                "train_lockstep_loss_rel",
                "test_loss_rel",
                "test_accuracy_points",
            ):
                assert (m, pair, check) in checks
            # the running statistics, for exactly the models with BatchNorm (after training, and at the lockstep
            # checkpoints); every model's weights and logits at the checkpoints
            for check in ("running_mean_rel", "running_var_rel", "lockstep_running_stats_rel"):
                assert ((m, pair, check) in checks) == has_batchnorm(m), (m, pair, check)
            assert {(m, pair, "lockstep_weights_rel"), (m, pair, "lockstep_logits_rel")} <= checks, (m, pair)
    for row in report["checks"]:
        assert row["passed"] is True, row
        if row["check"] == "min_test_accuracy":  # a floor, not a tolerance
            assert row["value"] >= row["tolerance"], row
        elif "null" in row:  # runs that parted: judged against the replicates, not the float32 bound
            beyond = row["tolerance"] is None or row["value"] > row["tolerance"]
            null = row["null"]
            assert beyond and null["p_value"] > 0 and {"test", "statistic", "floor", "threshold"} <= set(null), row
        elif row["tolerance"] is not None:
            assert row["value"] <= row["tolerance"], row
    assert len(report["training_parity"]) == len(PAIRS) * len(MODELS)
    # every pair's state at every lockstep checkpoint, as params.yaml lists them
    steps = yaml.safe_load((tiny_pipeline.root / "params.yaml").read_text())["tolerances"]["lockstep_checkpoints"]
    lockstep = {(r["model"], r["frameworks"]): r for r in report["lockstep"]}
    rows = {(r["model"], r["framework"], r["check"]): r for r in report["checks"]}
    assert sorted(lockstep) == sorted((m, p) for m in MODELS for p in PAIRS)
    for (m, _), record in lockstep.items():
        assert [c["step"] for c in record["checkpoints"]] == steps, record
        for point in record["checkpoints"]:
            kinds = {"weights", "logits"} | ({"running_statistics"} if has_batchnorm(m) else set())
            assert set(point) - {"step"} == kinds, point
            for k in kinds:  # within the float32 bound, or judged against the replicates' null (and passed)
                row = rows[(m, record["frameworks"], LOCKSTEP_CHECKS[k])]
                assert point[k]["max_rel"] <= record["tolerance"] or "null" in row, (point, row)
    with_bn = [m for m in MODELS if has_batchnorm(m)]
    assert with_bn, "TINY has no model with BatchNorm: the running-statistics figure is never made"
    statistics = report["running_statistics"]
    assert sorted((s["model"], s["frameworks"]) for s in statistics) == sorted((m, p) for m in with_bn for p in PAIRS)
    for fig in statistics:
        assert fig["layers"] and all(set(v) == {"running_mean", "running_var"} for v in fig["layers"].values()), fig


def test_artifacts_and_measurements_are_laid_out(tiny_pipeline: TinyRun) -> None:
    root = tiny_pipeline.root
    assert sorted(p.name for p in (root / paths.ARTIFACTS).iterdir()) == sorted(
        ["init", "data_parallel", "replicates", "replicates_more", paths.NULL_PLAN.name, paths.NULL_INTERIM.name,
         paths.SERVED.name, *FRAMEWORKS])
    # end-of-training replicates for exactly the models the null plan names, among those params.yaml lists; more
    # after the interim look for exactly the planned models it did not accept
    planned = json.loads((root / paths.NULL_PLAN).read_text())["replicates"]
    interim = json.loads((root / paths.NULL_INTERIM).read_text())
    assert set(planned) <= set(TINY["replicates"]["models"])
    assert sorted(interim["more"] + interim["accepted"]) == sorted(planned), interim
    wanted = {**parse_spec({}).replicates.model_dump(), **TINY["replicates"]}
    for f in FRAMEWORKS:
        folder, more = root / paths.replicates_dir(f), root / paths.replicates_more_dir(f)
        assert sorted(p.name for p in folder.iterdir()) == sorted([*planned, "plan.json"]), folder
        for m in planned:
            record = json.loads((folder / m / paths.REPLICATES_RECORD).read_text())
            parted = [r for r in record["replicates"] if r["parts_from_run_at_step"] is not None]
            # trained until `first` have parted, or `at_most` were trained
            assert len(parted) == wanted["first"] or len(record["replicates"]) == wanted["at_most"], record
            reps = record["replicates"]
            if m in interim["more"] and (more / m).exists():  # then on, numbered on, until `parted` in all
                reps = reps + json.loads((more / m / paths.REPLICATES_RECORD).read_text())["replicates"]
                parted = [r for r in reps if r["parts_from_run_at_step"] is not None]
                assert len(parted) == wanted["parted"] or len(reps) == wanted["at_most"], f
            else:
                assert not (more / m).exists() and (m in interim["accepted"] or len(reps) == wanted["at_most"])
            assert [r["replicate"] for r in reps] == list(range(1, len(reps) + 1))
    # where the trainings part, for exactly the planned models: each replicate against its run as the replicates
    # stage measured it, a step for each two replicates, and the runs' pairs as training parity records them
    validation = json.loads((root / paths.VALIDATION).read_text())
    assert [r["model"] for r in validation["parting"]] == [m for m in MODELS if m in planned]
    for record in validation["parting"]:
        m = record["model"]
        for f in FRAMEWORKS:
            run = next(x for x in validation["runs"] if (x["model"], x["framework"]) == (m, f))
            steps = [r["parts_from_run_at_step"] for r in run["replicates"]]
            n = len(steps)
            assert record["within"][f]["run"] == steps and len(record["within"][f]["replicates"]) == n * (n - 1) // 2
        assert record["across"] == {t["frameworks"]: t["parting_step"] for t in validation["training_parity"]
                                    if t["model"] == m}
    assert sorted(p.name for p in (root / paths.INIT).iterdir()) == sorted(f"{m}.safetensors" for m in MODELS)
    for f in FRAMEWORKS:
        assert sorted(p.name for p in (root / paths.framework_dir(f)).iterdir()) == sorted(MODELS)
    for m in MODELS:
        for f in FRAMEWORKS:
            run = root / paths.run_dir(m, f)
            assert {p.name for p in run.iterdir()} == RUN_FILES, run
            assert any((run / "native").iterdir())
            # every file of the run but export.json itself is recorded there with its sha256
            record = json.loads((run / "export.json").read_text())
            files = {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()} - {"export.json"}
            assert set(record["sha256"]) == files, run
            metrics = json.loads((run / "metrics.json").read_text())
            assert set(metrics) == METRICS_KEYS, run  # figures only: timings are not lineage
            assert metrics["epochs"] == TINY["train"]["epochs"] and metrics["optimizer"] == TINY["train"]["optimizer"]
            log = json.loads((run / "train_log.json").read_text())
            assert len(log["epoch_losses"]) == TINY["train"]["epochs"]
            assert metrics["final_train_loss"] == log["epoch_losses"][-1]
            with np.load(run / "native_outputs.npz", allow_pickle=False) as outputs:
                batch = TINY["export"]["validation_batch_size"]
                classes = 2 if m in TOKEN_ARCHITECTURES else 10  # fresh / rotten, or the ten digits
                assert outputs["validation_logits"].shape == (batch, classes)
                assert outputs["init_validation_logits"].shape == (batch, classes)
                # the validation batch is the first test images (to float32 rounding: kernels vary with batch size)
                test_logits = outputs["test_logits"]
                np.testing.assert_allclose(test_logits[:batch], outputs["validation_logits"], rtol=0, atol=1e-4)
                for fmt in record["native_roundtrip_max_abs"]:  # each native format's inference-mode record
                    runs, alone = paths.native_inference_keys(fmt)
                    assert outputs[runs].shape == (2, batch, classes), (m, f, fmt)
                    assert outputs[alone].shape == (min(paths.NATIVE_ALONE, batch), classes), (m, f, fmt)
            timings = json.loads((root / measurements.record_path(m, f)).read_text())
            assert timings["stage"] == f"train_export@{f}"
            assert timings["train"]["train_seconds"] > 0
            assert timings["train"]["steady_samples_per_second"] > 0
            assert {"native_export_seconds", "onnx_export_seconds"} <= set(timings["export"])
            assert timings["latency"]["results"], (m, f)
    for gone in ("metrics", "reports/latency", "reports/report.html", "reports/summary", "reports/plots"):
        assert not (root / gone).exists(), gone
    report = root / "reports/comparison"
    assert {"report.html", "report.md", "summary", "plots"} <= {p.name for p in report.iterdir()}
    assert {p.name for p in (report / "summary").iterdir()} == {f"{m}.json" for m in MODELS}
    assert (root / "measurements/timings.js").is_file() and (root / "measurements/latency.csv").is_file()
    # every stage's wall time, start-up broken down, readable after the run
    stages = measurements.read_stages(root / measurements.ROOT)
    assert set(stages) == STAGES
    for name, record in stages.items():
        assert record["total_seconds"] > 0 and record["startup"]["imports_seconds"] > 0, name
        assert record["startup"]["interpreter_seconds"] is not None, name  # Linux: /proc gives the process start
    for f in FRAMEWORKS:
        record = stages[f"train_export@{f}"]
        assert record["models"] == MODELS and record["startup"]["runner_seconds"] is not None
        phases = ("checkpoints", "train", "export_native", "export_onnx", "outputs")  # window replicates first
        # taps, then latency, after every model's export: neither may shift TF's function names in later exports
        assert list(record["phases"]) == ["inputs", "framework_import", *(f"{m}.{p}" for m in MODELS for p in phases),
                                          *(f"{m}.taps" for m in MODELS), *(f"{m}.latency" for m in MODELS)]
    assert not list(root.rglob("*.pkl")) and not list(root.rglob("*.pickle"))


def test_second_repro_reruns_nothing(tiny_pipeline: TinyRun) -> None:
    root, env, _ = tiny_pipeline
    result = sh(["dvc", "repro"], root, env)
    assert ran_stages(result.stdout) == set()
    status = sh(["dvc", "status", "--json"], root, env)
    assert json.loads(status.stdout) == {}


def replace_bytes(path: Path, data: bytes) -> None:
    """Write by rename, never through the old file: a workspace file DVC linked to its cache stays intact."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def corrupt_onnx(root: Path) -> tuple[str, str]:
    # The bytes export.json recorded are gone: the run fails artifacts_intact and nothing else of it is judged
    # (a corrupt model.onnx with its hash re-recorded, failing onnx_checker_model, is in test_validate_failures).
    replace_bytes(root / paths.onnx_model("mlp", "tf"), b"this is not an onnx model")
    return "mlp/tf artifacts_intact", f"{paths.onnx_model('mlp', 'tf')}: altered since export"


def missing_onnx(root: Path) -> tuple[str, str]:
    (root / paths.onnx_model("lstm", "tf")).unlink()
    return "lstm/tf artifacts_intact", f"{paths.onnx_model('lstm', 'tf')}: missing"


def missing_native_formats(root: Path) -> tuple[str, str]:
    """The validator cannot load native formats (it has no framework): only their recorded sha256 ties them to
    the round-trip figures in export.json. Without it, a run whose native/ is gone would pass."""
    native = root / paths.native_dir("cnn", "tf")
    first = sorted(str(p.relative_to(native.parent)) for p in native.rglob("*") if p.is_file())[0]
    shutil.rmtree(native)
    return "cnn/tf artifacts_intact", f"{paths.run_dir('cnn', 'tf')}/{first}: missing (export.json recorded it)"


def altered_native_file(root: Path) -> tuple[str, str]:
    run = root / paths.run_dir("attention", "tf")
    target = max((p for p in (run / "native").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte in the middle of the largest native file
    replace_bytes(target, bytes(data))
    rel = f"{paths.run_dir('attention', 'tf')}/{target.relative_to(run)}"
    return "attention/tf artifacts_intact", f"{rel}: altered since export"


# Each damage hits a different model's run and returns the row that must fail and what its FAILED line must say.
DAMAGES: dict[str, Callable[[Path], tuple[str, str]]] = {
    "corrupt onnx": corrupt_onnx,
    "missing onnx": missing_onnx,
    "missing native formats": missing_native_formats,
    "altered native file": altered_native_file,
}


@pytest.fixture(scope="module")
def damaged_validation(tiny_pipeline: TinyRun) -> tuple[Any, dict[str, tuple[str, str]], Any]:
    """Every damage in DAMAGES done to the run at once, then the validate stage rerun alone (it judges each run on
    its own, so each damage fails its own row); then `dvc checkout` puts every output back. Returns validate's
    result, each damage's (row, message) and `dvc status` after the checkout."""
    root, env, _ = tiny_pipeline
    try:
        expected = {name: damage(root) for name, damage in DAMAGES.items()}
        result = sh(VALIDATE, root, env, check=False)
    finally:
        sh(["dvc", "checkout", "--force", "-q"], root, env, check=False)
    return result, expected, json.loads(sh(["dvc", "status", "--json"], root, env).stdout)


def validate_fails_naming(damaged_validation: tuple[Any, dict[str, tuple[str, str]], Any], name: str) -> None:
    """The damaged run fails validation: a non-zero exit with `FAILED <row>` naming the damage, and `dvc checkout`
    leaves a clean `dvc status` after it."""
    result, expected, status = damaged_validation
    failing, message = expected[name]
    output = f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode != 0, output
    failed = [line for line in result.stderr.splitlines() if line.startswith(f"FAILED {failing}:")]
    assert failed and message in failed[0], output
    assert status == {}


def test_corrupt_onnx_fails_validation_naming_the_file(damaged_validation) -> None:
    validate_fails_naming(damaged_validation, "corrupt onnx")


def test_missing_onnx_fails_validation_naming_the_file(damaged_validation) -> None:
    validate_fails_naming(damaged_validation, "missing onnx")


def test_missing_native_formats_fail_validation_naming_a_file(damaged_validation) -> None:
    validate_fails_naming(damaged_validation, "missing native formats")


def test_altered_native_file_fails_validation_naming_it(damaged_validation) -> None:
    validate_fails_naming(damaged_validation, "altered native file")


def edit_invalidates(tiny_pipeline: TinyRun, framework: str) -> dict[str, list]:
    """Edit one framework's package in the run: what `dvc status` says changed, i.e. the stages `dvc repro` would
    run first (downstream ones run only if those give other bytes); then the edit undone, `dvc status` clean.
    Not `dvc repro` itself: rerunning a framework's stages took 7 to 8 minutes of the suite and showed no more
    than this (a stage rerun to the same hashes is test_lineage.py's killed and resumed run)."""
    root, env, _ = tiny_pipeline
    source = root / f"packages/{framework}_impl/src/rosetta_{framework}/models.py"
    original = source.read_bytes()
    try:
        source.write_text(original.decode() + f"\n# an edit of {framework}\n")
        status = json.loads(sh(["dvc", "status", "--json"], root, env).stdout)
    finally:
        source.write_bytes(original)
    assert json.loads(sh(["dvc", "status", "--json"], root, env).stdout) == {}
    return status


def assert_invalidates_only(status: dict[str, list], framework: str) -> None:
    """Its own stages (train_export, and replicates, replicates_more and train_dp, which train with the same
    package), serve
    (whose framework server runs the same package) and report (which shows each package's models.py), each for a
    file of that package, and nothing else: no other framework's stage, not null_plan or validate (which read
    outputs only)."""
    assert set(status) == {f"{stage}@{framework}"
                           for stage in ("train_export", "replicates", "replicates_more", "train_dp")} | {
        "serve", "report"}, status
    for stage, changes in status.items():
        changed = {dep for change in changes for dep in change.get("changed deps", {})}
        assert changed and all(dep.startswith(f"packages/{framework}_impl/") for dep in changed), (stage, changes)


def test_editing_torch_package_invalidates_only_torch_stages(tiny_pipeline: TinyRun) -> None:
    assert_invalidates_only(edit_invalidates(tiny_pipeline, "torch"), "torch")


def test_editing_jax_package_invalidates_no_torch_or_tf_stage(tiny_pipeline: TinyRun) -> None:
    assert_invalidates_only(edit_invalidates(tiny_pipeline, "jax"), "jax")
