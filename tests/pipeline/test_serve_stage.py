"""The serve stage and the validate stage's serving checks, for real, on the session's tiny run and a copy of it.

The tiny run's `dvc repro` ran `serve` (the four model servers on loopback, each model's validation batch, images or
the token model's ids, through V1 REST, V2 REST and V2 gRPC) and `validate` judged what it published; here: the
published folder is complete and every serving check passed, the token model's too, under its served name; the
stage run again in a copy, at another ROSETTA_THREADS, publishes the same bytes (each server runs at its export's
thread count) and validate at a third passes; one served logit moved by one ulp
(its hash re-recorded, as a server that answered so would have) fails validate naming that check and nothing
else; a server that cannot start, or a missing artifacts folder, is one `error:` line naming the server, a
non-zero exit, and nothing published. Nothing is mocked."""

from __future__ import annotations

import ast
import hashlib
import io
import itertools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.serving import servers as serving
from rosetta_common.data import Dataset, load_for
from rosetta_common.io import sha256
from rosetta_common.serving import SERVED_FORMAT, batch_sha256, init_name, served_models, served_name
from rosetta_common.spec import load_spec
from support import REPO, VALIDATE, TinyRun, replace_file, run_in, sh

SERVE = ["python", "-m", "pipelines.stages.serve", "--client", "pipelines.stages.serve_client"]
SERVERS = ["torch", "tf", "jax", "onnx"]
PROTOCOLS = list(paths.SERVED_PROTOCOLS)
FRAMEWORK_SERVERS = ["torch", "tf", "jax"]
PAIRS = [f"{a}|{b}" for a, b in itertools.combinations(SERVERS, 2)]


