"""The report as headless Chromium renders it (Debian's chromium and chromium-driver; `make browser` installs them):
offline, every figure loaded, the first screen at 1400x900 the models-by-frameworks matrix, and the tables its
script draws from measurements/timings.js. The report is built from the real fixture set of
tests/support/report_fixtures.py; skipped, saying why, where no browser is installed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from pipelines import measurements, paths
from pipelines.report.render import MEASUREMENTS_TITLE
from pipelines.stages.report import build
from support.report_fixtures import (
    FRAMEWORKS,
    MODELS,
    PARTED,
    browser_missing,
    built_report,
    deployment_row,
    load_in_browser,
    make_artifacts,
    make_measurements,
    run_in_browser,
)

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
ABSENT = "No measurements here: measurements/timings.js is absent."


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_report(tmp_path_factory.mktemp("failing"), failing=True)


def _timings_js_missing(entry: dict) -> bool:
    return "measurements/timings.js" in entry.get("message", "") and "ERR_FILE_NOT_FOUND" in entry.get("message", "")


def test_html_renders_offline_in_headless_chromium(failing: Path, tmp_path: Path) -> None:
    """Without measurements (as after `dvc pull`): every figure, and the sentence saying they are absent."""
    png = tmp_path / "report.png"
    assert not (failing.parent.parent / "measurements").exists()
    page = load_in_browser(failing / "report.html", png)
    assert page["title"] == "Rosetta: artifact comparison report"
    # No console error, uncaught exception or failed load, but the absent measurements file's.
    assert [e for e in page["errors"] if not _timings_js_missing(e)] == [], page["errors"]
    # loss curves, parity heat map, taps, op histogram; and where cnn's trainings part (the one model with replicates)
    assert len(page["images"]) == 4 * len(MODELS) + 1
    assert all(img["complete"] and img["width"] > 0 for img in page["images"]), page["images"]
    # Only the file itself, its inline images and the measurements script: the report opens with no network.
    assert page["requests"] and all(url.startswith(("file://", "data:")) for url in page["requests"]), page["requests"]
    assert any(url.endswith("/measurements/timings.js") for url in page["requests"])
    assert MEASUREMENTS_TITLE in page["measurements"]["text"]
    assert ABSENT in page["measurements"]["text"] and page["measurements"]["rows"] is None

    pixels = imread(png)[..., :3]
    non_white = np.any(pixels < 0.95, axis=-1).mean()
    assert non_white > 0.01, f"screenshot is blank ({non_white:.2%} non-white pixels)"


FIRST_SCREEN = """
const table = document.getElementById('overview');
const box = table.getBoundingClientRect();
const checks = [...document.querySelectorAll('#checks tr')].map(r => [...r.cells].map(c => c.innerText));
return {box: {top: box.top, bottom: box.bottom, left: box.left, right: box.right},
        viewport: [window.innerWidth, window.innerHeight],
        rows: [...table.rows].map(r => [...r.cells].map(c => c.innerText)),
        links: [...table.querySelectorAll('a')].map(a => a.getAttribute('href')),
        checks: checks};
