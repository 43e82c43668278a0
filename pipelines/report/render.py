"""Turn the collected inputs into the report's two renderings: one self-contained HTML file (inline CSS,
figures as data URIs, a Content-Security-Policy that allows no fetch but one script) and Markdown. Both render
the same sections and the same tables (tables.py); only the figures and the measurements are HTML's alone.

Byte-stable: what is rendered here depends on the inputs only (no date, no git state, no absolute path, no
timing). The measurements of this run (timings) are no input: report.html loads MEASUREMENTS_JS, relative to
itself, and its inline script (templates/measurements.js, allowed by its hash) draws them in the browser."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from pipelines.report import analysis, deployment, figures, tables
from pipelines.report.collect import Inputs
from pipelines.report.environment import environment_rows
from pipelines.report.sources import extract
from pipelines.report.tables import Group, fmt

TEMPLATES = Path(__file__).parent / "templates"
# measurements/timings.js as seen from reports/comparison/report.html (paths.REPORT; pipelines/measurements.py).
MEASUREMENTS_JS = "../../measurements/timings.js"
MEASUREMENTS_TITLE = "Measurements of this run on this machine (not part of the reproducible lineage)"
MEASUREMENTS_WHERE = (
    "Timings (training time, throughput, inference latency natively and in ONNX Runtime) are measurements of one "
    "run on one machine, not lineage, so no reproducible file holds them: they are in measurements/ "
    "(measurements/<model>/<framework>.json, latency.csv, metrics/), shown by `dvc metrics show` and "
    "`dvc plots show`, and by report.html when it is opened next to them."
)


@dataclass
class Section:
    id: str  # the HTML anchor, linked from the navigation
    title: str
    note: str = ""
    groups: list[Group] = field(default_factory=list)  # one per model
    figures: list[tuple[str, str]] = field(default_factory=list)  # section-wide figures (HTML only)
    kind: str = "tables"  # "tables", or a section with its own markup: "sources", "environment", "measurements"


def md_cell(value: Any) -> str:
    """A Markdown table cell: pipes (as in "torch|tf") and newlines would break the table."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table_cell(cell: tables.Cell) -> str:
    """One table cell in Markdown: code in backticks, a row label or a failure in bold, a second line in
    parentheses, several values joined by "; "."""
    values = [cell.text] if cell.text or not cell.lines else []
    values += list(cell.lines)
    shown = "; ".join(f"`{v}`" if cell.mono and v else v for v in values)
    if cell.header or cell.failed:
        shown = f"**{shown}**"
    if cell.link:  # the figure is report.html's alone
        shown = f"[{shown}](report.html{cell.link})"
    if cell.sub:
        shown += f" ({cell.sub})"
    return md_cell(shown)


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
    env.filters["mdcell"] = md_table_cell
    env.filters["mdalign"] = lambda column: "---" if column.left else "--:"
    env.filters["mdlabel"] = lambda column: md_cell(f"{column.group}: {column.label}" if column.group else column.label)
    return env


def _figure(uri: str | None, alt: str) -> list[tuple[str, str]]:
    return [(uri, alt)] if uri else []


def _present(table: tables.Table | None) -> list[tables.Table]:
    """A table a model may lack (running statistics without BatchNorm, recurrent forms without a recurrent layer)."""
    return [table] if table is not None else []


def measured_versions(inputs: Inputs) -> dict[str, dict[str, str]]:
    """Per framework, the package versions its train_export stage recorded in export.json (what ran, as
    installed): the first model's record that has them, in the spec's order."""
    found: dict[str, dict[str, str]] = {}
    for (_, fw), run in inputs.runs.items():
        versions = (run.export or {}).get("versions")
        if isinstance(versions, dict) and versions and fw not in found:
            found[fw] = {str(k): str(v) for k, v in versions.items()}
    return found


def _runs(inputs: Inputs) -> Section:
    return Section(
        "runs",
        "Models: size, quality and training",
        "Test accuracy and loss as the validate stage recomputed them where reports/validation.json records "
        "them, else as the train_export stage measured them (metrics.json). Timings are measurements, not "
        "lineage: see the measurements section.",
        [Group(m, [tables.runs(inputs, m)]) for m in inputs.models],
    )