def expected_served_rows(models: list[str]) -> set[tuple[str, str, str]]:
    """(model, subject, check) of every serving check validate makes on the tiny run: the trained models' and the
    init twins' (pipelines/checks/serving.py), the ONNX server's under the framework whose files it serves."""
    rows = set()
    for m in models:
        rows |= {(m, "servers", c) for c in (names.SERVED_READABLE, names.SERVED_METADATA_IDENTICAL,
                                             names.SERVED_INIT_ARGMAX_ACROSS_SERVERS)}
        rows |= {(m, pair, names.SERVED_INIT_ACROSS_SERVERS) for pair in PAIRS}
        for p in PROTOCOLS:
            rows |= {(m, fw, names.served(c, p)) for fw in FRAMEWORK_SERVERS
                     for c in (names.SERVED_NATIVE_VS_IN_PROCESS, names.SERVED_INIT_VS_IN_PROCESS,
                               names.SERVED_INIT_VS_REFERENCE)}
            rows |= {(m, serving.ONNX_FROM, names.served(c, p))
                     for c in (names.SERVED_ONNX_VS_IN_PROCESS, names.SERVED_ONNX_VS_NATIVE,
                               names.SERVED_ONNX_INIT_VS_IN_PROCESS, names.SERVED_ONNX_INIT_VS_REFERENCE)}
    return rows


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
    spec = load_spec(root / "params.yaml")
    models = params["models"]
    cache: dict[str, Dataset] = {}
    data = {m: load_for(m, root / paths.PREPARED, cache) for m in models}
    batches = {m: data[m].validation_batch(params["export"]["validation_batch_size"]) for m in models}
    classes = {m: data[m].model_config(spec, m).num_classes for m in models}
    index = json.loads((root / paths.SERVED_INDEX).read_text())
    assert list(index["servers"]) == SERVERS and index["onnx_from"] == serving.ONNX_FROM
    served = served_models(models)  # each model, then its init twin, under their served names (DNS-1123 labels)
    assert index["models"] == served and index["protocols"] == PROTOCOLS and index["init"] == "artifacts/init"
    assert not any("_" in name for name in served)  # DNS-1123 labels: text_transformer as text-transformer
    assert ("text-transformer" in served) == ("text_transformer" in models)
    # Each model's batch, the one train_export recorded its logits on, exactly: images (float32), token ids (int64).
    first: dict[str, str] = {}  # each kind of input (images, tokens) -> the first model reading it
    for m in models:
        first.setdefault(data[m].kind, m)
    assert index["batches"] == {
        kind: {"shape": list(batches[m].shape), "dtype": str(batches[m].dtype), "sha256": batch_sha256(batches[m]),
               "models": served_models([k for k in models if data[k].kind == kind])}
        for kind, m in first.items()}
    # An image batch's hash is what it always was (its float32 bytes), the token batch's its int64 bytes.
    for kind, dtype in {"images": np.float32, "tokens": np.int64}.items():
        if kind in first:
            assert index["batches"][kind]["dtype"] == np.dtype(dtype).name, kind
            raw = np.ascontiguousarray(batches[first[kind]], dtype).tobytes()
            assert index["batches"][kind]["sha256"] == hashlib.sha256(raw).hexdigest(), kind
    files = tree(root / paths.SERVED)
    assert index["sha256"] == {k: v for k, v in files.items() if k != "index.json"}
    assert set(index["sha256"]) == {f"{s}/{p}.npz" for s in SERVERS for p in PROTOCOLS} | {
        f"{s}/metadata.json" for s in SERVERS}
    for server in SERVERS:
        for protocol in PROTOCOLS:
            with np.load(root / paths.served_logits(server, protocol), allow_pickle=False) as npz:
                assert npz.files == served, (server, protocol)
                assert all(npz[name].dtype == np.float32 and npz[name].shape == (len(batches[m]), classes[m])
                           for m in models for name in served_models([m]))
        metadata = json.loads((root / paths.served_metadata(server)).read_text())
        assert list(metadata) == served and all(set(metadata[m]) == {"rest", "grpc"} for m in served)
        assert all(metadata[init_name(m)]["rest"] == {**metadata[served_name(m)]["rest"], "name": init_name(m)}
                   for m in models)
        for m in models:
            if data[m].kind == "tokens":
                assert metadata[served_name(m)]["rest"]["inputs"] == [{"name": "tokens", "datatype": "INT64",
                                                                       "shape": [-1, -1]}], (server, m)
    # Nothing of a run that cannot repeat (ports, pids, seconds) is in the lineage: it is in measurements/.
    text = (root / paths.SERVED_INDEX).read_text()
    assert "127.0.0.1" not in text and "seconds" not in text
    record = json.loads((root / "measurements/stages/serve.json").read_text())
    assert record["ready_seconds"] > 0 and set(record["requests"]) == set(SERVERS)
    assert set(record["requests"]["tf"]) == set(PROTOCOLS)
    report = json.loads((root / paths.VALIDATION).read_text())
    rows = served_rows(report)
    assert {(r["model"], r["framework"], r["check"]) for r in rows} == expected_served_rows(models)
    assert all(r["passed"] for r in rows), [r for r in rows if not r["passed"]]
    # Bit for bit: every served-vs-in-process figure is 0, the init twins' too.
    assert all(r["value"] == 0.0 for r in rows if "_vs_in_process_" in r["check"])
    assert [s["model"] for s in report["serving"]] == models
    assert all(set(s["across_frameworks"]) == {"torch|tf", "torch|jax", "tf|jax"} for s in report["serving"])
    tolerance = params["tolerances"]["forward_parity_abs"]
    for record in report["serving"]:
        init = record["init"]
        assert init["tolerance"] == tolerance and set(init["across_servers"]) == set(PAIRS), init
        assert set(init["vs_reference"]) == set(SERVERS), init
        argmax = init["argmax"]
        assert argmax["rows_judged"] + argmax["rows_excluded"] == len(batches[record["model"]])
        assert argmax["rows_differing"] == 0


def test_the_stage_run_again_publishes_the_same_bytes_whatever_the_callers_threads(tiny_pipeline: TinyRun,
                                                                                   copy: TinyRun) -> None:
    """Run again with ROSETTA_THREADS=1, where the tiny run's exports recorded 2: every server takes its export's
    count (index.json says so), so the answers are the same bytes; validate at 3 threads opens its sessions at the
    exports' count too, and every serving check passes, like with like."""
    before = tree(tiny_pipeline.root / paths.SERVED)
    result = sh(SERVE, copy.root, {**copy.env, "ROSETTA_THREADS": "1"})
    assert "ready in" in result.stdout, result.stdout
    assert tree(copy.root / paths.SERVED) == before
    index = json.loads((copy.root / paths.SERVED_INDEX).read_text())
    assert {name: server["threads"] for name, server in index["servers"].items()} == dict.fromkeys(SERVERS, 2)
    validated = sh(VALIDATE, copy.root, {**copy.env, "ROSETTA_THREADS": "3"}, check=False)
    rows = served_rows(json.loads((copy.root / paths.VALIDATION).read_text()))
    assert rows and all(r["passed"] for r in rows), [r for r in rows if not r["passed"]][:3]
    assert validated.returncode == 0, validated.stderr[-3000:]
    assert any("both at 2 threads" in r.get("detail", "") for r in rows)


