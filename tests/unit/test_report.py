"""The report stage, built from a small real fixture set of artifacts (tests/support/report_fixtures.py): its
content, its verdict on a failing check, what DVC reads from it, that it is byte-stable and independent of the
measurements of a run. The page as headless Chromium renders it: tests/system/test_report_page.py."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipelines import paths
from pipelines.report.analysis import shortfall
from pipelines.report.onnx_summary import summarize
from pipelines.report.render import MEASUREMENTS_JS, MEASUREMENTS_TITLE
from pipelines.report.sources import extract
from pipelines.stages.report import build, main
from rosetta_common.spec import ARCHITECTURES
from support.report_fixtures import (
    FAILING,
    FAILING_TAP,
    FRAMEWORKS,
    MODELS,
    NEW_MODELS,
    REPO,
    TRAIN_SECONDS,
    built_report,
    cli_env,
    make_artifacts,
    make_measurements,
)

SECTIONS = ["verdict", "runs", "loss", "parity", "taps", "onnx", "measurements", "sources", "environment", "checks"]
# What dvc.yaml should declare for the report (the stage, and the top-level metrics and plots over its outputs
# and over measurements/): test_dvc_yaml_declares_the_report_as_proposed holds the repository's file to it.
REPORT_DEPS = [
    "pipelines/stages/report.py",
    "pipelines/report",
    "pipelines/paths.py",
    "pipelines/environments.py",
    "pyproject.toml",
    "packages/common/src",
    "packages/torch_impl/src/rosetta_torch/models.py",
    "packages/tf_impl/src/rosetta_tf/models.py",
    "packages/jax_impl/src/rosetta_jax/models.py",
    "packages/torch_impl/requirements-cpu.lock",
    "packages/tf_impl/requirements-cpu.lock",
    "packages/jax_impl/requirements-cpu.lock",
    "packages/validation/requirements-cpu.lock",
    "requirements.lock",
    "artifacts",
    "reports/validation.json",
]
PROPOSED_DVC = {
    "stages": {
        "report": {
            "cmd": "python -m pipelines.stages.report",
            "deps": REPORT_DEPS,
            "params": [{"params.yaml": None}],
            "outs": ["reports/comparison"],
        }
    },
    "metrics": ["reports/comparison/summary", "measurements/metrics"],
    "plots": [
        {"reports/comparison/plots/loss": {"template": "linear", "x": "step", "y": ["torch", "tf", "jax"],
                                           "title": "training loss per step", "x_label": "step",
                                           "y_label": "loss"}},
        {"measurements/latency.csv": {"template": "bar_horizontal", "x": "native_over_onnx", "y": "case",
                                      "title": "Latency, native / ONNX Runtime (median; above 1: ONNX Runtime "
                                               "faster; a measurement of this run)",
                                      "x_label": "native / ONNX Runtime", "y_label": "model/framework/batch"}},
    ],
}


@pytest.fixture(scope="module")
def passing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_report(tmp_path_factory.mktemp("passing"), failing=False)


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_report(tmp_path_factory.mktemp("failing"), failing=True)


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_passing_run_has_a_passing_verdict_on_top(passing: Path) -> None:
    html = (passing / "report.html").read_text()
    md = (passing / "report.md").read_text()
    assert "PASSED: all 90 checks passed." in md.split("## Models")[0]
    assert html.index("PASSED: all 90 checks passed.") < html.index('id="runs"')
    for model in MODELS:
        summary = json.loads((passing / "summary" / f"{model}.json").read_text())
        assert summary["passed"] is True


def test_the_stage_publishes_one_folder(passing: Path) -> None:
    assert passing == passing.parent.parent / "reports" / "comparison"
    names = set(contents(passing))
    expected = {"report.html", "report.md", *(f"summary/{m}.json" for m in MODELS),
                *(f"plots/loss/{m}.csv" for m in MODELS)}
    assert names == expected
    assert sorted(p.name for p in (passing.parent.parent / "reports").iterdir()) == ["comparison", "validation.json"]


def test_failing_check_is_named_in_the_verdict_with_how_much(failing: Path) -> None:
    md = (failing / "report.md").read_text()
    verdict = md.split("## Models")[0]
    assert "FAILED: 1 of 90 checks failed." in verdict
    failed = verdict.split("**Failed checks**")[1]  # under the first screen's matrix
    row = next(line for line in failed.splitlines() if FAILING["check"] in line)
    assert FAILING["model"] in row and "tf\\|jax" in row  # the pair, its pipe escaped for Markdown
    assert "3.20e-04" in row and "32x the tolerance" in row
    html = (failing / "report.html").read_text()
    verdict_html = html[html.index('id="verdict"') : html.index('id="runs"')]
    assert "FAILED: 1 of 90 checks failed." in verdict_html and FAILING["check"] in verdict_html
    assert 'class="verdict failed"' in verdict_html
    summaries = {m: json.loads((failing / "summary" / f"{m}.json").read_text()) for m in MODELS}
    assert summaries["cnn"]["passed"] is False
    assert summaries["mlp"]["passed"] is True


def test_failing_forward_check_links_to_the_taps_figure_that_shows_where_it_parts(failing: Path,
                                                                                passing: Path) -> None:
    html = (failing / "report.html").read_text()
    verdict_html = html[html.index('id="verdict"') : html.index('id="runs"')]
    anchor = f"#taps-{FAILING['model']}"
    assert f'<a href="{anchor}">{FAILING["check"]}</a>' in verdict_html  # the failed check links to the figure
    assert f'id="{anchor[1:]}"' in html
    figure = html[html.index(f'id="{anchor[1:]}"'):]
    assert figure.index('alt="cnn max abs error along the taps"') < figure.index("<h3")  # under its heading
    md = (failing / "report.md").read_text()
    failed = md.split("## Models")[0].split("**Failed checks**")[1]
    row = next(line for line in failed.splitlines() if FAILING["check"] in line)
    assert f"(report.html{anchor})" in row  # Markdown has no figures: it links report.html's
    taps = md.split("## Per-layer taps")[1].split("\n## ")[0]
    cnn = taps.split("**cnn: where the forwards part**")[1].split("\n\n**")[0]
    escaped = FAILING["framework"].replace("|", "\\|")  # as Markdown cells escape a pair's pipe
    pair = next(line for line in cnn.splitlines() if line.startswith(f"| {escaped} |"))
    assert f"`{FAILING_TAP}`" in pair  # the failing pair's first divergent init tap
    clean = next(line for line in cnn.splitlines() if line.startswith("| torch vs reference |"))
    assert clean.split(" | ")[1] == "none"
    # A passing run links nothing: a link marks a failure the taps explain.
    assert '<a href="#taps-' not in (passing / "report.html").read_text()


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


def test_summary_is_headline_figures_in_at_most_10_keys(failing: Path, tmp_path: Path) -> None:
    files = sorted((failing / "summary").glob("*.json"))
    assert [f.stem for f in files] == sorted(MODELS)  # one row per model
    for f in files:
        assert len(dvc_flatten(json.loads(f.read_text()))) <= 10, f
    columns = set().union(*(dvc_flatten(json.loads(f.read_text())) for f in files))
    expected = {f"{fw}.{key}" for fw in FRAMEWORKS for key in ("test_accuracy", "test_loss")}
    expected |= {"worst_forward_parity_over_tol", "worst_step1_loss_over_tol", "worst_test_loss_over_tol", "passed"}
    assert columns == expected
    # With the measurements' own metrics files, `dvc metrics show` stays within 12 columns.
    measured = make_measurements(tmp_path) / "metrics"
    columns |= set().union(*(dvc_flatten(json.loads(f.read_text())) for f in measured.glob("*.json")))
    assert len(columns) <= 12, sorted(columns)
    cnn = json.loads((failing / "summary/cnn.json").read_text())
    assert cnn["worst_forward_parity_over_tol"] == pytest.approx(32.0)  # the failing pair, 32x its tolerance
    assert cnn["worst_step1_loss_over_tol"] == pytest.approx(0.02) and cnn["torch"]["test_accuracy"] == 0.97
    # cnn's torch|tf and torch|jax test losses parted and were judged by the null: only tf|jax's 1.5e-4 counts.
    assert cnn["worst_test_loss_over_tol"] == pytest.approx(0.15)


def test_quality_figures_come_from_the_validate_stage_when_it_records_them(tmp_path: Path) -> None:
    make_artifacts(tmp_path)
    validation = json.loads((tmp_path / paths.VALIDATION).read_text())
    validation["runs"] = [{"model": "mlp", "framework": "tf", "test_accuracy": 0.5, "test_loss": 1.25}]
    (tmp_path / paths.VALIDATION).write_text(json.dumps(validation))
    build(tmp_path)
    summary = json.loads((tmp_path / paths.summary("mlp")).read_text())
    assert summary["tf"] == {"test_accuracy": 0.5, "test_loss": 1.25}  # the validate stage's figures
    assert summary["torch"] == {"test_accuracy": 0.97, "test_loss": 0.1}  # not recorded there: metrics.json's
    assert "| tf | 1,210 | 50.00 % | 1.25000 |" in (tmp_path / paths.REPORT / "report.md").read_text()


def test_report_has_every_section_and_figure(passing: Path) -> None:
    html = (passing / "report.html").read_text()
    for section in SECTIONS:
        assert f'id="{section}"' in html and f'href="#{section}"' in html
    # Figures: per model loss curves, parity heat map, taps and op histogram, and where cnn's trainings part; all
    # inline PNG. No latency chart.
    assert len(re.findall(r'<img src="data:image/png;base64,', html)) == 4 * len(MODELS) + 1
    assert 'alt="cnn where the trainings part"' in html
    for model in MODELS:
        assert f'id="taps-{model}"' in html and f'alt="{model} max abs error along the taps"' in html
    assert "<link" not in html and not re.search(r'(src|href)="(https?:)?//', html)
    # One script file, the measurements (relative to the page), and one inline script, allowed by its hash.
    assert re.findall(r'<script src="([^"]*)"', html) == [MEASUREMENTS_JS] == ["../../measurements/timings.js"]
    assert (passing.parent.parent / "reports/comparison" / MEASUREMENTS_JS).resolve() == (
        passing.parent.parent / "measurements/timings.js"
    )
    inline = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    assert len(inline) == 1
    digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1)
    script_src = csp.split("script-src")[1].split(";")[0]
    assert script_src.split() == ["'self'", "file:", f"'sha256-{digest}'"] and "default-src 'none'" in csp
    measurements = html[html.index('id="measurements"') : html.index('id="sources"')]
    assert MEASUREMENTS_TITLE in measurements


def test_tables_show_runs_onnx_files_parity_and_environment(passing: Path) -> None:
    md = (passing / "report.md").read_text()
    # Per model and framework: parameters, accuracy, loss, final train loss, epochs, steps, native formats.
    assert "| torch | 1,210 | 97.00 % | 0.10000 |" in md and "| 3 | 60 | torch_native |" in md
    # Per ONNX file: size, opset, nodes, producer, I/O names and (symbolic) shapes; the op histogram.
    assert "| tf | `model.onnx` | 5.0 KiB | 17 | 9 | tf2onnx | 6 |" in md
    assert "images: float[B, 8, 8]" in md and "logits: float[batch, 10]" in md
    assert "| `Gemm` | 2 | 0 | 0 |" in md and "| `MatMul` | 0 | 2 | 2 |" in md
    # Parity: the matrix with the reference, training figures with their tolerances.
    assert "| **reference** | — | 2.00e-06 | 2.00e-06 | 2.00e-06 |" in md
    assert "2.00e-08 (tol 1e-06 ✓)" in md and "1.50e-04 (tol 0.001 ✓)" in md
    # Environment: lock hashes and params.yaml as written; what ran, as export.json recorded it, next to the pins.
    lock = REPO / "packages/torch_impl/requirements-cpu.lock"
    assert subprocess.run(["sha256sum", str(lock)], capture_output=True, text=True).stdout.split()[0] in md
    assert "torch==2.13.0+cpu" in md and "embed_dim: 512" in md
    environment = md.split("## Environment")[1]
    tf_row = next(line for line in environment.splitlines() if line.startswith("| tf | "))
    assert "`tensorflow-cpu==2.21.0`; `keras==3.15.1`; `onnx==1.21.0`; `onnxruntime==1.32.0`" in tf_row
    orchestrator = next(line for line in environment.splitlines() if line.startswith("| orchestrator"))
    assert "`numpy==2.4.6`" in orchestrator and ">=3.11,<3.12" in orchestrator  # from requirements.lock, pyproject


def test_markdown_has_no_timings_and_says_where_they_are(passing: Path) -> None:
    md = (passing / "report.md").read_text()
    section = md.split(f"## {MEASUREMENTS_TITLE}")[1].split("\n## ")[0]
    assert "measurements/" in section and "`dvc metrics show`" in section
    for word in ("samples/s", "train time", "ONNX Runtime ms", " ms |", "Generated", "revision"):
        assert word not in md.split("## Model definitions")[0], word


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
        for arch in ARCHITECTURES:  # every one the packages implement, not only the fixtures' models
            source = extract(REPO, fw, arch)
            if not (REPO / source.path).is_file():
                pytest.skip(f"{source.path} not written yet")
            assert source.names, f"{fw}/{arch}: {source.note}"
            folded = arch.replace("_", "")  # TextTransformer is named after text_transformer
            assert any(folded in name.lower().replace("_", "") for name in source.names), (fw, arch, source.names)


def test_loss_plot_is_one_csv_per_model_with_a_column_per_framework(passing: Path) -> None:
    assert sorted(p.name for p in (passing / "plots").iterdir()) == ["loss"]  # no latency: a measurement
    logs = {fw: json.loads((passing.parent.parent / paths.train_log("cnn", fw)).read_text()) for fw in FRAMEWORKS}
    for model in MODELS:
        with open(passing / "plots" / "loss" / f"{model}.csv") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
        assert reader.fieldnames == ["step", *FRAMEWORKS]
        assert len(rows) == 60 and rows[0]["step"] == "1" and rows[-1]["step"] == "60"
    # Every loss at full precision: the CSV round-trips the train logs' floats exactly.
    with open(passing / "plots" / "loss" / "cnn.csv") as f:
        rows = list(csv.DictReader(f))
    for fw in FRAMEWORKS:
        assert [float(r[fw]) for r in rows] == logs[fw]["step_losses"]


def test_building_twice_gives_the_same_bytes_wherever_and_whatever_was_measured(passing: Path,
                                                                               tmp_path: Path) -> None:
    """Byte-stable lineage: two builds, in two folders at different absolute paths, one of them with the
    measurements of a run present beside it, give identical files; and none holds a timing or a path. (The first
    folder is the module's passing report, built from the same fixture set.)"""
    first = passing.parents[len(Path(paths.REPORT).parts) - 1]
    second = make_artifacts(tmp_path / "elsewhere" / "b")
    assert first / paths.REPORT == passing and first != second
    once = contents(passing)
    build(first)
    assert contents(first / paths.REPORT) == once  # the same inputs, rebuilt: the same bytes
    make_measurements(second)
    build(second)
    assert contents(second / paths.REPORT) == once  # another path, measurements present: still the same bytes
    texts = {name: data.decode() for name, data in once.items()}
    for name, text in texts.items():
        assert str(tmp_path) not in text and str(first) not in text and "/tmp/" not in text, name  # no path
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), name  # no date
        for seconds in TRAIN_SECONDS.values():  # no timing of the run (they exist only in measurements/)
            assert str(seconds) not in text and f"{seconds:.2f} s" not in text, name
    assert "ROSETTA_MEASUREMENTS = {" not in texts["report.html"]  # loaded by the browser, never inlined