def _loss(inputs: Inputs) -> Section:
    def group(m: str) -> Group:
        logs = {fw: inputs.run(m, fw).train_log for fw in inputs.frameworks}
        return Group(m, [tables.epoch_losses(inputs, m)], _figure(figures.loss_curves(m, logs), f"{m} loss curves"))

    return Section(
        "loss",
        "Loss curves",
        "Every framework trained from the same initial weights on the same batches in the same order; curves "
        "that lie on top of each other are the point.",
        [group(m) for m in inputs.models],
    )


PARITY_NOTE = (
    "Forward parity: each framework's init.onnx (the shared initial weights) under ONNX Runtime, pairwise "
    "and against the float64 numpy reference, max abs difference over several batch sizes. Training "
    "parity: the same training run in each framework, compared pair by pair; each figure with the "
    "tolerance it was judged against (params.yaml tolerances). Lockstep checkpoints: every weight, running "
    "statistic and eval logit of each pair after the first steps, at a float32 bound for every model. "
    "Models with BatchNorm: its running mean "
    "and variance after training, pair by pair, from the trained canonical weights. Once two runs part "
    "(the parting step), a figure beyond its bound is judged against the spread of each framework's "
    "replicates (the strip plots): one pooled permutation test per model and figure over every run and its "
    "parted replicates, its pseudo-F, its p-value and the threshold Holm's correction holds it to. Where the "
    "trainings part: the step at which each replicate parts from its run and from the other replicates, beside "
    "the steps at which the frameworks' runs part from each other."
)


def _parity_group(inputs: Inputs, m: str) -> Group:
    matrix = analysis.forward_parity(inputs, m)
    statistics = analysis.running_statistics(inputs, m)
    bound = analysis.trained_tolerances(inputs, m).running_stats_rel
    return Group(
        m,
        [tables.forward_parity(matrix), tables.training_parity(inputs, m),
         *_present(tables.lockstep(inputs, m)), *_present(tables.running_statistics(inputs, m)),
         *_present(tables.parting(inputs, m))],
        _figure(figures.parity_heatmap(m, matrix), f"{m} forward parity heat map")
        + _figure(figures.running_statistics(m, statistics, bound), f"{m} BatchNorm running statistics after training")
        + _figure(figures.replicates(m, (inputs.validation or {}).get("runs", [])),
                  f"{m} each framework's run and its replicates")
        + _figure(figures.parting(m, analysis.parting(inputs, m)), f"{m} where the trainings part"),
    )


def _parity(inputs: Inputs) -> Section:
    return Section("parity", "Parity", PARITY_NOTE, [_parity_group(inputs, m) for m in inputs.models])


def _taps(inputs: Inputs) -> Section:
    tolerance = inputs.spec.tolerances.forward_parity_abs
    return Section(
        "taps",
        "Per-layer taps",
        "Where two forwards part: every canonical tap (rosetta_common.taps) of the validation batch, as each "
        "framework's native model computed it (train_export's taps.npz), against the float64 reference on the "
        "same weights and pair by pair, in the order the forward computes them. A mistake shows first at the "
        "tap where it enters. Init taps are judged (init_taps_vs_reference, and they name the first divergent "
        "tap of every failing forward, ONNX-vs-native and lockstep check); trained taps are figures.",
        [
            Group(m, _present(tables.taps(inputs, m)),
                  _figure(figures.taps_along(m, analysis.taps(inputs, m), tolerance),
                          f"{m} max abs error along the taps"))
            for m in inputs.models
        ],
    )


def _data_parallel(inputs: Inputs) -> Section:
    return Section(
        "data_parallel",
        "Data-parallel training",
        "train_dp@<framework>: the same training on data_parallel.workers workers of each framework's own "
        "distributed engine (torch.distributed with DDP, jax.distributed with a global mesh, TF's "
        "MultiWorkerMirroredStrategy), each worker taking its contiguous share of every batch. Throughput with "
        "one and with N workers: the measurements section (rows <framework>-dp).",
        [Group("", [tables.data_parallel(inputs)])],
    )


