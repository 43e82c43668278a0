"""benchmarks/serving_load.py on a tiny bound against a real server (the ONNX Runtime one, on the session's tiny run,
127.0.0.1 only): not timed, nothing about speed is asserted. What is: the closed loop honours its request bound
exactly at any concurrency, every answer is checked (an expectation the server's answers do not meet makes every
counted request an error, none a good one), the benchmark's output has one row per server, protocol, batch and
concurrency with every figure where it belongs, and a bad argument is one error line. About 40 s after the tiny run.
The report's Serving section draws the table and its charts from timings.js (headless chromium, made-up slices).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import serving_load, serving_load_client
from pipelines import measurements, paths, resources
from pipelines.serving import servers as serving
from pipelines.stages.report import build
from support import TinyRun
from support.report_fixtures import browser_missing, make_artifacts, run_in_browser

MODEL = "mlp"  # the tiny run's quickest model


@pytest.fixture(scope="module")
def onnx_server(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with serving.running(["onnx"], tiny_pipeline.root / "artifacts", [MODEL],
                         log_dir=tmp_path_factory.mktemp("serving-load-logs")) as servers:
        yield servers[0]


def first_images(run: TinyRun, n: int) -> np.ndarray:
    with np.load(run.root / "data" / "prepared" / "test.npz", allow_pickle=False) as found:
        return np.ascontiguousarray(found["images"][:n], dtype=np.float32)


def workers(server: serving.Server, images: np.ndarray, classes: int, count: int) -> list[Any]:
    body = serving_load_client.v2_body(images)
    bad_body = serving_load_client.v2_body(serving_load_client.bad_images(images))
    return [serving_load_client.RestWorker(server.url, MODEL, body, bad_body, [len(images), classes])
            for _ in range(count)]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_every_answer_is_checked_and_the_count_bound_holds(tiny_pipeline: TinyRun, onnx_server: serving.Server,
                                                            concurrency: int) -> None:
    images = first_images(tiny_pipeline, 3)
    classes = serving_load_client.metadata_classes(onnx_server.url, MODEL)
    pid = onnx_server.process.pid
    good = serving_load_client.run_slice(workers(onnx_server, images, classes, concurrency), 7, 60.0, 1, pid)
    assert (len(good["latencies_ms"]), good["errors"]) == (7, 0), good["error_examples"]
    assert good["server_cpu_seconds"] is not None and good["server_cpu_seconds"] >= 0
    # The same answers against an expectation one class wider: each of them must fail its check.
    bad = serving_load_client.run_slice(workers(onnx_server, images, classes + 1, concurrency), 7, 60.0, 1, pid)
    assert (len(bad["latencies_ms"]), bad["errors"]) == (0, 7)
    assert bad["error_examples"] == [f"BadAnswer: output 'logits' shape [3, {classes}] with {3 * classes} values; "
                                     f"expected 'logits' [3, {classes + 1}]"]


def test_the_benchmark_on_a_tiny_bound(tiny_pipeline: TinyRun, tmp_path: Path) -> None:
    out = tmp_path / "serving_load.json"
    code = serving_load.main([
        "--artifacts", str(tiny_pipeline.root / "artifacts"), "--data", str(tiny_pipeline.root / "data" / "prepared"),
        "--models", MODEL, "--servers", "onnx", "--concurrency", "1", "2", "--batches", "1", "2",
        "--max-requests", "6", "--max-seconds", "60", "--rounds", "2", "--out", str(out)])
    assert code == 0
    found = json.loads(out.read_text())
    rows = found["rows"]
    cells = [(r["protocol"], r["batch"], r["concurrency"]) for r in rows]
    assert cells == [(p, b, c) for p in ("v2-rest", "v2-grpc") for b in (1, 2) for c in (1, 2)]
    for r in rows:
        assert (r["model"], r["server"], r["requests"], r["errors"]) == (MODEL, "onnx", 6, 0), r
        assert len(r["rounds_requests_per_second"]) == 2
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["samples_per_second"] == pytest.approx(r["requests_per_second"] * r["batch"], rel=1e-12)
        assert r["overhead_ratio"] == pytest.approx(r["p50_ms"] / r["in_process_p50_ms"], rel=1e-12)
        assert r["overhead_ms"] == pytest.approx(r["p50_ms"] - r["in_process_p50_ms"], abs=1e-12)
    assert {(r["server"], r["batch"]) for r in found["in_process"]} == {("onnx", 1), ("onnx", 2)}
    assert all(r["calls"] >= 20 for r in found["in_process"])
    assert found["table"].count("\n") == 1 + len(rows)
    assert found["settings"]["threads"] == "1" and "share this machine's" in found["shares"]


BURST_REQUESTS = 750  # per server and cell, over two rounds: 3,000 per server, 300 of them bad


def test_every_server_holds_its_resources_flat_under_a_burst(tiny_pipeline: TinyRun, tmp_path: Path) -> None:
    """The four servers under the benchmark's client, good and bad requests alike (every tenth refused with the
    protocol's error), each server's threads and descriptors flat from the first round to the second."""
    out = tmp_path / "serving_load.json"
    code = serving_load.main([
        "--artifacts", str(tiny_pipeline.root / "artifacts"), "--data", str(tiny_pipeline.root / "data" / "prepared"),
        "--models", MODEL, "--concurrency", "1", "4", "--batches", "1", "--max-requests", str(BURST_REQUESTS),
        "--max-seconds", "600", "--rounds", "2", "--bad-every", "10", "--out", str(out)])
    assert code == 0
    found = json.loads(out.read_text())
    assert found["settings"]["bad_every"] == 10
    for server in serving.SERVERS:
        rows = [r for r in found["rows"] if r["server"] == server]
        assert len(rows) == 4 and all(r["errors"] == 0 for r in rows), rows
        assert sum(r["requests"] + r["refused"] for r in rows) == 4 * BURST_REQUESTS, rows
        assert sum(r["refused"] for r in rows) >= 4 * BURST_REQUESTS // 10 - 4 * 4, rows  # each worker's tenth
        record = found["resources"][f"{server} ({MODEL})"]
        assert record["samples"] >= 20, record
        assert resources.flat(record), f"{server}: {resources.describe(record)}"


def test_percentiles() -> None:
    assert serving_load.percentiles(list(range(1, 101))) == pytest.approx((50.5, 99.01), abs=1e-12)
    assert serving_load.percentiles([]) == (None, None)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--concurrency", "0", "error: --concurrency 0: not allowed; allowed: 1 to 256"),
    ("--servers", "triton", "error: --servers triton: unknown; allowed: torch, tf, jax, onnx"),
    ("--protocols", "v1", "error: --protocols v1: unknown; allowed: v2-rest, v2-grpc"),
])
def test_a_bad_argument_is_one_error_line(tmp_path: Path, flag: str, value: str, message: str) -> None:
    out = tmp_path / "serving_load.json"
    with pytest.raises(SystemExit) as raised:
        serving_load.main([flag, value, "--out", str(out)])
    assert str(raised.value) == message
    assert not out.exists()


def made_up_slices() -> list[dict[str, Any]]:
    """Two servers, one protocol, batch 1, C 1 and 4, two rounds each: the client's form, figures chosen by hand."""
    slices = []
    for server, base in (("torch", 2.0), ("onnx", 1.0)):
        for concurrency in (1, 4):
            for repeat in range(2):
                slices.append({"server": server, "protocol": "v2-rest", "batch": 1, "concurrency": concurrency,
                               "round": repeat, "latencies_ms": [base * concurrency] * 10,
                               "errors": 1 if (server, concurrency, repeat) == ("onnx", 4, 1) else 0,
                               "error_examples": ["BadAnswer: made up"] if (server, concurrency, repeat) == (
                                   "onnx", 4, 1) else [], "seconds": 0.5, "client_cpu_seconds": 0.1,
                               "server_cpu_seconds": 0.4})
    return slices


