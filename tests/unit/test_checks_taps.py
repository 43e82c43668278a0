"""The validate stage's per-layer taps (pipelines/checks/taps.py), in numpy alone: reading taps.npz, the figures,
the init_taps_vs_reference check, and the first divergent tap named in every kind of failing check's detail."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Ledger
from pipelines.checks.taps import Comparison, compare, localize, read_taps, tap_figures, taps_record
from rosetta_common.io import dumps
from rosetta_common.reference import forward_with_taps
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_common.weights import Weights

TOL = 1e-5  # params.yaml's tolerances.forward_parity_abs
CONFIG = small_config("cnn", (6, 6))
BATCH = np.random.default_rng(0).random((4, 6, 6), dtype=np.float32)


def reference(weights: Weights) -> dict[str, np.ndarray]:
    return forward_with_taps(CONFIG, weights, BATCH)


def moved(taps: dict[str, np.ndarray], at: str, by: float) -> dict[str, np.ndarray]:
    """The taps with `at` and every later tap shifted by `by` (a mistake shows where it enters and after)."""
    names_ = list(taps)
    return {n: t + by if names_.index(n) >= names_.index(at) else t.copy() for n, t in taps.items()}


def write_run(root: Path, fw: str, init: dict[str, np.ndarray], trained: dict[str, np.ndarray]) -> None:
    run = root / paths.run_dir("cnn", fw)
    run.mkdir(parents=True)
    buffer = io.BytesIO()
    np.savez(buffer, **{f"init/{k}": v for k, v in init.items()}, **{f"trained/{k}": v for k, v in trained.items()})
    (run / paths.TAPS_FILE).write_bytes(buffer.getvalue())


def test_comparison_names_the_first_tap_over_the_tolerance_and_the_worst() -> None:
    ref = reference(asymmetric_weights(CONFIG, 1))
    c = Comparison.of(moved(ref, "pool", 3 * TOL), ref, TOL)
    assert c.first == "pool"
    assert c.worst()[1] == pytest.approx(3 * TOL, rel=1e-6)
    assert "first divergent tap pool" in c.says()
    assert Comparison.of(moved(ref, "pool", 0.5 * TOL), ref, TOL).first is None  # within the bound: none
    record = c.record()
    assert [t["tap"] for t in record["taps"]] == list(ref) and record["first_divergent"] == "pool"
    assert record["taps"][0]["max_abs"] == 0.0 and record["taps"][-1]["max_abs"] == pytest.approx(3 * TOL)


def test_a_nan_tap_is_divergent_and_written_as_null() -> None:
    ref = reference(asymmetric_weights(CONFIG, 2))
    bad = {k: v.copy() for k, v in ref.items()}
    bad["conv2"][0, 0, 0, 0] = np.nan
    c = Comparison.of(bad, ref, TOL)
    assert c.first == "conv2" and c.worst()[0] == "conv2"
    json.loads(dumps(c.record()))  # the validation report refuses NaN: a non-finite figure must be null
    assert c.record()["taps"][3]["max_abs"] is None


def test_read_taps_refuses_missing_or_misshapen_taps(tmp_path: Path) -> None:
    ref = reference(asymmetric_weights(CONFIG, 3))
    write_run(tmp_path, "torch", ref, ref)
    got = read_taps(tmp_path / paths.taps("cnn", "torch"), CONFIG, len(BATCH))
    assert list(got["init"]) == list(ref)
    with pytest.raises(ValueError, match="shape"):
        read_taps(tmp_path / paths.taps("cnn", "torch"), CONFIG, len(BATCH) + 1)
    write_run(tmp_path, "tf", {k: v for k, v in ref.items() if k != "pool"}, ref)
    with pytest.raises(ValueError, match="init taps"):
        read_taps(tmp_path / paths.taps("cnn", "tf"), CONFIG, len(BATCH))


def test_tap_figures_judge_each_framework_and_localize_failing_checks(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's conv2 is off (a planted mistake), tf and jax agree with the reference: torch fails
    init_taps_vs_reference at conv2, and every failing check that involves it says so; a failing check of the
    agreeing pair says where else the difference must be."""
    init = asymmetric_weights(CONFIG, 4)
    trained = {fw: asymmetric_weights(CONFIG, 5 + i) for i, fw in enumerate(("torch", "tf", "jax"))}
    ref = reference(init)
    write_run(tmp_path, "torch", moved(ref, "conv2", 100 * TOL), reference(trained["torch"]))
    write_run(tmp_path, "tf", ref, moved(reference(trained["tf"]), "logits", 100 * TOL))
    write_run(tmp_path, "jax", ref, reference(trained["jax"]))
    monkeypatch.chdir(tmp_path)
    ledger = Ledger()
    failing = [  # (subject, check) as the other checks would have failed
        ("torch", names.INIT_ONNX_VS_REFERENCE), ("torch|tf", names.FORWARD_PARITY_INIT_ONNX),
        ("torch|jax", names.TRAIN_STEP1_LOSS_REL), ("tf|jax", names.TRAIN_LOCKSTEP_LOSS_REL),
        ("tf|jax", names.FORWARD_PARITY_INIT_ONNX), ("jax", names.INIT_ONNX_VS_NATIVE),
        ("tf", names.ONNX_VS_NATIVE), ("jax", names.ONNX_VS_NATIVE),
    ]
    for subject, check in failing:
        ledger.add("cnn", subject, check, 1.0, 0.5, detail="measured")
    ledger.add("cnn", "torch", names.MIN_TEST_ACCURACY, 0.0, 0.5)  # not a check the taps explain
    figures = tap_figures(ledger, "cnn", CONFIG, ["torch", "tf", "jax"], BATCH, init, trained, TOL)
    localize(ledger, "cnn", figures)
    rows = {(c.subject, c.name): c for c in ledger.checks}

    for fw in ("torch", "tf", "jax"):
        row = rows[(fw, names.INIT_TAPS_VS_REFERENCE)]
        assert row.tolerance == TOL and row.passed is (fw != "torch"), row
    assert rows[("torch", names.INIT_TAPS_VS_REFERENCE)].value == pytest.approx(100 * TOL, rel=1e-4)
    assert "first divergent tap conv2" in rows[("torch", names.INIT_TAPS_VS_REFERENCE)].detail
    assert "first divergent tap conv2" in rows[("torch", names.INIT_ONNX_VS_REFERENCE)].detail
    assert rows[("torch", names.INIT_ONNX_VS_REFERENCE)].detail.startswith("measured; ")
    assert "first divergent tap conv2" in rows[("torch|tf", names.FORWARD_PARITY_INIT_ONNX)].detail
    assert "first divergent tap conv2" in rows[("torch|jax", names.TRAIN_STEP1_LOSS_REL)].detail
    assert "backward pass or the optimizer" in rows[("tf|jax", names.TRAIN_LOCKSTEP_LOSS_REL)].detail
    assert "in an ONNX conversion" in rows[("tf|jax", names.FORWARD_PARITY_INIT_ONNX)].detail
    assert "in the ONNX conversion" in rows[("jax", names.INIT_ONNX_VS_NATIVE)].detail
    # trained ONNX against native: the framework's trained taps against the reference on its own trained weights
    assert "first divergent tap logits" in rows[("tf", names.ONNX_VS_NATIVE)].detail
    assert "in the ONNX conversion" in rows[("jax", names.ONNX_VS_NATIVE)].detail
    assert rows[("torch", names.MIN_TEST_ACCURACY)].detail == ""

    record = json.loads(dumps(taps_record("cnn", figures)))
    assert record["init"]["vs_reference"]["torch"]["first_divergent"] == "conv2"
    assert record["init"]["pairs"]["torch|tf"]["first_divergent"] == "conv2"
    assert record["init"]["pairs"]["tf|jax"]["first_divergent"] is None
    assert record["trained"]["vs_reference"]["tf"]["first_divergent"] == "logits"
    assert set(record["trained"]["pairs"]) == {"torch|tf", "torch|jax", "tf|jax"}
    entry = record["init"]["vs_reference"]["torch"]["taps"][3]
    assert entry["tap"] == "conv2" and set(entry) == {"tap", "max_abs", "scale", "rel"}
    # trained figures are figures only: the trained taps of tf, off at its logits, fail no check
    assert all(c.passed for c in ledger.checks if c.name == names.INIT_TAPS_VS_REFERENCE and c.subject == "tf")


