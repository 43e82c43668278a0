"""The report stage, built from a small real fixture set of artifacts (tests/report_fixtures.py): its content,
its verdict on a failing check, what DVC reads from it, and the HTML as headless Chromium renders it."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from matplotlib.image import imread
from report_fixtures import (
    FAILING,
    FRAMEWORKS,
    MODELS,
    REPO,
    browser_missing,
    cli_env,
    load_in_browser,
    make_artifacts,
)

from pipelines.report.analysis import shortfall
from pipelines.report.onnx_summary import summarize
from pipelines.report.sources import extract
from pipelines.stages.report import build

SECTIONS = ["verdict", "runs", "loss", "parity", "onnx", "latency", "sources", "environment", "checks"]


def built(root: Path, failing: bool) -> Path:
    make_artifacts(root, failing=failing)
    build(root, root / "reports", environments=None)
    return root / "reports"


@pytest.fixture(scope="module")
def passing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built(tmp_path_factory.mktemp("passing"), failing=False)


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built(tmp_path_factory.mktemp("failing"), failing=True)


def test_passing_run_has_a_passing_verdict_on_top(passing: Path) -> None:
    html = (passing / "report.html").read_text()
    md = (passing / "report.md").read_text()
    assert "PASSED: all 90 checks passed." in md.split("## Models")[0]
    assert html.index("PASSED: all 90 checks passed.") < html.index('id="runs"')
    for model in MODELS:
        summary = json.loads((passing / "summary" / f"{model}.json").read_text())
        assert summary["passed"] is True and summary["failed_checks"] == 0


def test_failing_check_is_named_in_the_verdict_with_how_much(failing: Path) -> None:
    md = (failing / "report.md").read_text()
    verdict = md.split("## Models")[0]
    assert "FAILED: 1 of 90 checks failed." in verdict
    row = next(line for line in verdict.splitlines() if FAILING["check"] in line)
    assert FAILING["model"] in row and "tf\\|jax" in row  # the pair, its pipe escaped for Markdown
    assert "3.20e-04" in row and "32x the tolerance" in row
    html = (failing / "report.html").read_text()
    verdict_html = html[html.index('id="verdict"') : html.index('id="runs"')]
    assert "FAILED: 1 of 90 checks failed." in verdict_html and FAILING["check"] in verdict_html
    assert 'class="verdict failed"' in verdict_html
    summaries = {m: json.loads((failing / "summary" / f"{m}.json").read_text()) for m in MODELS}
    assert summaries["cnn"]["passed"] is False and summaries["cnn"]["failed_checks"] == 1
    assert summaries["mlp"]["passed"] is True


def dvc_flatten(data: dict, prefix: str = "") -> set[str]:
    """The columns `dvc metrics show` prints for one file: one per leaf, nested keys joined by '.'; lists are
    dropped."""
    keys = set()
    for key, value in data.items():
        if isinstance(value, dict):
            keys |= dvc_flatten(value, f"{prefix}{key}.")
        elif not isinstance(value, list):
            keys.add(f"{prefix}{key}")
    return keys


def test_summary_is_headline_figures_in_at_most_12_columns(failing: Path) -> None:
    files = sorted((failing / "summary").glob("*.json"))
    assert [f.stem for f in files] == sorted(MODELS)  # one row per model
    columns = set().union(*(dvc_flatten(json.loads(f.read_text())) for f in files))
    assert len(columns) <= 12, sorted(columns)
    assert {f"{fw}.test_accuracy" for fw in FRAMEWORKS} | {f"{fw}.test_loss" for fw in FRAMEWORKS} <= columns
    cnn = json.loads((failing / "summary/cnn.json").read_text())
    assert cnn["worst_forward_parity_over_tol"] == pytest.approx(32.0)  # the failing pair, 32x its tolerance
    assert cnn["worst_step1_loss_over_tol"] == pytest.approx(0.02) and cnn["torch"]["test_accuracy"] == 0.97


def test_report_has_every_section_and_figure(passing: Path) -> None:
    html = (passing / "report.html").read_text()
    for section in SECTIONS:
        assert f'id="{section}"' in html and f'href="#{section}"' in html
    # Figures: per model loss curves, parity heat map and op histogram, plus one latency chart; all inline PNG.
    assert len(re.findall(r'<img src="data:image/png;base64,', html)) == 3 * len(MODELS) + 1
    assert "<script" not in html and "<link" not in html  # nothing to fetch, nothing to run
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "Content-Security-Policy" in html


def test_tables_show_runs_onnx_files_parity_and_latency(passing: Path) -> None:
    md = (passing / "report.md").read_text()
    # Per model and framework: parameters, accuracy, loss, training time and throughput, export times.
    assert "| torch | 1,210 | 97.00 % | 0.10000 |" in md and "| 2.00 s | 3,000 | 0.40 s | 1.50 s |" in md
    # Per ONNX file: size, opset, nodes, producer, I/O names and (symbolic) shapes; the op histogram.
    assert "| tf | `model.onnx` | 5.0 KiB | 17 | 9 | tf2onnx | 6 |" in md
    assert "images: float[B, 8, 8]" in md and "logits: float[batch, 10]" in md
    assert "| `Gemm` | 2 | 0 | 0 |" in md and "| `MatMul` | 0 | 2 | 2 |" in md
    # Parity: the matrix with the reference, training figures with their tolerances.
    assert "| **reference** | — | 2.00e-06 | 2.00e-06 | 2.00e-06 |" in md
    assert "2.00e-08 (tol 1e-06 ✓)" in md and "1.50e-04 (tol 0.001 ✓)" in md
    # Latency: medians and the ratio at batch 1 and 64.
    assert "| tf | 64 | 4.500 | 0.450 | 10.00x | 50 | 2 / 2 |" in md
    # Environment: lock hashes and the git revision, and params.yaml as written.
    lock = REPO / "packages/torch_impl/requirements-cpu.lock"
    assert subprocess.run(["sha256sum", str(lock)], capture_output=True, text=True).stdout.split()[0] in md
    assert "torch==2.13.0+cpu" in md and "Git revision:" in md and "embed_dim: 512" in md
    # What ran, as the bench stage recorded it, next to the lock's pins: read from reports/latency, not benchmarks/.
    environment = md.split("## Environment")[1]
    tf_row = next(line for line in environment.splitlines() if line.startswith("| tf | "))
    assert "`tensorflow-cpu==2.21.0`; `keras==3.15.1`; `onnxruntime==1.32.0`" in tf_row


def test_model_definitions_are_read_from_source(passing: Path) -> None:
    md = (passing / "report.md").read_text()
    definitions = md.split("## Model definitions")[1].split("## Environment")[0]
    assert "(MLP)" in definitions and "class MLP(nn.Module):" in definitions
    assert "(AddChannel, cnn)" in definitions  # a function plus the module's own layer it uses
    assert "(SelfAttention, AttentionClassifier)" in definitions
    assert "no class or function named after 'attention': whole file" in definitions
    assert "does not parse" in definitions and "this is not python (" in definitions


def test_sources_pick_the_root_definition_in_the_real_packages() -> None:
    for fw in FRAMEWORKS:
        for arch in MODELS:
            source = extract(REPO, fw, arch)
            if not (REPO / source.path).is_file():
                pytest.skip(f"{source.path} not written yet")
            assert source.names, f"{fw}/{arch}: {source.note}"
            assert arch in source.names[-1].lower() or arch in " ".join(source.names).lower()


def test_dvc_plot_files_overlay_the_frameworks(passing: Path) -> None:
    for model in MODELS:
        for fw in FRAMEWORKS:
            with open(passing / "plots" / "loss" / model / f"{fw}.csv") as f:
                rows = list(csv.DictReader(f))
            assert len(rows) == 60 and rows[0]["step"] == "1" and rows[-1]["epoch"] == "3"
    with open(passing / "plots" / "latency.csv") as f:
        latency = list(csv.DictReader(f))
    assert len(latency) == len(MODELS) * len(FRAMEWORKS) * 2
    assert {r["batch"] for r in latency} == {"1", "64"}


def test_dvc_yaml_declares_bench_report_and_plots_over_report_outputs() -> None:
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    bench, report = dvc["stages"]["bench"], dvc["stages"]["report"]
    assert "pipelines.runner ${item.framework}" in bench["cmd"]
    assert "artifacts/${item.model}/${item.framework}/model.onnx" in bench["deps"]
    assert report["cmd"] == "python -m pipelines.stages.report"
    assert "reports/validation.json" in report["deps"] and "reports/latency" in report["deps"]
    plotted = {
        path
        for plot in dvc["plots"]
        for spec in plot.values()
        for axis in ("x", "y")
        if isinstance(spec.get(axis), dict)
        for path in spec[axis]
    }
    expected = {f"reports/plots/loss/{m}/{fw}.csv" for m in MODELS for fw in FRAMEWORKS}
    assert expected <= plotted
    assert all(p.startswith("reports/plots/") for p in plotted)


@pytest.mark.skipif(shutil.which("dvc") is None and not (REPO / ".venv/bin/dvc").is_file(), reason="no dvc")
def test_dvc_metrics_and_plots_show_read_the_report_outputs(failing: Path) -> None:
    root = failing.parent
    env = cli_env(DVC_NO_ANALYTICS="1")  # offline machines: no telemetry attempt
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["dvc", "init", "-q"], cwd=root, env=env, check=True)
    metrics = subprocess.run(
        ["dvc", "metrics", "show", "--json"], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    data = json.loads(metrics.stdout)[""]["data"]
    summaries = {path: found["data"] for path, found in data.items() if path.startswith("reports/summary/")}
    assert sorted(summaries) == sorted(f"reports/summary/{m}.json" for m in MODELS)
    assert summaries["reports/summary/cnn.json"]["failed_checks"] == 1
    assert summaries["reports/summary/cnn.json"]["worst_forward_parity_over_tol"] == pytest.approx(32.0)
    assert summaries["reports/summary/mlp.json"]["tf"]["test_loss"] == pytest.approx(0.1)
    assert len(set().union(*(dvc_flatten(d) for d in summaries.values()))) <= 12
    plots = subprocess.run(
        ["dvc", "plots", "show", "--json"], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    rendered = json.loads(plots.stdout)["data"]
    for model in MODELS:
        content = rendered[f"loss_{model}"][0]["content"]
        assert {v["filename"] for v in content["data"]["values"]} == {f"{fw}.csv" for fw in FRAMEWORKS}
    assert len(rendered["latency_ratio"][0]["content"]["data"]["values"]) == 18
    assert len(rendered["latency_ms"][0]["content"]["data"]["values"]) == 36


def test_missing_inputs_are_reported_not_fatal(tmp_path: Path) -> None:
    make_artifacts(tmp_path)
    (tmp_path / "artifacts/cnn/jax/model.onnx").unlink()
    (tmp_path / "reports/latency/mlp/tf.json").unlink()
    (tmp_path / "artifacts/attention/torch/export.json").write_text("{ not json")
    build(tmp_path, tmp_path / "reports", environments=None)
    md = (tmp_path / "reports/report.md").read_text()
    verdict = md.split("## Models")[0]
    assert "`artifacts/cnn/jax/model.onnx: missing`" in verdict
    assert "`reports/latency/mlp/tf.json: missing`" in verdict
    assert "artifacts/attention/torch/export.json: unreadable (JSONDecodeError" in verdict
    assert "| jax | `model.onnx` | missing |" in md


def test_no_validation_report_means_not_validated(tmp_path: Path) -> None:
    make_artifacts(tmp_path)
    (tmp_path / "reports/validation.json").unlink()
    build(tmp_path, tmp_path / "reports", environments=None)
    assert "NOT VALIDATED" in (tmp_path / "reports/report.md").read_text()
    summary = json.loads((tmp_path / "reports/summary/mlp.json").read_text())
    assert summary["passed"] is False and summary["failed_checks"] is None


def test_onnx_summary_reads_opset_ops_and_io(passing: Path) -> None:
    summary = summarize(passing.parent / "artifacts/mlp/jax/model.onnx")
    assert summary.opset == 23 and summary.producer == "jax2onnx" and summary.nodes == 7
    assert summary.ops["MatMul"] == 2 and summary.ops["Identity"] == 1
    assert [str(t) for t in summary.inputs] == ["images: float[B, 8, 8]"]
    assert summary.initializer_values == 64 * 16 + 16 + 16 * 10 + 10 + 2


def test_shortfall_says_how_far_from_passing() -> None:
    assert shortfall(3.2e-4, 1e-5) == "0.00032 > tolerance 1e-05 (32x the tolerance)"
    assert shortfall(0.91, 0.95).startswith("0.91 < required 0.95")
    assert shortfall(0.02, 0.0) == "0.02 where exactly 0 is required"
    assert shortfall(None, 1e-5, "ONNX file is missing") == "ONNX file is missing"


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_html_renders_offline_in_headless_chromium(failing: Path, tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    page = load_in_browser(failing / "report.html", png)
    assert page["title"] == "Rosetta: artifact comparison report"
    assert page["errors"] == []  # no console error, uncaught exception or failed load
    assert len(page["images"]) == 3 * len(MODELS) + 1
    assert all(img["complete"] and img["width"] > 0 for img in page["images"]), page["images"]
    # Only the file itself and its inline images: the report opens with no network.
    assert page["requests"] and all(url.startswith(("file://", "data:")) for url in page["requests"]), page["requests"]

    pixels = imread(png)[..., :3]
    non_white = np.any(pixels < 0.95, axis=-1).mean()
    assert non_white > 0.01, f"screenshot is blank ({non_white:.2%} non-white pixels)"
