"""SIGKILL a real stage, whole process group, at several points, in a copy of the session's finished TINY run:
during training, between two outputs, during the export's writes, just after its folder was published (and
`dvc repro` itself while a framework's stage is between two models: test_lineage.py, on its two-model clone).
Afterwards no lineage output (data/, artifacts/, reports/) is partial or mixed: a run folder is either the
complete previous one, byte for byte, or absent (DVC removes a stage's outputs before it runs the stage), or
complete and consistent with its own export.json; no *.tmp file lies among them; and the next `dvc repro`
completes, with the validate stage passing.

Direct kills run the stage as dvc.yaml does but with a changed learning rate, so that the new folder differs from
the old one and a mix of the two could not pass for either.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from pipelines import paths
from support import TinyRun, ran_stages, replace_file, sh
from support.integrity import VALIDATE, Started, check_outputs, fingerprint, leftovers, train_export

RUN = str(paths.run_dir("mlp", "jax"))  # the run folder the direct kills target (jax starts fastest)


@dataclass(frozen=True)
class Run:
    root: Path
    env: dict[str, str]
    validated: set[str] = field(default_factory=set)  # validate_inputs() of every state validate passed on here


def staged(root: Path, name: str = "mlp") -> set[Path]:
    """Run folders being built in scratch (rosetta_common.io.staged_outputs) for a model (a run folder is named
    after its model); a killed stage leaves its own behind (scratch is not lineage), so a test looks only at those
    its run made."""
    return set((root / ".rosetta/tmp").glob(f".{name}.*.tmp/{name}"))


def staged_has(root: Path, earlier: set[Path], present: str, absent: str = "export.json") -> bool:
    return any(any(folder.glob(present)) and not (folder / absent).exists()
               for folder in staged(root) - earlier)


def digest(path: Path) -> str | None:
    """The file's sha256, None while it is absent (polled during a publish: the old folder is moved aside before
    the new one is renamed in, so the file can vanish between a check and a read)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def validate_inputs(root: Path) -> str:
    """One digest of everything the validate stage judges (dvc.yaml: data/prepared, artifacts, params.yaml; the code
    it runs, pipelines/ and rosetta_common, is not edited here, only a framework package it never imports): its
    verdict is a function of these bytes."""
    files = fingerprint(root, ("data", "artifacts")) | {"params.yaml": hashlib.sha256(
        (root / "params.yaml").read_bytes()).hexdigest()}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def repro_completes(run: Run) -> set[str]:
    """The next `dvc repro` finishes, nothing is left to run, and the validate stage passes on what it made (run
    here, unless it already passed in this module on byte-identical inputs, which give the same verdict)."""
    result = sh(["dvc", "repro"], run.root, run.env)
    status = sh(["dvc", "status"], run.root, run.env)
    assert "up to date" in status.stdout, status.stdout
    inputs = validate_inputs(run.root)
    if inputs not in run.validated:
        sh(VALIDATE, run.root, run.env)  # fails (non-zero) on any failed check
        run.validated.add(inputs)
    assert json.loads((run.root / "reports/validation.json").read_text())["passed"] is True
    assert not leftovers(run.root)
    return ran_stages(result.stdout)


@pytest.fixture(scope="module")
def run(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """This module's own copy of the session's finished run (the kills must not touch the shared one)."""
    root = tmp_path_factory.mktemp("stage_kills") / "repo"
    shutil.copytree(tiny_pipeline.root, root, symlinks=True)
    return Run(root, tiny_pipeline.env)


@dataclass(frozen=True)
class Point:
    """What the kill waits for, seen from the test: the run's output so far, the repository, what was staged
    before the run started, and the old export.json's sha256."""

    output: str
    root: Path
    earlier: set[Path]
    old_export: str


# Kill points of one direct run of train_export@jax for mlp alone, and the states its run folder may be left in.
POINTS = [
    # tqdm's bar appears as training starts (the first step compiles, then every epoch runs)
    pytest.param(lambda p: "jax mlp:" in p.output, "old", id="during-training"),
    # trained.safetensors, train_log.json and metrics.json are staged; the export has not recorded anything yet
    pytest.param(lambda p: staged_has(p.root, p.earlier, "metrics.json"), "old", id="between-train-and-export"),
    # the first native file is staged: the export is writing native/; model.onnx and the rest are to come
    pytest.param(lambda p: staged_has(p.root, p.earlier, "native/*"), "old", id="during-export-writes"),
    # the new folder is published (export.json changed); the stage still measures latency into measurements/
    pytest.param(lambda p: digest(p.root / RUN / "export.json") not in (None, p.old_export), "complete",
                 id="after-publish"),
]


@pytest.mark.parametrize(("ready", "allowed"), POINTS)
def test_direct_kill_leaves_old_or_complete(run: Run, ready: Callable[[Point], bool], allowed: str) -> None:
    before = fingerprint(run.root)
    earlier = staged(run.root)
    params = run.root / "params.yaml"
    original = params.read_bytes()
    changed = yaml.safe_load(original)
    changed["optimizers"]["adam"]["learning_rate"]["mlp"] = 2e-3  # the new folder differs from the old one
    replace_file(params, yaml.safe_dump(changed, sort_keys=False).encode())
    try:
        started = Started(train_export("jax", "mlp"), run.root, run.env)
        started.kill_when(lambda: ready(Point(started.output(), run.root, earlier, before[f"{RUN}/export.json"])))
        state = check_outputs(run.root, before, {RUN: allowed})[RUN]
    finally:
        replace_file(params, original)
    repro_completes(run)
    # an untouched folder needs nothing; a new one (the other learning rate) is replaced by the one params.yaml
    # makes (DVC checks it out from its run cache, or reruns the stage): the previous folder, byte for byte
    assert fingerprint(run.root, ("data", "artifacts")) == {
        k: v for k, v in before.items() if k.startswith(("data/", "artifacts/"))
    }, f"after a kill leaving it {state}, the next repro did not give back the run folder"