def test_an_unreadable_taps_file_fails_its_own_check_and_the_others_are_still_compared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    init = asymmetric_weights(CONFIG, 9)
    ref = reference(init)
    write_run(tmp_path, "torch", ref, ref)
    (tmp_path / paths.run_dir("cnn", "tf")).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    ledger = Ledger()
    figures = tap_figures(ledger, "cnn", CONFIG, ["torch", "tf"], BATCH, init, {"torch": init}, TOL)
    rows = {(c.subject, c.name): c for c in ledger.checks}
    assert not rows[("tf", names.TAPS_READABLE)].passed
    assert rows[("torch", names.INIT_TAPS_VS_REFERENCE)].passed
    assert list(figures["init"]["vs_reference"]) == ["torch"] and figures["init"]["pairs"] == {}


def test_compare_pairs_every_two_frameworks_once() -> None:
    ref = reference(asymmetric_weights(CONFIG, 10))
    out = compare({"torch": ref, "tf": ref, "jax": ref}, {"torch": ref, "tf": ref, "jax": ref}, TOL)
    assert list(out["pairs"]) == ["torch|tf", "torch|jax", "tf|jax"]
    assert all(c.first is None and c.worst()[1] == 0.0 for c in out["pairs"].values())


def test_a_failing_end_of_training_check_names_the_first_divergent_trained_tap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistake no init forward shows (BatchNorm's momentum convention moves only the running statistics): the
    init taps agree, torch's trained taps part from the others' at pool. A failing end-of-training check of a pair
    names the pair's first divergent trained tap; a lockstep check's detail is as before; a check judged against
    the replicates' null is left to judge_nulls."""
    init, trained = asymmetric_weights(CONFIG, 11), asymmetric_weights(CONFIG, 12)
    ref, after = reference(init), reference(trained)
    write_run(tmp_path, "torch", ref, moved(after, "pool", 100 * TOL))
    write_run(tmp_path, "tf", ref, after)
    write_run(tmp_path, "jax", ref, after)
    monkeypatch.chdir(tmp_path)
    ledger = Ledger()
    for subject, check in [("torch|tf", names.statistic_check("running_mean")), ("torch|jax", names.TEST_LOSS_REL),
                           ("tf|jax", names.PREDICTION_DISAGREEMENT), ("torch|tf", names.TRAIN_LOCKSTEP_LOSS_REL)]:
        ledger.add("cnn", subject, check, 1.0, 0.5, detail="measured")
    ledger.add_null("cnn", "torch|jax", names.TEST_ACCURACY_POINTS, 1.0, 0.5, {"p_value": 0.5}, "runs part")
    figures = tap_figures(ledger, "cnn", CONFIG, ["torch", "tf", "jax"], BATCH, init, dict.fromkeys(
        ("torch", "tf", "jax"), trained), TOL)
    localize(ledger, "cnn", figures)
    rows = {(c.subject, c.name): c for c in ledger.checks}

    for subject, check in [("torch|tf", names.statistic_check("running_mean")), ("torch|jax", names.TEST_LOSS_REL)]:
        detail = rows[(subject, check)].detail
        assert detail.startswith("measured; the init forward taps of"), detail
        assert f"trained taps of {subject}: first divergent tap pool " in detail, detail
    assert rows[("tf|jax", names.PREDICTION_DISAGREEMENT)].detail.endswith(
        "; trained taps of tf|jax: every tap within 1e-05")
    lockstep = rows[("torch|tf", names.TRAIN_LOCKSTEP_LOSS_REL)].detail
    assert lockstep.endswith("backward pass or the optimizer") and "trained taps" not in lockstep
    assert rows[("torch|jax", names.TEST_ACCURACY_POINTS)].detail == "runs part"
    assert all(name in names.TAP_LOCALIZED for name in names.END_OF_TRAINING_PAIR)