def _serving(inputs: Inputs) -> Section:
    return Section(
        "serving",
        "Serving",
        "The serve stage: each framework's native export behind its KServe model server (torch: model.pt2, tf: "
        "the SavedModel, jax: the jax.export artifact) and one model.onnx behind ONNX Runtime's, on 127.0.0.1; "
        "the validation batch through V1 REST, V2 REST and V2 gRPC. Startup and request latencies are "
        "measurements (measurements/stages/serve.json).",
        [Group("", [tables.serving(inputs), tables.serving_init(inputs), tables.serving_pairs(inputs)])],
    )


def _onnx(inputs: Inputs) -> Section:
    def group(m: str) -> Group:
        ops, rows = analysis.op_table(inputs, m)
        return Group(
            m,
            [tables.onnx_files(inputs, m), *_present(tables.recurrent_forms(inputs, m)),
             tables.op_types(inputs, m), tables.inference_mode(inputs, m)],
            _figure(figures.op_histogram(m, ops, rows, inputs.frameworks), f"{m} op type histogram"),
        )

    return Section(
        "onnx",
        "ONNX files",
        "What torch.onnx, tf2onnx and jax2onnx each emit for the same model: the files, the form a recurrent "
        "layer took (its own op, a loop, or unrolled), the op types, and whether every export (ONNX and "
        "native) runs in inference mode.",
        [group(m) for m in inputs.models],
    )


def _environment_section(inputs: Inputs, variant: str) -> Section:
    measured = measured_versions(inputs)
    return Section(
        "environment",
        "Environment",
        groups=[Group("", [tables.environments(environment_rows(inputs.root, variant, measured))])],
        kind="environment",
    )


def _checks(inputs: Inputs) -> Section:
    return Section(
        "checks",
        "All checks",
        "Every row of reports/validation.json, with what judged it: its tolerance, or for a figure of two runs "
        "that parted, the measured null (rank sum, p-value, Holm threshold).",
        [Group(m, [tables.checks(inputs, m)]) for m in inputs.models],
    )


def sections(inputs: Inputs, variant: str) -> list[Section]:
    """The report's sections below the first screen, in order."""
    return [
        _runs(inputs),
        _loss(inputs),
        _parity(inputs),
        _taps(inputs),
        _data_parallel(inputs),
        _serving(inputs),
        Section("deployment", deployment.TITLE, deployment.NOTE, [Group("", [deployment.facts_table()])]),
        _onnx(inputs),
        Section("measurements", MEASUREMENTS_TITLE, MEASUREMENTS_WHERE, kind="measurements"),
        Section(
            "sources",
            "Model definitions, side by side",
            "Read from each package's models.py when this report was built, so they cannot drift from the code.",
            kind="sources",
        ),
        _environment_section(inputs, variant),
        _checks(inputs),
    ]


def measurement_runs(inputs: Inputs) -> list[list[str]]:
    """[model, run] rows of the measurements table: each framework's run, then its data-parallel run if any."""
    dp = inputs.spec.data_parallel
    parallel = set(dp.models) if dp.workers > 1 else set()
    return [[m, run] for m in inputs.models for fw in inputs.frameworks
            for run in ([fw, f"{fw}-dp"] if m in parallel else [fw])]


def inline_script() -> tuple[str, str]:
    """The measurements script and its CSP hash ("sha256-..."): the page runs that inline script and no other."""
    code = (TEMPLATES / "measurements.js").read_text()
    digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode("ascii")
    return code, f"sha256-{digest}"


def context(inputs: Inputs, variant: str = "cpu") -> dict[str, Any]:
    judged = analysis.verdict(inputs)
    script, script_hash = inline_script()
    return {
        "title": "Rosetta: artifact comparison report",
        "verdict": judged,
        "overview": tables.overview(inputs),
        "failures": tables.failures(judged, {m for m in inputs.models if analysis.taps(inputs, m) is not None}),
        "frameworks": inputs.frameworks,
        "sections": sections(inputs, variant),
        "sources": {m: [extract(inputs.root, fw, m) for fw in inputs.frameworks] for m in inputs.models},
        "params": inputs.params_text,
        "optimizer": inputs.spec.train.optimizer,
        "measurements_js": MEASUREMENTS_JS,
        "measurements_runs": json.dumps(measurement_runs(inputs)),
        "measurements_script": script,
        "script_hash": script_hash,
    }


def render(ctx: dict[str, Any], kind: str) -> str:
    return _environment(kind).get_template(f"report.{kind}.j2").render(**ctx)
