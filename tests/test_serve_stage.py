"""The serve stage and the validate stage's serving checks, for real, on the session's tiny run and a copy of it.

The tiny run's `dvc repro` ran `serve` (the four model servers on loopback, the validation batch through V1 REST,
V2 REST and V2 gRPC) and `validate` judged what it published; here: the published folder is complete and every
serving check passed; the stage run again in a copy publishes the same bytes; one served logit moved by one ulp
(its hash re-recorded, as a server that answered so would have) fails validate naming that check and nothing
else; a server that cannot start, or a missing artifacts folder, is one `error:` line naming the server, a
non-zero exit, and nothing published. Nothing is mocked."""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipelines import paths, serving
from pipelines.checks import ledger as names
from rosetta_common.data import batch_sha256, load_prepared
from rosetta_common.io import sha256
from support import REPO, VALIDATE, TinyRun, replace_file, sh

SERVE = ["python", "-m", "pipelines.stages.serve", "--client", "pipelines.stages.serve_client"]
SERVERS = ["torch", "tf", "jax", "onnx"]
PROTOCOLS = list(paths.SERVED_PROTOCOLS)
PER_MODEL = (names.SERVED_READABLE, names.SERVED_METADATA_IDENTICAL,
             *(names.served(c, p) for c in (names.SERVED_NATIVE_VS_IN_PROCESS, names.SERVED_ONNX_VS_IN_PROCESS,
                                            names.SERVED_ONNX_VS_NATIVE) for p in PROTOCOLS))


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` (relative path -> sha256)."""
    return {p.relative_to(root).as_posix(): sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def served_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report["checks"] if r["check"].startswith("served_")]


@pytest.fixture(scope="module")
def copy(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """A private copy of the session's run: the cases here rerun the stage and edit what it published."""
    root = tmp_path_factory.mktemp("serve") / "repo"
    shutil.copytree(tiny_pipeline.root, root, symlinks=True)
    return TinyRun(root, tiny_pipeline.env, "")


def test_the_served_folder_is_complete_and_every_serving_check_passes(tiny_pipeline: TinyRun) -> None:
    root = tiny_pipeline.root
    params = yaml.safe_load((root / "params.yaml").read_text())
    models = params["models"]
    batch = load_prepared(root / paths.PREPARED).validation_batch(params["export"]["validation_batch_size"])
    index = json.loads((root / paths.SERVED_INDEX).read_text())
    assert list(index["servers"]) == SERVERS and index["onnx_from"] == serving.ONNX_FROM
    assert index["models"] == models and index["protocols"] == PROTOCOLS
    # The batch train_export recorded its logits on, exactly.
    assert index["batch"] == {"shape": list(batch.shape), "dtype": "float32", "sha256": batch_sha256(batch)}
    files = tree(root / paths.SERVED)
    assert index["sha256"] == {k: v for k, v in files.items() if k != "index.json"}
    assert set(index["sha256"]) == {f"{s}/{p}.npz" for s in SERVERS for p in PROTOCOLS} | {
        f"{s}/metadata.json" for s in SERVERS}
    for server in SERVERS:
        for protocol in PROTOCOLS:
            with np.load(root / paths.served_logits(server, protocol), allow_pickle=False) as npz:
                assert npz.files == models, (server, protocol)
                assert all(npz[m].dtype == np.float32 and npz[m].shape == (len(batch), 10) for m in models)
        metadata = json.loads((root / paths.served_metadata(server)).read_text())
        assert list(metadata) == models and all(set(metadata[m]) == {"rest", "grpc"} for m in models)
    # Nothing of a run that cannot repeat (ports, pids, seconds) is in the lineage: it is in measurements/.
    text = (root / paths.SERVED_INDEX).read_text()
    assert "127.0.0.1" not in text and "seconds" not in text
    record = json.loads((root / "measurements/stages/serve.json").read_text())
    assert record["ready_seconds"] > 0 and set(record["requests"]) == set(SERVERS)
    assert set(record["requests"]["tf"]) == set(PROTOCOLS)
    report = json.loads((root / paths.VALIDATION).read_text())
    rows = served_rows(report)
    expected = {(m, "servers" if c in (names.SERVED_READABLE, names.SERVED_METADATA_IDENTICAL) else fw, c)
                for m in models for c in PER_MODEL
                for fw in (["torch", "tf", "jax"] if c.startswith(names.SERVED_NATIVE_VS_IN_PROCESS) else ["torch"])}
    assert {(r["model"], r["framework"], r["check"]) for r in rows} == expected
    assert all(r["passed"] for r in rows), [r for r in rows if not r["passed"]]
    # Bit for bit: every served-vs-in-process figure is 0.
    assert all(r["value"] == 0.0 for r in rows if "_vs_in_process_" in r["check"])
    assert [s["model"] for s in report["serving"]] == models
    assert all(set(s["across_frameworks"]) == {"torch|tf", "torch|jax", "tf|jax"} for s in report["serving"])


def test_the_stage_run_again_publishes_the_same_bytes(tiny_pipeline: TinyRun, copy: TinyRun) -> None:
    before = tree(tiny_pipeline.root / paths.SERVED)
    result = sh(SERVE, copy.root, copy.env)
    assert "ready in" in result.stdout, result.stdout
    assert tree(copy.root / paths.SERVED) == before


def test_a_served_logit_one_ulp_off_fails_validate_naming_the_check(copy: TinyRun) -> None:
    """tf's gRPC answer for cnn, one logit moved by one ulp and index.json's hash of the file re-recorded: only
    served_native_vs_in_process_grpc of cnn/tf fails, its value that ulp."""
    rel = paths.served_logits("tf", "grpc")
    path, index_path = copy.root / rel, copy.root / paths.SERVED_INDEX
    saved = {path: path.read_bytes(), index_path: index_path.read_bytes()}
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        logits = arrays["cnn"].copy()
        at = np.unravel_index(np.abs(logits).argmax(), logits.shape)
        moved = np.nextafter(logits[at], np.float32(np.inf), dtype=np.float32)
        ulp = float(moved) - float(logits[at])
        logits[at] = moved
        arrays["cnn"] = logits
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        replace_file(path, buffer.getvalue())
        index = json.loads(index_path.read_text())
        index["sha256"][rel.relative_to(paths.SERVED).as_posix()] = sha256(path)
        replace_file(index_path, json.dumps(index, indent=2).encode())
        result = sh(VALIDATE, copy.root, copy.env, check=False)
        report = json.loads((copy.root / paths.VALIDATION).read_text())
    finally:
        for saved_path, data in saved.items():
            replace_file(saved_path, data)
    check = names.served(names.SERVED_NATIVE_VS_IN_PROCESS, "grpc")
    assert result.returncode != 0
    assert f"FAILED cnn/tf {check}: value {ulp}" in result.stderr, result.stderr[-3000:]
    failed = [(r["model"], r["framework"], r["check"]) for r in report["checks"] if not r["passed"]]
    assert failed == [("cnn", "tf", check)], failed
    row = next(r for r in report["checks"] if r["check"] == check and r["model"] == "cnn" and r["framework"] == "tf")
    assert row["value"] == ulp and row["tolerance"] == 0.0 and "1 of " in row["detail"], row


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_server_that_exits_at_once_is_one_error_line_and_nothing_is_published(copy: TinyRun) -> None:
    """The ONNX server's module planted to exit at once: the stage names that server, how it ended and its last
    line, stops the others, and leaves the published folder as it was."""
    before = tree(copy.root / paths.SERVED)
    module = copy.root / "pipelines/serve_onnx.py"
    original = module.read_bytes()
    try:
        replace_file(module, b'raise SystemExit("error: planted: this server exits at once")\n')
        result = sh(SERVE, copy.root, copy.env, check=False)
    finally:
        replace_file(module, original)
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert line.startswith("error: the onnx server (pid ") and "exited with code 1 before it was ready" in line, line
    assert "error: planted: this server exits at once" in line, line
    assert tree(copy.root / paths.SERVED) == before


def test_a_missing_artifacts_folder_is_one_error_line_before_any_server_starts(copy: TinyRun) -> None:
    before = tree(copy.root / paths.SERVED)
    folder = copy.root / paths.framework_dir("jax")
    aside = folder.with_name("jax.aside")
    os.replace(folder, aside)
    try:
        result = sh(SERVE, copy.root, copy.env, check=False)
    finally:
        os.replace(aside, folder)
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert line == ("error: artifacts/jax/mlp: missing, so the jax server cannot serve mlp (run train_export@jax "
                    "first)"), line
    assert "serve:" not in result.stdout  # no server was started
    assert tree(copy.root / paths.SERVED) == before


def test_the_container_runtime_serves_nothing_and_says_why(copy: TinyRun) -> None:
    """Not implemented yet: the stage publishes off.json alone, and validate judges no served logits, saying why
    (its own run in a copy of the copy, so the cases above keep theirs)."""
    root = copy.root.parent / "container"
    shutil.copytree(copy.root, root, symlinks=True)
    result = sh(SERVE, root, {**copy.env, "ROSETTA_RUNTIME": "container"})
    assert "serve: off (ROSETTA_RUNTIME=container: serving from containers is not implemented yet" in result.stdout
    assert tree(root / paths.SERVED).keys() == {"off.json"}
    sh(VALIDATE, root, copy.env)
    report = json.loads((root / paths.VALIDATION).read_text())
    assert not served_rows(report) and report["passed"] is True
    assert all("not implemented yet" in record["off"] for record in report["serving"]), report["serving"]
    bad = sh(SERVE, root, {**copy.env, "ROSETTA_RUNTIME": "cloud"}, check=False)
    (line,) = error_lines(bad.stderr)
    assert bad.returncode == 1 and line == "error: ROSETTA_RUNTIME=cloud: not a runtime; allowed: local, container"


def test_the_validator_expects_the_format_each_server_serves() -> None:
    """pipelines/checks/serving.py's SERVED_FORMAT (the validator cannot import the servers, which import their
    frameworks, nor can this environment import the validator, which imports onnxruntime) is each server
    module's own SERVED_FORMAT: both read as the modules' source says."""
    expected = assigned(REPO / "pipelines/checks/serving.py")["SERVED_FORMAT"]
    assert set(expected) == {"torch", "tf", "jax"}
    for framework, fmt in expected.items():
        found = assigned(REPO / f"packages/{framework}_impl/src/rosetta_{framework}/serve.py")
        assert found.get("SERVED_FORMAT") == fmt, (framework, found)


def assigned(source: Path) -> dict[str, Any]:
    """The module's top-level NAME = <literal> assignments."""
    found = {}
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and node.value is not None:
                    try:
                        found[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        continue  # not a literal
    return found