def validate_with_served_answer(copy: TinyRun, server: str, protocol: str, model: str,
                                edit: Callable[[np.ndarray], None]) -> tuple[Any, dict[str, Any]]:
    """`edit` one model's array in one served file of the copy, re-record its sha256 in index.json (as a server that
    answered so would have), run validate, restore both files; returns validate's result and validation.json."""
    rel = paths.served_logits(server, protocol)
    path, index_path = copy.root / rel, copy.root / paths.SERVED_INDEX
    saved = {path: path.read_bytes(), index_path: index_path.read_bytes()}
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        arrays[model] = arrays[model].copy()
        edit(arrays[model])
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        replace_file(path, buffer.getvalue())
        index = json.loads(index_path.read_text())
        index["sha256"][rel.relative_to(paths.SERVED).as_posix()] = sha256(path)
        replace_file(index_path, json.dumps(index, indent=2).encode())
        result = sh(VALIDATE, copy.root, copy.env, check=False)
        return result, json.loads((copy.root / paths.VALIDATION).read_text())
    finally:
        for saved_path, data in saved.items():
            replace_file(saved_path, data)


def test_a_served_logit_one_ulp_off_fails_validate_naming_the_check(copy: TinyRun) -> None:
    """tf's gRPC answer for cnn, one logit moved by one ulp and index.json's hash of the file re-recorded: only
    served_native_vs_in_process_grpc of cnn/tf fails, its value that ulp."""
    moved: list[float] = []

    def one_ulp_up(logits: np.ndarray) -> None:
        at = np.unravel_index(np.abs(logits).argmax(), logits.shape)
        up = np.nextafter(logits[at], np.float32(np.inf), dtype=np.float32)
        moved.append(float(up) - float(logits[at]))
        logits[at] = up

    result, report = validate_with_served_answer(copy, "tf", "grpc", "cnn", one_ulp_up)
    (ulp,) = moved
    check = names.served(names.SERVED_NATIVE_VS_IN_PROCESS, "grpc")
    assert result.returncode != 0
    assert f"FAILED cnn/tf {check}: value {ulp}" in result.stderr, result.stderr[-3000:]
    failed = [(r["model"], r["framework"], r["check"]) for r in report["checks"] if not r["passed"]]
    assert failed == [("cnn", "tf", check)], failed
    row = next(r for r in report["checks"] if r["check"] == check and r["model"] == "cnn" and r["framework"] == "tf")
    assert row["value"] == ulp and row["tolerance"] == 0.0 and "1 of " in row["detail"], row


def test_a_token_answer_one_ulp_off_fails_validate_naming_the_check(copy: TinyRun) -> None:
    """The token model is judged as every model is: torch's V1 answer for text-transformer (its served name), one
    logit moved by one ulp and the hash re-recorded: only served_native_vs_in_process_v1 of text_transformer/torch
    fails (recorded under the architecture, as every check)."""
    if "text_transformer" not in load_spec(copy.root / "params.yaml").models:
        pytest.skip("the tiny run has no text_transformer (tooling/build/tiny_run.py MODELS): no token answer to move")
    moved: list[float] = []

    def one_ulp_up(logits: np.ndarray) -> None:
        at = np.unravel_index(np.abs(logits).argmax(), logits.shape)
        up = np.nextafter(logits[at], np.float32(np.inf), dtype=np.float32)
        moved.append(float(up) - float(logits[at]))
        logits[at] = up

    result, report = validate_with_served_answer(copy, "torch", "v1", served_name("text_transformer"), one_ulp_up)
    (ulp,) = moved
    check = names.served(names.SERVED_NATIVE_VS_IN_PROCESS, "v1")
    assert result.returncode != 0
    assert f"FAILED text_transformer/torch {check}: value {ulp}" in result.stderr, result.stderr[-3000:]
    failed = [(r["model"], r["framework"], r["check"]) for r in report["checks"] if not r["passed"]]
    assert failed == [("text_transformer", "torch", check)], failed


