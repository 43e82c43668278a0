"""The report's figures, drawn with matplotlib's Agg backend and embedded as base64 PNG data URIs (the HTML
must open offline, as one file). The object API (Figure + FigureCanvasAgg) keeps no global pyplot state.

Byte-stable: the same inputs give the same bytes (the report is lineage). Every figure is drawn under `STABLE`
(matplotlib's bundled font, a fixed SVG hash salt should a figure ever be saved as SVG) and saved without the
metadata that would vary (date, software version). Only lineage is drawn here: no timings (they are measurements,
shown by report.html's script)."""

from __future__ import annotations

import base64
import functools
import io
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec

import matplotlib

matplotlib.use("Agg")  # before anything else of matplotlib: no display here, and none wanted

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipelines.report.analysis import ParityMatrix

P = ParamSpec("P")
# rcParams every figure is drawn under, whatever the user's matplotlibrc says.
STABLE = {
    "svg.hashsalt": "rosetta",  # SVG ids from a fixed salt, not a random one
    "font.family": "DejaVu Sans",  # shipped inside matplotlib: the same glyphs on every machine
    "path.simplify": True,
    "savefig.dpi": 110,
}
# Metadata that would change the bytes without changing the figure (PNG "Software"; SVG/PDF "Date" too).
METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None}}
COLORS = {"torch": "#ee4c2c", "tf": "#1f6fb4", "jax": "#2ca02c", "reference": "#555555"}
DPI = 110


def color(name: str) -> str:
    return COLORS.get(name, "#8c564b")


def stable(draw: Callable[P, str | None]) -> Callable[P, str | None]:
    """Draw a figure under the fixed rcParams (font properties are resolved when artists are made, so the whole
    drawing runs under them, not only the save)."""

    @functools.wraps(draw)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> str | None:
        with matplotlib.rc_context(STABLE):
            return draw(*args, **kwargs)

    return wrapper


def data_uri(fig: Figure, fmt: str = "png") -> str:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    with matplotlib.rc_context(STABLE):
        fig.savefig(buffer, format=fmt, dpi=DPI, metadata=METADATA[fmt])
    mime = {"png": "image/png", "svg": "image/svg+xml"}[fmt]
    return f"data:{mime};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@stable
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


@stable
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


@stable
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


@stable
def running_statistics(model: str, figures: Sequence[Mapping[str, Any]], tolerance: float) -> str | None:
    """Per BatchNorm layer, each pair's relative difference of the running mean and variance after training (log
    scale), with the tolerance the worst one is judged against."""
    layers = sorted({layer for fig in figures for layer in fig.get("layers", {})})
    if not layers:
        return None
    fig = Figure(figsize=(11, 0.9 + 0.5 * len(layers)))
    axes = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(layers))
    height = 0.8 / max(1, len(figures))
    pairs = [str(f.get("pair", "")) for f in figures]
    for ax, statistic in zip(axes, ("running_mean", "running_var"), strict=True):
        values = [[f["layers"].get(layer, {}).get(statistic, math.nan) for layer in layers] for f in figures]
        positive = [v for row in values for v in row if math.isfinite(v) and v > 0]
        floor = min([tolerance * 1e-4, *positive])
        for k, (pair, row) in enumerate(zip(pairs, values, strict=True)):
            shown = [max(v, floor) if math.isfinite(v) else 0.0 for v in row]  # 0 (bitwise equal) at the floor
            ax.barh(y + (k - (len(pairs) - 1) / 2) * height, shown, height=height, label=pair,
                    color=["#6f42c1", "#d4a72c", "#0a7f8c"][k % 3])
        ax.axvline(tolerance, color="red", lw=1.5, label=f"tolerance {tolerance:.0e}")
        ax.set(xscale="log", xlabel="max |a - b| / max |value|", title=f"{model}: {statistic.replace('_', ' ')}")
        ax.grid(axis="x", alpha=0.3, which="both")
    axes[0].set_yticks(y, layers)
    axes[0].invert_yaxis()
    axes[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return data_uri(fig)


@stable
def replicates(model: str, runs: Sequence[Mapping[str, Any]]) -> str | None:
    """Each framework's run (large dot) and its replicates (small dots) side by side: test loss and test
    accuracy, the null against which two frameworks' runs are judged once they part (validate's end_of_training)."""
    runs = [r for r in runs if r.get("model") == model and r.get("replicates")]
    if not runs:
        return None
    fig = Figure(figsize=(9, 2.6))
    axes = fig.subplots(1, 2)
    for ax, key, label in zip(axes, ("test_loss", "test_accuracy"), ("test loss", "test accuracy"), strict=True):
        for x, run in enumerate(runs):
            values = [r[key] for r in run["replicates"]]
            ax.scatter(np.full(len(values), x) + np.linspace(-0.15, 0.15, len(values)), values, s=18,
                       color=color(run["framework"]), alpha=0.7)
            ax.scatter([x], [run[key]], s=70, color=color(run["framework"]), edgecolor="black", zorder=3)
        ax.set_xticks(range(len(runs)), [r["framework"] for r in runs])
        ax.set(title=f"{model}: {label}", xlim=(-0.6, len(runs) - 0.4))
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return data_uri(fig)


PAIR_COLORS = ["#6f42c1", "#d4a72c", "#0a7f8c"]  # as running_statistics draws its pairs


@stable
def parting(model: str, record: Mapping[str, Any] | None) -> str | None:
    """Where the trainings part (validation.json's "parting"): per framework, the step each replicate parts from
    its run (filled dots) and each two replicates part (hollow), a pair that never parts drawn at "never"; each
    pair of frameworks' runs as a dashed vertical line at its parting step. Dots right of the lines are near-copies
    of their run where the frameworks already differ."""
    if not record or not record.get("within"):
        return None
    total = int(record["steps"])
    never = total * 1.06
    fig = Figure(figsize=(9, 0.6 + 0.55 * 2 * len(record["within"])))
    ax = fig.subplots()
    labels = []
    for row, (fw, mine) in enumerate(record["within"].items()):
        for offset, (key, hollow) in enumerate((("run", False), ("replicates", True))):
            steps = [never if s is None else s for s in mine[key]]
            y = 2 * row + offset + np.linspace(-0.18, 0.18, len(steps)) if steps else []
            ax.scatter(steps, y, s=26, facecolor="none" if hollow else color(fw), edgecolor=color(fw), zorder=3)
            labels.append(f"{fw}: run vs replicate" if key == "run" else f"{fw}: replicate pairs")
    for i, (pair, step) in enumerate(record["across"].items()):
        if step is not None:
            ax.axvline(step, color=PAIR_COLORS[i % len(PAIR_COLORS)], linestyle="--", linewidth=1.2,
                       label=f"{pair} runs part at {step}")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ticks = [t for t in MaxNLocator(6, integer=True).tick_values(0, total) if 0 <= t <= total]
    ax.set_xticks([*ticks, never], [*(str(int(t)) for t in ticks), "never"])
    ax.set(xlim=(0, total * 1.1), xlabel="training step at which the two step losses part",
           title=f"{model}: where the trainings part")
    ax.grid(axis="x", alpha=0.3)
    if any(step is not None for step in record["across"].values()):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.3 / len(labels)), ncol=3, fontsize=8,
                  frameon=False)
    fig.tight_layout()
    return data_uri(fig)


