"""Read the lineage the report stands on into one structure: each run's folder (artifacts/<framework>/<model>/:
metrics.json, train_log.json, export.json, the ONNX files) and reports/validation.json. Never measurements/: they
are no dependency of the report stage, so nothing rendered at build time may come from them.

A missing or unreadable input is recorded (and shown in the report) rather than fatal: a report on a half-run
pipeline is still useful, and says so."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import paths
from pipelines.report.onnx_summary import OnnxSummary, summarize
from rosetta_common.spec import Spec, load_spec

ONNX_FILES = {"model.onnx": paths.onnx_model, "init.onnx": paths.init_onnx}


@dataclass
class Run:
    """One framework's run of one model."""

    model: str
    framework: str
    metrics: dict[str, Any] | None = None
    train_log: dict[str, Any] | None = None
    export: dict[str, Any] | None = None
    onnx: dict[str, OnnxSummary] = field(default_factory=dict)  # "model.onnx" / "init.onnx" -> summary


@dataclass
class Inputs:
    root: Path
    spec: Spec
    params_text: str  # params.yaml as written, comments included
    runs: dict[tuple[str, str], Run]
    validation: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)  # "path: what is wrong", in reading order

    @property
    def models(self) -> list[str]:
        return list(self.spec.models)

    @property
    def frameworks(self) -> list[str]:
        return list(self.spec.frameworks)

    def run(self, model: str, framework: str) -> Run:
        return self.runs[(model, framework)]


class _Reader:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.problems: list[str] = []

    def json(self, rel: Path) -> Any | None:
        try:
            with open(self.root / rel, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            self.problems.append(f"{rel}: missing")
        except (OSError, ValueError) as error:
            self.problems.append(f"{rel}: unreadable ({type(error).__name__}: {error})")
        return None

    def onnx(self, rel: Path) -> OnnxSummary | None:
        if not (self.root / rel).is_file():
            self.problems.append(f"{rel}: missing")
            return None
        try:
            return summarize(self.root / rel, str(rel))
        except Exception as error:  # onnx raises several unrelated types on a corrupt file
            self.problems.append(f"{rel}: not a readable ONNX model ({type(error).__name__})")
            return None


def collect(root: Path) -> Inputs:
    spec = load_spec(root / paths.PARAMS)  # validated: the report judges nothing against unchecked params
    params_text = (root / paths.PARAMS).read_text()
    reader = _Reader(root)
    runs = {}
    for model in spec.models:
        for fw in spec.frameworks:
            run = Run(model, fw)
            run.metrics = reader.json(paths.metrics(model, fw))
            run.train_log = reader.json(paths.train_log(model, fw))
            run.export = reader.json(paths.export_record(model, fw))
            for name, where in ONNX_FILES.items():
                summary = reader.onnx(where(model, fw))
                if summary is not None:
                    run.onnx[name] = summary
            runs[(model, fw)] = run
    validation = reader.json(paths.VALIDATION)
    return Inputs(root, spec, params_text, runs, validation, reader.problems)
