"""Turn the collected inputs into the report's two renderings: one self-contained HTML file (inline CSS,
figures as data URIs, a Content-Security-Policy that forbids any fetch) and Markdown with the same tables."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import jinja2

from pipelines.report import analysis, figures
from pipelines.report.collect import Inputs
from pipelines.report.environment import environment_rows, git_revision
from pipelines.report.sources import extract

TEMPLATES = Path(__file__).parent / "templates"
MISSING = "—"


def fmt(value: Any, kind: str = "g") -> str:
    """One number formatter for both renderings; a missing or non-finite value shows as a dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    if isinstance(value, str):
        return value
    formats = {
        "sci": lambda v: f"{v:.2e}",
        "pct": lambda v: f"{100 * v:.2f} %",
        "int": lambda v: f"{int(v):,}",
        "s": lambda v: f"{v:.2f} s",
        "ms": lambda v: f"{v:.3f}",
        "x": lambda v: f"{v:.2f}x",
        "loss": lambda v: f"{v:.5f}",
        "rate": lambda v: f"{v:,.0f}",
        "kib": lambda v: f"{v / 1024:,.1f} KiB",
        "g": lambda v: f"{v:.4g}",
    }
    return formats[kind](value)


def md_cell(value: Any) -> str:
    """A Markdown table cell: pipes (as in "torch|tf") and newlines would break the table."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _environment(kind: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=kind == "html",
        undefined=jinja2.StrictUndefined,  # a typo in a template fails the stage instead of printing nothing
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["fmt"] = fmt
    env.filters["md"] = md_cell
    return env


def _epoch_loss(log: dict[str, Any] | None, epoch: int) -> float | None:
    losses = (log or {}).get("epoch_losses") or []
    return losses[epoch] if epoch < len(losses) else None


def model_section(inputs: Inputs, model: str) -> dict[str, Any]:
    ops, op_rows = analysis.op_table(inputs, model)
    matrix = analysis.forward_parity(inputs, model)
    logs = {fw: inputs.run(model, fw).train_log for fw in inputs.frameworks}
    epochs = max((len(log.get("epoch_losses", [])) for log in logs.values() if log), default=0)
    return {
        "name": model,
        "runs": analysis.run_rows(inputs, model),
        "onnx": [
            {"framework": fw, "file": name, "summary": inputs.run(model, fw).onnx.get(name)}
            for fw in inputs.frameworks
            for name in ("model.onnx", "init.onnx")
        ],
        "ops": ops,
        "op_rows": op_rows,
        "op_figure": figures.op_histogram(model, ops, op_rows, inputs.frameworks),
        "parity": matrix,
        "parity_figure": figures.parity_heatmap(model, matrix),
        "training_parity": analysis.training_parity(inputs, model),
        "loss_figure": figures.loss_curves(model, logs),
        "epoch_losses": [
            {"epoch": e + 1, **{fw: _epoch_loss(log, e) for fw, log in logs.items()}} for e in range(epochs)
        ],
        "latency": analysis.latency_rows(inputs, model),
        "sources": [extract(inputs.root, fw, model) for fw in inputs.frameworks],
        "checks": analysis.check_rows(inputs, model),
    }


def context(inputs: Inputs, envs_dir: Path | None, variant: str = "cpu") -> dict[str, Any]:
    sections = [model_section(inputs, model) for model in inputs.models]
    return {
        "title": "Rosetta: artifact comparison report",
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "verdict": analysis.verdict(inputs),
        "frameworks": inputs.frameworks,
        "models": sections,
        "latency_figure": figures.latency_ratios({s["name"]: s["latency"] for s in sections}, inputs.frameworks),
        "training_figures": analysis.TRAINING_FIGURES,
        "tolerances": inputs.spec.tolerances.model_dump(),
        "environments": environment_rows(inputs.root, envs_dir, variant),
        "revision": git_revision(inputs.root),
        "params": inputs.params_text,
        "optimizer": inputs.spec.train.optimizer,
    }


def render(ctx: dict[str, Any], kind: str) -> str:
    return _environment(kind).get_template(f"report.{kind}.j2").render(**ctx)