@stable
def taps_along(model: str, record: Mapping[str, Any] | None, tolerance: float) -> str | None:
    """Max abs error along the taps (x: the taps in the order the forward computes them; y: log scale): each
    framework against the float64 reference (solid, its colour) and each pair (dashed), for the init weights
    (judged at `tolerance`, the red line) and the trained ones (figures only). A ring marks each comparison's
    first tap over the tolerance; a tap that agrees bitwise is drawn at the floor."""
    if not record or not record.get("init", {}).get("vs_reference"):
        return None
    fig = Figure(figsize=(11, 3.9))
    axes = fig.subplots(1, 2, sharey=True)
    values = [t["max_abs"] for kind in ("init", "trained") for side in ("vs_reference", "pairs")
              for c in record.get(kind, {}).get(side, {}).values() for t in c["taps"]]
    positive = [v for v in values if v is not None and v > 0]
    floor = min([tolerance * 1e-4, *positive])
    top = max([tolerance * 10, *positive])
    for ax, kind in zip(axes, ("init", "trained"), strict=True):
        comparisons = record.get(kind, {})
        names: list[str] = []
        lines = [(f"{fw} vs reference", c, color(fw), "-") for fw, c in comparisons.get("vs_reference", {}).items()]
        pairs = comparisons.get("pairs", {}).items()
        lines += [(pair, c, PAIR_COLORS[k % 3], "--") for k, (pair, c) in enumerate(pairs)]
        for label, c, shade, style in lines:
            names = [t["tap"] for t in c["taps"]]
            # a non-finite figure (null) is drawn at the top: it is the worst there can be
            shown = [top if t["max_abs"] is None else max(t["max_abs"], floor) for t in c["taps"]]
            ax.plot(range(len(shown)), shown, style, marker=".", color=shade, lw=1.4, label=label)
            if c.get("first_divergent") in names:
                at = names.index(c["first_divergent"])
                ax.plot([at], [shown[at]], "o", ms=10, mfc="none", mec=shade, mew=1.6)
        ax.axhline(tolerance, color="red", lw=1.2, label=f"tolerance {tolerance:.0e}")
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        title = "init (judged)" if kind == "init" else "trained (figures only)"
        ax.set(yscale="log", ylim=(floor / 2, top * 2), title=f"{model}: {title}", ylabel="max |diff|")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return data_uri(fig)
