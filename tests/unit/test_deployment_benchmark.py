"""The pure parts of benchmarks/deployment.py (sizes, quantiles, phases, medians, order, the table, bad input) and
how its record reaches the report (pipelines/measurements.py's timings.js, pipelines/report/deployment.py's facts).

No timing is asserted (benchmarks/README.md): the worker's readings are made up here, and what is checked is the
arithmetic done on them."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from benchmarks import deployment, deployment_worker
from pipelines import deployment_formats, measurements
from pipelines.report import deployment as report_deployment
from support.report_fixtures import deployment_row


def test_tree_bytes_counts_each_regular_file_once_and_follows_no_symlink(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 23)
    os.link(tmp_path / "a", tmp_path / "sub" / "a-again")  # a hard link: the same bytes on disk, counted once
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"z" * 5000)
    (tmp_path / "link-to-file").symlink_to(outside / "big")  # a venv's bin/python: not ours to count
    (tmp_path / "link-to-folder").symlink_to(outside, target_is_directory=True)
    assert deployment.tree_bytes(tmp_path) == 123
    assert deployment.tree_bytes(tmp_path / "sub" / "b") == 23
    assert deployment.tree_bytes(tmp_path / "link-to-file") == 0


def test_record_bytes_and_distributions_sum_each_wheels_record(tmp_path: Path) -> None:
    record = "tensorflow/__init__.py,sha256=abc,1200\ntensorflow/lib.so,sha256=def,300000\n" \
             "tensorflow_cpu-2.21.0.dist-info/RECORD,,\n../../../bin/tool,sha256=ghi,42\n"
    assert deployment.record_bytes(record) == 301242
    site = tmp_path / "site-packages"
    for name, text in {"tensorflow_cpu-2.21.0.dist-info": record, "keras-3.15.1.dist-info": "keras/a.py,sha256=x,8\n",
                       "numpy-2.0.0.dist-info": "numpy/a.py,sha256=x,999\n"}.items():
        (site / name).mkdir(parents=True)
        (site / name / "RECORD").write_text(text)
    found = deployment.distributions_bytes(site, ("tensorflow-cpu", "tensorflow", "keras", "torch"))
    assert found == {"tensorflow-cpu": 301242, "keras": 8}  # absent ones left out, numpy not asked for


def test_quantile_is_linear_between_order_statistics() -> None:
    values = [float(v) for v in (10, 1, 9, 2, 8, 3, 7, 4, 6, 5)]
    assert deployment.quantile(values, 0.5) == pytest.approx(5.5, abs=1e-12)
    assert deployment.quantile(values, 0.9) == pytest.approx(9.1, abs=1e-12)  # numpy.percentile(values, 90)
    assert deployment.quantile([3.0], 0.9) == 3.0


def test_phases_split_one_cold_start_on_one_clock() -> None:
    result = {"started": 100.25, "imports_done": 102.0, "load_done": 102.5, "first_request_seconds": 0.125}
    figures = deployment.phases(100.0, result)
    assert figures == pytest.approx({"interpreter_seconds": 0.25, "imports_seconds": 1.75, "load_seconds": 0.5,
                                     "first_request_seconds": 0.125, "total_seconds": 2.625}, abs=1e-12)


def _run(total: float, steady1: list[float], steady64: list[float]) -> dict:
    return {"phases": {"interpreter_seconds": 0.1, "imports_seconds": total - 0.4, "load_seconds": 0.2,
                       "first_request_seconds": 0.1, "total_seconds": total},
            "first_batch64_seconds": total / 100, "steady_seconds": {"1": steady1, "64": steady64},
            "max_rss_kib": 2048 * total, "modules": ["onnxruntime"]}


def test_summarize_takes_medians_over_repeats() -> None:
    runs = [_run(1.0, [0.001, 0.002, 0.003], [0.01] * 3), _run(3.5, [0.002] * 3, [0.02] * 3),
            _run(2.0, [0.004, 0.005, 0.006], [0.03] * 3)]
    summary = deployment.summarize(runs)
    assert summary["cold"]["total_seconds"] == pytest.approx(2.0, abs=1e-12)
    assert summary["cold_total_per_repeat"] == [1.0, 3.5, 2.0]  # mean 2.17: the median is the figure
    assert summary["first_batch64_ms"] == pytest.approx(20.0, abs=1e-9)
    assert summary["steady"]["1"]["median_ms"] == pytest.approx(2.0, abs=1e-9)  # medians 2, 2, 5 ms: their median
    assert summary["steady"]["64"]["median_ms"] == pytest.approx(20.0, abs=1e-9)
    assert summary["steady"]["1"]["p90_ms"] == pytest.approx(2.8, abs=1e-9)  # p90s 2.8, 2, 5.8 ms
    assert summary["max_rss_mib"] == pytest.approx(4.0, abs=1e-12)
    assert summary["cold"]["imports_seconds"] == pytest.approx(1.6, abs=1e-12)
    assert summary["repeats"] == 3


def test_interleaved_puts_every_case_at_every_place() -> None:
    cases = ["a", "b", "c"]
    orders = [deployment.interleaved(cases, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(sorted(order) == cases for order in orders)


def test_table_shows_each_rows_figures_and_every_formats_facts() -> None:
    environments = {"validation": {"bytes": 385 * 2**20, "runtime_bytes": 72 * 2**20}}
    text = deployment.table([deployment_row("onnx", "torch", 1.34)], environments)
    row = next(line for line in text.splitlines() if line.startswith("| cnn |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["cnn", "onnx", "torch", "2.0 KiB"]
    assert cells[8] == "**1.34**"
    assert cells[10:12] == ["0.060 / 0.080", "0.900 / 1.200"]
    assert cells[13] == "validation 385.0 MiB (72.0 MiB)"
    for fmt in deployment_formats.FORMATS:
        assert f"| {fmt.name} | {fmt.python} |" in text


def test_cases_name_a_missing_file_in_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "torch" / "cnn" / "native").mkdir(parents=True)
    (tmp_path / "torch" / "cnn" / "native" / "model.pt2").write_bytes(b"pt2")
    found = deployment.cases(tmp_path, ["cnn"], ["torch_export"])
    assert [(c["format"], c["framework"], c["env"]) for c in found] == [("torch_export", "torch", "torch")]
    with pytest.raises(SystemExit) as raised:
        deployment.cases(tmp_path, ["cnn"], ["onnx"])
    message = str(raised.value)
    assert message.startswith("error: ") and "torch/cnn/model.onnx: missing" in message and "\n" not in message


@pytest.mark.parametrize(("argv", "named"), [(["--repeats", "0"], "--repeats 0"), (["--calls", "-3"], "--calls -3"),
                                             (["--threads", "two"], "--threads 'two'"),
                                             (["--artifacts", "no-such-folder"], "--artifacts no-such-folder")])
def test_bad_arguments_are_one_error_line_and_write_nothing(tmp_path: Path, argv: list[str], named: str) -> None:
    out = tmp_path / "deployment.json"
    with pytest.raises(SystemExit) as raised:
        deployment.main([*argv, "--out", str(out)])
    message = str(raised.value)
    assert message.startswith(f"error: {named}") and "allowed" in message and "\n" not in message
    assert not out.exists()


def test_keras_classes_reads_the_registered_names_from_the_zip(tmp_path: Path) -> None:
    config = {"class_name": "Functional", "registered_name": "Functional", "config": {"layers": [
        {"class_name": "AddChannel", "registered_name": "rosetta_tf>AddChannel"},
        {"class_name": "Dense", "registered_name": None, "config": {"inner": {"registered_name": "pkg>Inner"}}}]}}
    path = tmp_path / "model.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", json.dumps(config))
    assert deployment.keras_classes(path) == ["pkg>Inner", "rosetta_tf>AddChannel"]


def test_every_format_has_a_worker_loader_and_sources() -> None:
    names = [f.name for f in deployment_formats.FORMATS]
    assert len(set(names)) == len(names)
    assert set(names) == set(deployment_worker.IMPORTS)  # the worker imports what the facts say a process imports
    for fmt in deployment_formats.FORMATS:
        assert set(deployment_worker.IMPORTS[fmt.name]) <= {m.strip() for m in fmt.imports.split(",")} | {"jax.numpy"}
        assert fmt.sources and all(s.startswith("https://") for s in fmt.sources)


def test_the_record_reaches_timings_js_and_a_malformed_one_is_null(tmp_path: Path) -> None:
    record = {"settings": {"repeats": 5}, "rows": [deployment_row("onnx", "jax", 1.6)],
              "environments": {"validation": {}}, "raw": "not for the page"}
    (tmp_path / measurements.DEPLOYMENT.name).write_text(json.dumps(record))
    measurements.refresh(tmp_path)
    line = next(x for x in (tmp_path / measurements.TIMINGS_JS.name).read_text().splitlines()
                if x.startswith("window.ROSETTA_DEPLOYMENT = "))
    shown = json.loads(line.removeprefix("window.ROSETTA_DEPLOYMENT = ").removesuffix(";"))
    assert shown == {"settings": {"repeats": 5}, "rows": record["rows"], "environments": {"validation": {}}}
    (tmp_path / measurements.DEPLOYMENT.name).write_text(json.dumps({"settings": {}, "rows": {"not": "a list"}}))
    measurements.refresh(tmp_path)
    assert "window.ROSETTA_DEPLOYMENT = null;" in (tmp_path / measurements.TIMINGS_JS.name).read_text()


def test_the_reports_facts_table_has_a_row_per_format() -> None:
    table = report_deployment.facts_table()
    assert [row.cells[0].text for row in table.rows] == [f.name for f in deployment_formats.FORMATS]
    onnx = next(row for row in table.rows if row.cells[0].text == "onnx")
    assert onnx.cells[4].text == deployment_formats.by_name("onnx").python
    assert onnx.cells[-1].lines == deployment_formats.by_name("onnx").sources