def test_the_stage_command_line_takes_root_and_out(tmp_path: Path) -> None:
    root = make_artifacts(tmp_path / "root")
    assert main(["--root", str(root), "--out", str(tmp_path / "out")]) == 0
    assert main(["--root", str(root)]) == 0
    assert contents(tmp_path / "out") == contents(root / paths.REPORT)


def test_dvc_yaml_declares_the_report_as_proposed() -> None:
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    report = dvc["stages"]["report"]
    assert report["cmd"] == PROPOSED_DVC["stages"]["report"]["cmd"]
    assert set(REPORT_DEPS) <= set(report["deps"])
    assert not [d for d in report["deps"] if d.startswith(("measurements", "metrics", "reports/latency"))]
    assert [next(iter(o)) if isinstance(o, dict) else o for o in report["outs"]] == [str(paths.REPORT)]
    assert "metrics" not in report and "plots" not in report  # top-level, below
    assert {str(paths.SUMMARY), "measurements/metrics"} <= set(dvc.get("metrics", []))
    plots = {next(iter(p)) for p in dvc.get("plots", [])}
    assert {str(paths.PLOTS / "loss"), "measurements/latency.csv"} <= plots


@pytest.mark.skipif(shutil.which("dvc") is None and not (REPO / ".venv/bin/dvc").is_file(), reason="no dvc")
def test_dvc_metrics_and_plots_show_read_the_report_and_the_measurements(failing: Path, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(failing.parent.parent, root)
    make_measurements(root)
    env = cli_env(DVC_NO_ANALYTICS="1")  # offline machines: no telemetry attempt
    (root / "dvc.yaml").write_text(yaml.safe_dump(PROPOSED_DVC, sort_keys=False))
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["dvc", "init", "-q"], cwd=root, env=env, check=True)
    metrics = subprocess.run(
        ["dvc", "metrics", "show", "--json"], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    data = json.loads(metrics.stdout)[""]["data"]
    found = {path: entry["data"] for path, entry in data.items()}
    summary = f"{paths.SUMMARY}/"
    summaries = {path: d for path, d in found.items() if path.startswith(summary)}
    assert sorted(summaries) == sorted(f"{summary}{m}.json" for m in MODELS)
    assert summaries[f"{summary}cnn.json"]["worst_forward_parity_over_tol"] == pytest.approx(32.0)
    assert summaries[f"{summary}cnn.json"]["passed"] is False
    assert summaries[f"{summary}mlp.json"]["tf"]["test_loss"] == pytest.approx(0.1)
    measured = {path: d for path, d in found.items() if path.startswith("measurements/metrics/")}
    assert {f"measurements/metrics/{m}-{fw}.json" for m in MODELS for fw in FRAMEWORKS} <= set(measured)
    assert measured["measurements/metrics/mlp-tf.json"]["train_seconds"] == pytest.approx(TRAIN_SECONDS["tf"])
    assert len(set().union(*(dvc_flatten(d) for d in found.values()))) <= 12
    plots = subprocess.run(
        ["dvc", "plots", "show", "--json"], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    rendered = json.loads(plots.stdout)["data"]
    for model in MODELS:
        values = rendered[f"{paths.PLOTS}/loss/{model}.csv"][0]["content"]["data"]["values"]
        assert {v["rev"] for v in values} == {"workspace"}
        assert len(values) == 60 * len(FRAMEWORKS)  # three curves, one per framework column
    assert len(rendered["measurements/latency.csv"][0]["content"]["data"]["values"]) == 18


def test_missing_inputs_are_reported_not_fatal(tmp_path: Path) -> None:
    make_artifacts(tmp_path)
    (tmp_path / paths.onnx_model("cnn", "jax")).unlink()
    (tmp_path / paths.metrics("mlp", "tf")).unlink()
    (tmp_path / paths.export_record("attention", "torch")).write_text("{ not json")
    build(tmp_path)
    md = (tmp_path / paths.REPORT / "report.md").read_text()
    verdict = md.split("## Models")[0]
    assert "`artifacts/jax/cnn/model.onnx: missing`" in verdict
    assert f"`{paths.metrics('mlp', 'tf')}: missing`" in verdict
    assert f"{paths.export_record('attention', 'torch')}: unreadable (JSONDecodeError" in verdict
    assert "| jax | `model.onnx` | missing |" in md


def test_no_validation_report_means_not_validated(tmp_path: Path) -> None:
    make_artifacts(tmp_path)
    (tmp_path / "reports/validation.json").unlink()
    build(tmp_path)
    assert "NOT VALIDATED" in (tmp_path / paths.REPORT / "report.md").read_text()
    summary = json.loads((tmp_path / paths.summary("mlp")).read_text())
    assert summary["passed"] is False and summary["worst_forward_parity_over_tol"] is None


def test_onnx_summary_reads_opset_ops_and_io(passing: Path) -> None:
    summary = summarize(passing.parent.parent / paths.onnx_model("mlp", "jax"))
    assert summary.opset == 23 and summary.producer == "jax2onnx" and summary.nodes == 7
    assert summary.ops["MatMul"] == 2 and summary.ops["Identity"] == 1
    assert [str(t) for t in summary.inputs] == ["images: float[B, 8, 8]"]
    assert summary.initializer_values == 64 * 16 + 16 + 16 * 10 + 10 + 2


def test_shortfall_says_how_far_from_passing() -> None:
    assert shortfall(3.2e-4, 1e-5) == "0.00032 > tolerance 1e-05 (32x the tolerance)"
    assert shortfall(0.91, 0.95).startswith("0.91 < required 0.95")
    assert shortfall(0.02, 0.0) == "0.02 where exactly 0 is required"
    assert shortfall(None, 1e-5, "ONNX file is missing") == "ONNX file is missing"


def test_throughput_table_is_the_benchmarks_rows_or_none(tmp_path: Path) -> None:
    """timings.js carries the benchmark's table (null until benchmarks/train_throughput.py has run here)."""
    from pipelines import measurements

    assert measurements.throughput_table(tmp_path / "measurements") is None
    root = make_measurements(tmp_path, throughput=True)
    table = measurements.throughput_table(root)
    assert table is not None and table["settings"] == {"epochs": 3, "repeats": 2}
    assert [(r["framework"], round(r["ratio"], 6), r["verdict"]) for r in table["rows"]] == [
        ("torch", 1.25, "ok"), ("tf", 0.8, "parity cost")]
    assert "window.ROSETTA_THROUGHPUT = {" in (root / measurements.TIMINGS_JS.name).read_text()
    (root / measurements.THROUGHPUT_TABLE.name).unlink()
    measurements.refresh(root)
    assert "window.ROSETTA_THROUGHPUT = null;" in (root / measurements.TIMINGS_JS.name).read_text()


# --- The new models' parts: BatchNorm running statistics, the form of a recurrent layer, inference mode. ---


@pytest.fixture(scope="module")
def extended(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("extended")
    make_artifacts(root, models=[*MODELS, *NEW_MODELS])
    build(root)
    return root / paths.REPORT


def test_running_statistics_are_a_table_and_a_figure_for_a_model_with_batchnorm(extended: Path) -> None:
    md = (extended / "report.md").read_text()
    resnet = md.split("## Parity")[1].split("### resnet")[1].split("\n### ")[0]
    assert "**BatchNorm running statistics after training**" in resnet
    assert ("| tf\\|jax | 3.00e-06 (tol 0.001 ✓) | 6.00e-06 (tol 0.001 ✓) | "
            "`running_mean: block.bn1, running_var: block.bn1` |") in resnet
    for model in ("mlp", "lstm"):  # no BatchNorm: no such table
        section = md.split("## Parity")[1].split(f"### {model}")[1].split("\n### ")[0]
        assert "running statistics" not in section, model
    html = (extended / "report.html").read_text()
    parity = html[html.index('id="parity-resnet"') : html.index('id="parity-lstm"')]
    assert 'alt="resnet BatchNorm running statistics after training"' in parity
    assert "BatchNorm running statistics" not in html[html.index('id="parity-lstm"') : html.index('id="onnx"')]


def test_recurrent_layer_form_is_read_from_each_onnx_file(extended: Path) -> None:
    md = (extended / "report.md").read_text()
    lstm = md.split("## ONNX files")[1].split("### lstm")[1].split("\n## ")[0]
    assert "**Recurrent layer in ONNX**" in lstm
    assert "| torch | `model.onnx` | LSTM op | `LSTM x1` |" in lstm
    assert "| tf | `init.onnx` | unrolled | `no LSTM, Loop or Scan; MatMul x2` |" in lstm
    assert "| `LSTM` | 1 | 0 | 0 |" in lstm  # the op histogram shows it too
    for model in ("mlp", "resnet"):
        section = md.split("## ONNX files")[1].split(f"### {model}")[1].split("\n### ")[0]
        assert "Recurrent layer" not in section, model


def test_recurrent_form_names_op_loop_or_unrolled() -> None:
    from collections import Counter

    from pipelines.report.analysis import recurrent_form

    assert recurrent_form(Counter({"GRU": 1, "MatMul": 1}), "GRU") == ("GRU op", "GRU x1")
    assert recurrent_form(Counter({"Loop": 1, "MatMul": 3, "Sigmoid": 3}), "LSTM") == ("Loop", "Loop x1")
    assert recurrent_form(Counter({"Scan": 2}), "GRU") == ("Scan", "Scan x2")
    assert recurrent_form(Counter({"MatMul": 16, "Sigmoid": 24, "Tanh": 16}), "LSTM") == (
        "unrolled", "no LSTM, Loop or Scan; MatMul x16, Sigmoid x24, Tanh x16")


def test_inference_mode_of_every_export_is_a_table(extended: Path) -> None:
    md = (extended / "report.md").read_text()
    resnet = md.split("## ONNX files")[1].split("### resnet")[1].split("\n### ")[0]
    assert "**Inference mode of every export**" in resnet
    assert "| tf | `native_tf_native` | 2.00e-06 | 0.0001 | yes |" in resnet
    assert "| jax | `onnx_model` | 0.00e+00 | 0.0001 | yes |" in resnet