# The validator's reading of a served folder, on a folder written here (no server, no tiny run): an image model and
# the token model, each with its own batch; then the same folder with one thing wrong at a time.
CHECKS_SCRIPT = r"""
import copy, io, json, os
import numpy as np
from pipelines import paths
from pipelines.checks.serving import expected_metadata, metadata_problems, model_problems, read_served
from rosetta_common.inputs import random_tokens
from rosetta_common.io import sha256, write_json
from rosetta_common.serving import batch_sha256, served_models
from rosetta_common.serving.requests import Signature
from rosetta_common.testing import small_config

configs = {"mlp": small_config("mlp"), "text_transformer": small_config("text_transformer")}
batches = {"mlp": np.random.default_rng(0).random((4, 8, 8), dtype=np.float32),
           "text_transformer": random_tokens(np.random.default_rng(1), 4, 6, configs["text_transformer"].vocab_size)}
servers = ["torch", "onnx"]

def publish(meta_edit=None, index_edit=None):
    for server in servers:
        for protocol in paths.SERVED_PROTOCOLS:
            path = paths.served_logits(server, protocol)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **{name: np.zeros((4, c.num_classes), np.float32)
                              for m, c in configs.items() for name in served_models([m])})
        metadata = {}
        for m, c in configs.items():
            signature = Signature.of(c)
            for name in served_models([m]):
                record = {"name": name, "versions": [], "platform": "", "inputs": signature.inputs(),
                          "outputs": signature.outputs()}
                metadata[name] = {"rest": record, "grpc": copy.deepcopy(record)}
        if meta_edit:
            meta_edit(server, metadata)
        write_json(paths.served_metadata(server), metadata)
    index = {"servers": {s: {} for s in servers}, "onnx_from": "torch",
             "models": served_models(list(configs)), "protocols": list(paths.SERVED_PROTOCOLS),
             "batches": {kind: {"shape": list(batches[m].shape), "dtype": str(batches[m].dtype),
                                "sha256": batch_sha256(batches[m]), "models": served_models([m])}
                         for kind, m in (("images", "mlp"), ("tokens", "text_transformer"))},
             "sha256": {p.relative_to(paths.SERVED).as_posix(): sha256(p)
                        for p in sorted(paths.SERVED.rglob("*")) if p.is_file() and p.name != "index.json"}}
    if index_edit:
        index_edit(index)
    write_json(paths.SERVED_INDEX, index)

def judge(given=None, batch=None):
    served = read_served(batches["mlp"] if given is None else given)
    arch = "text_transformer"
    tokens = batches[arch] if batch is None else batch
    problems = model_problems(served, arch, tokens, (len(tokens), configs[arch].num_classes))
    if not problems:
        problems = metadata_problems(served, arch, configs[arch])
    return problems

found = {}
publish()
found["good"] = judge()
found["good_mlp"] = model_problems(read_served(batches), "mlp", batches["mlp"], (4, 10))
found["good_given_tokens"] = judge(given={"tokens": batches["text_transformer"]})
other = batches["text_transformer"].copy()
other[0, 0] = 1 if other[0, 0] != 1 else 2
found["other_batch"] = judge(batch=other)
found["other_batch_given"] = judge(given={"tokens": other}, batch=other)
found["as_float32"] = judge(batch=batches["text_transformer"].astype(np.float32))
found["expected"] = expected_metadata("text-transformer", configs["text_transformer"])
def fp32(server, metadata):
    if server == "onnx":
        metadata["text-transformer"]["rest"]["inputs"][0]["datatype"] = "FP32"
publish(meta_edit=fp32)
found["fp32_metadata"] = judge()
publish(index_edit=lambda index: index.update(batch=index.pop("batches")["images"]))
found["old_index"] = judge()
def unrecorded(index):
    index["batches"]["tokens"]["models"] = []
publish(index_edit=unrecorded)
found["unrecorded"] = judge()
print(json.dumps(found))
"""


