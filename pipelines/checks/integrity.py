"""Artifact integrity: every file of a run folder against the sha256 its export.json recorded. Every figure the
validator judges is tied to those exact bytes, so a run that fails this is judged no further."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines import paths
from pipelines.checks.ledger import ARTIFACTS_INTACT, Ledger
from rosetta_common.io import read_json, sha256

REQUIRED = ("trained.safetensors", "train_log.json", "native_outputs.npz", paths.TAPS_FILE, "model.onnx", "init.onnx",
            "export.json")


def intact(ledger: Ledger, arch: str, fw: str) -> dict[str, Any] | None:
    """The run's export.json if every file it records is there with the sha256 it records, else None (and a
    failed check naming the file)."""
    run = paths.run_dir(arch, fw)
    problems = [f"{run / name}: missing" for name in REQUIRED if not (run / name).is_file()]
    record: dict[str, Any] = {}
    if not problems:
        try:
            record = read_json(run / "export.json")
            recorded = record["sha256"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            problems.append(f"{run / 'export.json'}: unreadable ({type(error).__name__}: {error})")
            recorded = {}
        native = {str(p.relative_to(run)) for p in (run / "native").rglob("*") if p.is_file()}
        native = {rel for rel in native if not paths.unhashed(Path(rel))}
        for rel in sorted(native - set(recorded)):
            problems.append(f"{run / rel}: not among the files export.json recorded")
        for rel, digest in sorted(recorded.items()):
            path = run / rel
            if not path.is_file():
                problems.append(f"{path}: missing (export.json recorded it)")
            elif sha256(path) != digest:
                problems.append(f"{path}: altered since export (sha256 differs from export.json's)")
        for name in ("trained.safetensors", "native_outputs.npz", paths.TAPS_FILE, "model.onnx", "init.onnx"):
            if name not in recorded:
                problems.append(f"{run / 'export.json'}: records no sha256 for {name}")
    ledger.add(arch, fw, ARTIFACTS_INTACT, float(len(problems)), 0.0, not problems, "; ".join(problems[:3]))
    return None if problems else record