"""


def test_first_screen_is_the_models_by_frameworks_matrix(failing: Path) -> None:
    """At 1400x900 the matrix is on the first screen: per model each framework's test accuracy, the step where each
    pair's runs part, the verdict and the check closest to failing; a null-judged check shows its statistic,
    p-value and Holm threshold, not the float32 bound it exceeds."""
    found, errors = run_in_browser(failing / "report.html", FIRST_SCREEN, window=(1400, 900))
    assert [e for e in errors if not _timings_js_missing(e)] == [], errors
    width, height = found["viewport"]
    box = found["box"]
    assert 0 <= box["top"] < box["bottom"] <= height and 0 <= box["left"] < box["right"] <= width, found
    rows = found["rows"]
    assert rows[0] == ["", "test accuracy", "runs part at", "verdict"]
    assert rows[1] == ["model", *FRAMEWORKS, "torch|tf", "torch|jax", "tf|jax", "checks", "closest to failing"]
    by_model = {row[0]: row for row in rows[2:]}
    assert list(by_model) == MODELS
    assert by_model["mlp"][1:8] == ["97.00 %", "96.90 %", "96.80 %", "never", "never", "never", "✓ all 30 passed"]
    assert by_model["cnn"][4:8] == [f"step {PARTED[('cnn', 'torch|tf')]}", f"step {PARTED[('cnn', 'torch|jax')]}",
                                    "never", "✗ 1 of 30 failed"]
    # cnn's closest: its test loss, judged by the null (p 0.054 against its Holm threshold 0.05), torch|tf first.
    assert by_model["cnn"][8] == "p 0.054, Holm 0.05\ntest_loss_rel torch|tf"
    assert by_model["mlp"][8] == "30 % of its tolerance\nforward_parity_init_onnx tf|jax"
    for model in MODELS:
        assert {f"#runs-{model}", f"#parity-{model}", f"#checks-{model}"} <= set(found["links"])
    # The null-judged row of the checks table: value, then the null's p-value and Holm threshold, its pseudo-F.
    null_row = next(r for r in found["checks"] if r[:2] == ["torch|tf", "test_loss_rel"] and "2.67e-02" in r)
    assert null_row[3].startswith("p 0.054 vs Holm 0.05\npseudo-F 2.41 (runs and replicates: torch 6, tf 6, "
                                  "jax 6)"), null_row
    assert "tol" not in null_row[3] and null_row[4] == "yes"


def test_browser_shows_the_measurements_of_this_run(failing: Path, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(failing.parent.parent, root)
    make_measurements(root, skip=(("attention", "jax"),), throughput=True)
    page = load_in_browser(root / paths.REPORT / "report.html", tmp_path / "report.png")
    assert page["errors"] == []
    assert ABSENT not in page["measurements"]["text"]
    rows = page["measurements"]["rows"]
    assert rows[0][:4] == ["model", "framework", "train time", "steady samples/s"]
    assert "batch 1: native / ORT" in rows[0] and "batch 64: ONNX Runtime ms" in rows[0]
    assert [r[:2] for r in rows[1:]] == [[m, fw] for m in MODELS for fw in FRAMEWORKS]
    tf_mlp = next(r for r in rows if r[:2] == ["mlp", "tf"])
    # train time, steady samples/s, then per batch: native ms, ORT ms, native / ORT (tf at batch 64: 10x).
    assert tf_mlp[2:4] == ["3.46 s", "2,469"] and tf_mlp[-3:] == ["4.500", "0.450", "10.00x"]
    assert next(r for r in rows if r[:2] == ["attention", "jax"])[2] == "not measured on this machine"
    assert "8 of 9 runs measured on x86_64, 4 cores" in page["measurements"]["text"]
    # Each stage's wall time, start-up first: runner, interpreter, imports, framework import, then its phases.
    text = page["measurements"]["text"]
    assert "Wall time per stage" in text
    tf_stage = next(line for line in text.splitlines() if line.startswith("train_export@tf"))
    assert tf_stage.split("\t")[:5] == ["train_export@tf", "0.13 s", "0.03 s", "0.75 s", "7.25 s"], tf_stage
    assert "mlp.train 3.46 s" in tf_stage and tf_stage.split("\t")[-1] == "30.50 s"
    # The training-throughput benchmark's table: torch 1408 samples in 0.02 s against 0.025 s, tf 0.05 against 0.04.
    assert "Training throughput: our train() against each framework's idiomatic loop" in text
    bench = [line.split("\t") for line in text.splitlines() if line.startswith("digits\t")]
    assert bench == [
        ["digits", "torch", "mlp", "1,408", "3", "70,400", "56,320", "1.25x", "1.25\u20131.25", "ok", "0.50 s",
         "0.50 s"],
        ["digits", "tf", "mlp", "1,408", "3", "28,160", "35,200", "0.80x", "0.80\u20130.80", "parity cost", "0.50 s",
         "0.50 s"]], bench


def test_the_report_draws_the_measured_table_under_the_facts(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    make_artifacts(root)
    build(root)
    found = root / measurements.ROOT
    found.mkdir()
    row = {**deployment_row("onnx", "jax", 1.6), "needs_model_code": True}
    (found / measurements.DEPLOYMENT.name).write_text(json.dumps({
        "settings": {"repeats": 5, "calls": 50, "threads": "2"}, "rows": [row],
        "environments": {"validation": {"bytes": 385 * 2**20, "runtime_bytes": 72 * 2**20}}}))
    measurements.refresh(found)
    page, errors = run_in_browser(root / paths.REPORT / "report.html",
        "const s = document.getElementById('deployment-measured');"
        "const t = document.getElementById('deployment-table');"
        "return {section: s ? s.closest('section').id : null, text: s ? s.innerText : null,"
        " rows: t ? [...t.rows].map(r => [...r.cells].map(c => c.innerText)) : null}")
    assert errors == []
    assert page["section"] == "deployment"
    assert page["rows"][0][:4] == ["model", "format", "export of", "size"]
    assert page["rows"][1] == ["cnn", "onnx", "jax", "2.0 KiB", "0.05 s", "1.00 s", "0.02 s", "0.7 ms", "1.60 s",
                               "1.7 ms", "0.060 / 0.080 ms", "0.900 / 1.200 ms", "58.5 MiB", "validation 385.0 MiB",
                               "72.0 MiB", "yes"]
    assert "Medians over 5 fresh processes" in page["text"] and "threads 2" in page["text"]