def test_the_validator_reads_each_models_batch_and_metadata_from_the_served_folder(tmp_path: Path) -> None:
    """index.json records a batch per kind of input and the served names it went to: the token model is judged
    against its own int64 batch (another batch, or its ids as float32, is served_readable's problem naming its
    served name), its metadata must say INT64 "tokens" [-1, -1] on every server, and an index of the old form
    (one "batch") is unreadable."""
    result = run_in("validation", CHECKS_SCRIPT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["good"] == [] and found["good_mlp"] == [] and found["good_given_tokens"] == []
    assert found["expected"]["inputs"] == [{"name": "tokens", "datatype": "INT64", "shape": [-1, -1]}]
    assert [line.split(" was served another batch (tokens")[0] for line in found["other_batch"]] == [
        "artifacts/served/index.json: text-transformer", "artifacts/served/index.json: text-transformer-init"]
    assert any("served another tokens batch" in p for p in found["other_batch_given"]), found["other_batch_given"]
    assert any("text-transformer was served another batch (tokens" in p and "(images, " in p
               for p in found["as_float32"]), found["as_float32"]
    assert any(p.startswith("onnx rest text-transformer: ") and '"datatype": "FP32"' in p
               for p in found["fp32_metadata"]), found["fp32_metadata"]
    assert len(found["old_index"]) == 1 and "index.json: unreadable (KeyError: 'batches')" in found["old_index"][0]
    assert "records no batch sent to text-transformer" in found["unrecorded"][0], found["unrecorded"]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_server_that_exits_at_once_is_one_error_line_and_nothing_is_published(copy: TinyRun) -> None:
    """The ONNX server's module planted to exit at once: the stage names that server, how it ended and its last
    line, stops the others, and leaves the published folder as it was."""
    before = tree(copy.root / paths.SERVED)
    module = copy.root / "pipelines/serving/onnx.py"
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


def test_an_unknown_runtime_is_one_error_line_before_any_server_starts(copy: TinyRun) -> None:
    """ROSETTA_RUNTIME=container serves from containers (tests/system/test_containers.py runs it; tests/
    test_serving_containers.py checks its command lines); any other runtime is refused before anything starts."""
    before = tree(copy.root / paths.SERVED)
    bad = sh(SERVE, copy.root, {**copy.env, "ROSETTA_RUNTIME": "cloud"}, check=False)
    (line,) = error_lines(bad.stderr)
    assert bad.returncode == 1 and line == "error: ROSETTA_RUNTIME=cloud: not a runtime; allowed: local, container"
    assert "serve:" not in bad.stdout and tree(copy.root / paths.SERVED) == before


def test_the_validator_and_the_servers_read_one_served_format_table() -> None:
    """The native format each framework's server runs is written once, rosetta_common.serving.SERVED_FORMAT: the
    validator imports it (pipelines/checks/serving.py keeps no copy) and each server module's SERVED_FORMAT is
    its entry (read as the source says: this environment cannot import the servers, which import frameworks)."""
    assert set(SERVED_FORMAT) == {"torch", "tf", "jax"}
    assert "SERVED_FORMAT" not in assigned(REPO / "pipelines/checks/serving.py")
    assert "from rosetta_common.serving import SERVED_FORMAT" in (REPO / "pipelines/checks/serving.py").read_text()
    for framework in SERVED_FORMAT:
        source = REPO / f"packages/{framework}_impl/src/rosetta_{framework}/serve.py"
        assert assigned(source)["SERVER"] == framework, source
        assert "\nSERVED_FORMAT = serving.SERVED_FORMAT[SERVER]" in source.read_text(), source


def test_an_init_answer_beyond_the_tolerance_fails_validate_naming_the_init_checks(copy: TinyRun) -> None:
    """jax's V2 REST answer for cnn-init, its row 0's smallest logit moved down by 3 x forward_parity_abs (its
    argmax stays) and index.json's hash of the file re-recorded, as a server that computed so would have: validate
    fails served_init_vs_reference_v2 of cnn/jax and served_init_across_servers of every pair with jax, and
    nothing else but the documented collateral, served_init_vs_in_process_v2 of cnn/jax (the answer is no longer
    the one train_export's models.predict gave, bit for bit)."""
    tolerance = yaml.safe_load((copy.root / "params.yaml").read_text())["tolerances"]["forward_parity_abs"]

    def smallest_down(logits: np.ndarray) -> None:
        logits[0, logits[0].argmin()] -= np.float32(3 * tolerance)

    result, report = validate_with_served_answer(copy, "jax", "v2", init_name("cnn"), smallest_down)
    assert result.returncode != 0
    failed = {(r["model"], r["framework"], r["check"]) for r in report["checks"] if not r["passed"]}
    judged = {("cnn", "jax", names.served(names.SERVED_INIT_VS_REFERENCE, "v2"))} | {
        ("cnn", pair, names.SERVED_INIT_ACROSS_SERVERS) for pair in PAIRS if "jax" in pair.split("|")}
    collateral = {("cnn", "jax", names.served(names.SERVED_INIT_VS_IN_PROCESS, "v2"))}
    assert failed == judged | collateral, failed
    for model, subject, check in judged:
        assert f"FAILED {model}/{subject} {check}: value " in result.stderr, result.stderr[-3000:]
        row = next(r for r in report["checks"] if (r["model"], r["framework"], r["check"]) == (model, subject, check))
        assert row["tolerance"] == tolerance and row["value"] > 2 * tolerance, row


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