def test_timings_js_carries_the_load_table_or_null(tmp_path: Path) -> None:
    root = tmp_path / "measurements"
    assert measurements.serving_load_table(root) is None
    rows = serving_load.summarize(made_up_slices(), {("torch", 1): {"p50_ms": 0.5}, ("onnx", 1): {"p50_ms": 0.25}},
                                  "cnn")
    (root).mkdir()
    (root / measurements.SERVING_LOAD.name).write_text(json.dumps(
        {"settings": {}, "shares": "shared", "machine": {}, "rows": rows, "in_process": []}))
    measurements.refresh(root)
    assert measurements.serving_load_table(root)["rows"] == rows
    assert "window.ROSETTA_SERVING_LOAD = {" in (root / measurements.TIMINGS_JS.name).read_text()
    assert "window.ROSETTA_RESOURCES = {};" in (root / measurements.TIMINGS_JS.name).read_text()
    # torch at C=4: 20 answers in 1 s, p50 8 ms against 0.5 ms in process; onnx at C=4: one error counted.
    torch4 = next(r for r in rows if (r["server"], r["concurrency"]) == ("torch", 4))
    assert (torch4["requests_per_second"], torch4["p50_ms"], torch4["overhead_ratio"], torch4["overhead_ms"]) == (
        20.0, 8.0, 16.0, 7.5)
    assert [(r["server"], r["concurrency"], r["errors"]) for r in rows] == [
        ("torch", 1, 0), ("onnx", 1, 0), ("torch", 4, 0), ("onnx", 4, 1)]


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_the_report_draws_the_load_table_in_its_serving_section(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    make_artifacts(root)
    build(root)
    rows = serving_load.summarize(made_up_slices(), {("torch", 1): {"p50_ms": 0.5}, ("onnx", 1): {"p50_ms": 0.25}},
                                  "cnn")
    found = root / measurements.ROOT
    found.mkdir()
    (found / measurements.SERVING_LOAD.name).write_text(json.dumps(
        {"settings": {"bounds": "made-up bounds", "threads": "1"}, "shares": "Shared cores.",
         "machine": {"model": "a CPU", "load_average": {"before": [1, 2, 3], "after": [4, 5, 6]}}, "rows": rows}))
    steady = [resources.Sample(0.2 * i, 40 + (i > 0), 12, 300 * resources.MIB) for i in range(10)]
    leaking = [resources.Sample(0.2 * i, 40 + 10 * i, 12, 300 * resources.MIB) for i in range(10)]
    measurements.write_resources("serving_load", "made-up servers", {
        "torch (cnn)": resources.summarize(steady), "onnx (cnn)": resources.summarize(leaking)}, root=found)
    measurements.write_resources("train_dp@tf", "made-up workers", {"worker 0": resources.summarize(steady)},
                                 root=found)
    page, errors = run_in_browser(root / paths.REPORT / "report.html",
        "const s = document.getElementById('serving-load');"
        "const t = document.getElementById('serving-load-table');"
        "const cells = id => { const x = document.getElementById(id);"
        " return x ? [...x.rows].map(r => [...r.cells].map(c => c.innerText)) : null; };"
        "return {section: s ? s.closest('section').id : null, text: s ? s.innerText : null,"
        " rows: t ? [...t.rows].map(r => [...r.cells].map(c => c.innerText)) : null,"
        " failed: t ? [...t.rows].filter(r => r.className === 'fail').length : null,"
        " charts: s ? s.querySelectorAll('svg polyline').length : null,"
        " served: cells('serving-resources-table'), probed: cells('resources-table')}")
    assert errors == []
    # Beside the latencies, each server's resources; in the measurements, every probed process.
    assert page["served"][1:] == [
        ["serving_load", "onnx (cnn)", "40 / 90 / 130", "12 / 12 / 12", "300 / 300 / 300", "2 s",
         "grows: threads +50 (bound 4)"],
        ["serving_load", "torch (cnn)", "40 / 41 / 41", "12 / 12 / 12", "300 / 300 / 300", "2 s", "flat"]]
    assert [row[:2] + row[-1:] for row in page["probed"][1:]] == [
        ["serving_load", "onnx (cnn)", "grows: threads +50 (bound 4)"], ["serving_load", "torch (cnn)", "flat"],
        ["train_dp@tf", "worker 0", "flat"]]
    assert page["section"] == "serving"
    assert page["rows"][0][:5] == ["model", "protocol", "batch", "C", "server"]
    assert page["rows"][3] == ["cnn", "v2-rest", "1", "4", "torch", "20", "20", "8.00 ms", "8.00 ms", "0.500 ms",
                               "16.0x", "7.50 ms", "0", "0.80", "0.20"]
    assert page["failed"] == 1 and page["rows"][4][12] == "1"
    assert page["charts"] == 2 * 2  # one panel (cnn v2-rest, batch 1): p50 and p99 of each server
    assert "made-up bounds" in page["text"] and "Shared cores." in page["text"] and "1.00 2.00 3.00" in page["text"]
