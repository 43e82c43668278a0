"""The report's figures, drawn with matplotlib's Agg backend and embedded as base64 PNG data URIs (the HTML
must open offline, as one file). The object API (Figure + FigureCanvasAgg) keeps no global pyplot state."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before anything else of matplotlib: no display here, and none wanted

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipelines.report.analysis import ParityMatrix

COLORS = {"torch": "#ee4c2c", "tf": "#1f6fb4", "jax": "#2ca02c", "reference": "#555555"}
DPI = 110


def color(name: str) -> str:
    return COLORS.get(name, "#8c564b")


def data_uri(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    # Fixed metadata: the same figure gives the same bytes, so the report does not change without cause.
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def loss_curves(model: str, logs: Mapping[str, dict[str, Any] | None]) -> str | None:
    """Step losses of every framework overlaid (log scale), and each one's distance from the first one's."""
    logs = {fw: log for fw, log in logs.items() if log and log.get("step_losses")}
    if not logs:
        return None
    fig = Figure(figsize=(11, 3.8))
    ax, diff = fig.subplots(1, 2)
    first = next(iter(logs))
    base = np.asarray(logs[first]["step_losses"], dtype=np.float64)
    # Wider lines first: curves that coincide (the expected case) stay visible one inside the other.
    widths = np.linspace(2.8, 0.9, num=len(logs))
    for (fw, log), width in zip(logs.items(), widths, strict=True):
        steps = np.asarray(log["step_losses"], dtype=np.float64)
        x = np.arange(1, steps.size + 1)
        ax.plot(x, steps, color=color(fw), lw=width, alpha=0.85, label=fw)
        per_epoch = int(log.get("steps_per_epoch") or 0)
        epochs = log.get("epoch_losses") or []
        if per_epoch and epochs:  # each epoch's mean, at the middle of its steps
            middle = per_epoch * (np.arange(len(epochs)) + 0.5) + 0.5
            ax.plot(middle, epochs, "o", color=color(fw), ms=4, mec="white")
        if fw != first and steps.shape == base.shape:
            # Markers, not a line: steps with bitwise-equal losses (often most) cannot be drawn on a log scale.
            gap = np.abs(steps - base)
            equal = int(np.sum(gap == 0))
            diff.plot(x, np.where(gap > 0, gap, np.nan), ".", color=color(fw), ms=4,
                      label=f"|{fw} - {first}| ({equal} of {gap.size} steps equal)")
    ax.set(yscale="log", xlabel="step", ylabel="training loss", title=f"{model}: step losses (dots: epoch means)")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    diff.set(yscale="log", xlabel="step", ylabel="absolute difference", title=f"{model}: loss difference vs {first}")
    if diff.lines:
        diff.legend()
    else:
        diff.text(0.5, 0.5, "only one framework", ha="center", va="center", transform=diff.transAxes)
    diff.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return data_uri(fig)


def parity_heatmap(model: str, matrix: ParityMatrix) -> str | None:
    values = np.asarray(matrix.values, dtype=np.float64)
    if not np.isfinite(values).any():
        return None
    n = len(matrix.labels)
    positive = values[np.isfinite(values) & (values > 0)]
    floor = min([matrix.tolerance * 1e-4, *positive.tolist()])
    top = max([matrix.tolerance * 10, *positive.tolist()])
    shown = np.where(np.isfinite(values), np.maximum(values, floor), np.nan)
    fig = Figure(figsize=(1.6 + 1.25 * n, 1.1 + 1.05 * n))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(shown), cmap="viridis", norm=LogNorm(vmin=floor, vmax=top))
    for i in range(n):
        for j in range(n):
            v = values[i, j]
            if i == j or not math.isfinite(v):
                ax.text(j, i, "-", ha="center", va="center", color="#777777")
                continue
            failed = matrix.passed[i][j] is False
            text = ("0" if v == 0 else f"{v:.1e}") + ("\nFAIL" if failed else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="red" if failed else "white",
                    fontweight="bold" if failed else "normal")
    ax.set_xticks(range(n), matrix.labels, rotation=30, ha="right")
    ax.set_yticks(range(n), matrix.labels)
    ax.set_title(f"{model}: max |diff| of init forward\n(tolerance {matrix.tolerance:.0e})", fontsize=10)
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    bar.ax.axhline(matrix.tolerance, color="red", lw=2)  # where values stop passing
    fig.tight_layout()
    return data_uri(fig)


def op_histogram(
    model: str, ops: Sequence[str], rows: Sequence[Mapping[str, Any]], frameworks: Sequence[str]
) -> str | None:
    if not ops:
        return None
    fig = Figure(figsize=(8, 1.2 + 0.22 * len(ops) * max(2, len(frameworks)) / 2))
    ax = fig.subplots()
    height = 0.8 / max(1, len(frameworks))
    y = np.arange(len(ops))
    for k, fw in enumerate(frameworks):
        counts = [row.get(fw) or 0 for row in rows]
        ax.barh(y + (k - (len(frameworks) - 1) / 2) * height, counts, height=height, color=color(fw), label=fw)
    ax.set_yticks(y, ops)
    ax.invert_yaxis()  # most used op on top
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # node counts
    ax.set(xlabel="nodes", title=f"{model}: op types in model.onnx per exporter")
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return data_uri(fig)


def latency_ratios(rows_by_model: Mapping[str, Sequence[Mapping[str, Any]]], frameworks: Sequence[str]) -> str | None:
    """Native / ONNX Runtime median latency per model and batch size (log scale; above 1: ONNX Runtime faster)."""
    groups = sorted({(model, r["batch"]) for model, rows in rows_by_model.items() for r in rows},
                    key=lambda g: (list(rows_by_model).index(g[0]), g[1]))
    if not groups:
        return None
    fig = Figure(figsize=(max(6.0, 1.3 * len(groups) + 2), 3.8))
    ax = fig.subplots()
    width = 0.8 / max(1, len(frameworks))
    x = np.arange(len(groups))
    for k, fw in enumerate(frameworks):
        ratios = []
        for model, batch in groups:
            rows = rows_by_model[model]
            found = [r["native_over_onnx"] for r in rows if r["framework"] == fw and r["batch"] == batch]
            ratios.append(found[0] if found else np.nan)
        # Bars grow from 1 (parity) up or down, so "ONNX Runtime slower" reads as a bar below the line.
        heights = np.asarray(ratios, dtype=np.float64) - 1.0
        ax.bar(x + (k - (len(frameworks) - 1) / 2) * width, heights, bottom=1.0, width=width, color=color(fw), label=fw)
    ax.axhline(1.0, color="black", lw=1)
    ax.set_yscale("log")
    finite = [r["native_over_onnx"] for rows in rows_by_model.values() for r in rows if r.get("native_over_onnx")]
    if finite:  # room above the tallest bar and below the shortest, with 1 always in view
        ax.set_ylim(min([*finite, 1.0]) / 1.6, max([*finite, 1.0]) * 1.6)
    ax.set_xticks(x, [f"{m}\nbatch {b}" for m, b in groups])
    ax.set(ylabel="native / ONNX Runtime (median)", title="Latency ratio: above 1, ONNX Runtime is faster")
    ax.legend()
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    return data_uri(fig)
