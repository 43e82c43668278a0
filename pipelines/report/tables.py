"""Every table of the report, built once here from the collected inputs and rendered by both templates.

A table is data (columns, rows of cells with their text already formatted); each template only says how a table
looks in its format, so report.html and report.md cannot drift apart. Figures stay HTML-only (render.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipelines.checks import ledger
from pipelines.report import analysis
from pipelines.report.collect import Inputs
from pipelines.report.environment import EnvironmentRow

MISSING = "—"


def fmt(value: Any, kind: str = "g") -> str:
    """One number formatter for every table; a missing or non-finite value shows as a dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    if isinstance(value, str):
        return value
    formats = {
        "sci": lambda v: f"{v:.2e}",
        "pct": lambda v: f"{100 * v:.2f} %",
        "int": lambda v: f"{int(v):,}",
        "loss": lambda v: f"{v:.5f}",
        "kib": lambda v: f"{v / 1024:,.1f} KiB",
        "g": lambda v: f"{v:.4g}",
    }
    return formats[kind](value)


@dataclass(frozen=True)
class Column:
    label: str
    left: bool = False  # text columns align left, numbers right
    group: str = ""  # a heading over this and the next columns of the same group (Markdown: a prefix)


@dataclass(frozen=True)
class Cell:
    text: str
    lines: tuple[str, ...] = ()  # several values in one cell (I/O tensors, packages): HTML breaks, Markdown "; "
    sub: str = ""  # a second, quieter line (the tolerance a figure was judged against)
    mono: bool = False  # code: names of checks, files, ops
    header: bool = False  # a row label (the parity matrix's first column)
    failed: bool = False  # shown as a failure (red in HTML; the text carries the mark for Markdown)
    link: str = ""  # an anchor of report.html the cell links to ("#taps-cnn"): the figure that explains it


@dataclass
class Row:
    cells: list[Cell]
    failed: bool = False  # the whole row is a failed check


@dataclass
class Table:
    title: str
    columns: list[Column]
    rows: list[Row]
    note: str = ""  # under the table
    empty: str = "Nothing to show."  # said instead of a table without rows
    collapsed: bool = False  # long detail: HTML folds it (open where a row failed)
    id: str = ""  # an HTML id of its own (the first screen's matrix)

    @property
    def column_groups(self) -> list[tuple[str, int]]:
        """The headings over runs of columns of one group, with their spans (empty: no column has a group)."""
        if not any(c.group for c in self.columns):
            return []
        spans: list[tuple[str, int]] = []
        for c in self.columns:
            if spans and c.group and spans[-1][0] == c.group:
                spans[-1] = (c.group, spans[-1][1] + 1)
            else:
                spans.append((c.group, 1))
        return spans

    @property
    def any_failed(self) -> bool:
        return any(row.failed or any(c.failed for c in row.cells) for row in self.rows)


@dataclass
class Group:
    """One model's part of a section: its tables, and in HTML its figures (data URIs)."""

    name: str
    tables: list[Table]
    figures: list[tuple[str, str]] = field(default_factory=list)  # (data URI, alt text); HTML only


def cell(value: Any, kind: str = "g", **flags: Any) -> Cell:
    return Cell(fmt(value, kind), **flags)


def text(value: str, **flags: Any) -> Cell:
    return Cell(value, **flags)


def _columns(*labels: str, left: tuple[int, ...] = (0,)) -> list[Column]:
    return [Column(label, i in left) for i, label in enumerate(labels)]


def tap_link(model: str, check: str, tapped: set[str]) -> str:
    """The anchor of the per-layer taps figure a failed check links to ("" where the taps do not explain it)."""
    return analysis.tap_anchor(model) if check in ledger.TAP_LOCALIZED and model in tapped else ""


def failures(verdict: analysis.Verdict, tapped: set[str] | None = None) -> Table:
    """Every failed check; one the per-layer taps explain links to its model's taps figure (`tapped`: the models
    that have one)."""
    tapped = tapped or set()
    rows = [
        Row(
            [
                text(f.model),
                text(f.framework),
                text(f.check, mono=True, link=tap_link(f.model, f.check, tapped)),
                cell(f.value, "sci"),
                cell(f.tolerance),
                text(f.by),
            ],
            failed=True,
        )
        for f in verdict.failures
    ]
    columns = _columns("model", "framework(s)", "check", "value", "tolerance", "by how much", left=(0, 1, 2, 5))
    return Table("Failed checks", columns, rows)


def runs(inputs: Inputs, model: str) -> Table:
    rows = [
        Row(
            [
                text(r["framework"]),
                cell(r["parameters"], "int"),
                cell(r["test_accuracy"], "pct"),
                cell(r["test_loss"], "loss"),
                cell(r["final_train_loss"], "loss"),
                cell(r["epochs"], "int"),
                cell(r["steps"], "int"),
                text(r["native_formats"] or MISSING),
            ]
        )
        for r in analysis.run_rows(inputs, model)
    ]
    labels = ("framework", "parameters", "test accuracy", "test loss", "final train loss", "epochs", "steps")
    columns = _columns(*labels, "native formats", left=(0, 7))
    return Table("Size, quality and training", columns, rows)


def epoch_losses(inputs: Inputs, model: str) -> Table:
    logs = {fw: inputs.run(model, fw).train_log or {} for fw in inputs.frameworks}
    epochs = max((len(log.get("epoch_losses", [])) for log in logs.values()), default=0)

    def loss(fw: str, epoch: int) -> float | None:
        losses = logs[fw].get("epoch_losses") or []
        return losses[epoch] if epoch < len(losses) else None

    rows = [Row([text(str(e + 1)), *(cell(loss(fw, e), "loss") for fw in inputs.frameworks)]) for e in range(epochs)]
    columns = _columns("epoch", *inputs.frameworks, left=())
    return Table("Epoch losses (means)", columns, rows, empty="No train logs.", collapsed=True)


def forward_parity(matrix: analysis.ParityMatrix) -> Table:
    rows = []
    for i, values in enumerate(matrix.values):
        cells = [text(matrix.labels[i], header=True)]
        for j, value in enumerate(values):
            failed = matrix.passed[i][j] is False
            shown = MISSING if i == j else fmt(value, "sci")
            cells.append(text(shown + (" ✗" if failed else ""), failed=failed))
        rows.append(Row(cells))
    columns = _columns("max |diff|", *matrix.labels)
    note = f"tolerance {fmt(matrix.tolerance)}"
    return Table("Forward parity (init.onnx, ONNX Runtime)", columns, rows, note=note)


def training_parity(inputs: Inputs, model: str) -> Table:
    rows = []
    for fig in analysis.training_parity(inputs, model):
        cells = [text(fig["pair"])]
        for key, *_ in analysis.TRAINING_FIGURES:
            c = fig["cells"][key]
            # a step number is no measured difference: no exponent, and "never" for runs in lockstep to the end
            cells.append(text("never" if c.value is None else fmt(c.value, "int")) if key == "parting_step"
                         else _judged(c))
        rows.append(Row(cells))
    columns = _columns("pair", *(label for _, label, _, _ in analysis.TRAINING_FIGURES))
    return Table("Training parity", columns, rows, empty="No training-parity figures.")


def lockstep(inputs: Inputs, model: str) -> Table | None:
    """Each pair's whole state at the lockstep checkpoints (validation.json's "lockstep"): per checkpoint step the
    worst tensor of the weights, of BatchNorm's running statistics and the eval logits, against one bound."""
    records = [r for r in (inputs.validation or {}).get("lockstep", []) if r.get("model") == model]
    if not records:
        return None
    kinds = ("weights", "running_statistics", "logits")
    rows = []
    for record in records:
        tolerance = record["tolerance"]
        for point in record["checkpoints"]:
            cells = [text(record["frameworks"]), cell(point["step"], "int")]
            for kind in kinds:
                if kind not in point:
                    cells.append(text(MISSING))
                    continue
                value, failed = point[kind]["max_rel"], point[kind]["max_rel"] > tolerance
                cells.append(cell(value, "sci", sub=point[kind]["where"] + (" ✗" if failed else ""), failed=failed))
            rows.append(Row(cells))
    columns = _columns("pair", "after step", "weights, max rel", "running statistics, max rel", "logits, max rel",
                       left=(0,))
    note = (f"While the runs are in lockstep, every pair's whole state after these steps (train_export's "
            f"checkpoints.npz): the weights as one vector and the eval-mode logits of the validation batch by norm, "
            f"||a - b|| / ||a|| (the tensor with the largest share named); each running statistic by max |a - b| "
            f"over its largest magnitude. Bound {fmt(records[0]['tolerance'])} "
            "(params.yaml tolerances.lockstep_state_rel), every model.")
    return Table("Lockstep checkpoints", columns, rows, note=note)


def parting(inputs: Inputs, model: str) -> Table | None:
    """Where the model's trainings part, within each framework and across (analysis.parting_rows), for a model the
    measured null judges."""
    record = analysis.parting(inputs, model)
    if record is None:
        return None
    rows = [Row([text(r["framework"]), text(r["run"]), text(r["replicates"]),
                 text("never" if r["first_across"] is None else str(r["first_across"])),
                 text(f"{r['later']} of {r['pairs']}")]) for r in analysis.parting_rows(record)]
    columns = _columns("framework", "run vs its replicates", "replicates among themselves",
                       "earliest across frameworks", "within-framework pairs parting later", left=(0,))
    note = (f"The step (of {record['steps']}) at which two trainings' step losses first differ beyond "
            "tolerances.lockstep_loss_rel, as min / median / max (pairs). The null pools each framework's run with "
            "the replicates that parted from it; it is the null it names where they part as early as the "
            "frameworks' runs part from each other. A within-framework pair that parts later (or never) is a "
            "near-copy of the run where the frameworks already differ: it adds little spread.")
    return Table("Where the trainings part", columns, rows, note=note)


def data_parallel(inputs: Inputs) -> Table:
    figures = analysis.data_parallel(inputs)
    rows = [Row([text(fig["model"]), text(fig["pair"]), cell(fig["workers"], "int"),
                 *(_judged(fig["cells"][key]) for key, *_ in analysis.DATA_PARALLEL_FIGURES)]) for fig in figures]
    columns = _columns("model", "runs", "workers", *(label for _, label, _ in analysis.DATA_PARALLEL_FIGURES),
                       left=(0, 1))
    note = ("x-dp|x: a framework's data-parallel run against its own single-process run; x-dp|y-dp: two "
            "frameworks' data-parallel runs. Test figures from each run's trained weights with the float64 "
            "reference forward. Judged as two frameworks' runs are, with no weaker bound for any model: once a pair "
            "parts, its end-of-training figures against both sides' replicates.")
    return Table("Data-parallel runs against single-process runs and each other", columns, rows, note=note,
                 empty="Data-parallel training is off (params.yaml data_parallel.workers: 1; "
                       "-S data_parallel.workers=2 switches it on).")


def null_text(null: analysis.NullJudgement) -> str:
    """How the measured null judged a check, in one line: its statistic, its p-value, Holm's threshold."""
    return f"{null.text()}, p {null.p_value:.2g}, Holm {null.holm_threshold:.2g}"


def _judged(c: analysis.Cell) -> Cell:
    """A figure with what it was judged against and the verdict, as the training-parity table shows it: its
    tolerance, or where the runs parted and the measured null judged it, the null's statistic, p and threshold."""
    mark = " ✓" if c.passed is True else (" ✗" if c.passed is False else "")
    if c.null is not None:
        sub = f"{null_text(c.null)}{mark}"
    else:
        sub = f"tol {fmt(c.tolerance)}{mark}" if c.tolerance is not None else ""
    return cell(c.value, "sci", sub=sub, failed=c.passed is False)


def running_statistics(inputs: Inputs, model: str) -> Table | None:
    """BatchNorm running statistics after training, pairwise (None for a model without BatchNorm)."""
    figures = analysis.running_statistics(inputs, model)
    if not figures:
        return None
    rows = []
    for fig in figures:
        worst = {s: max(fig["layers"], key=lambda layer, s=s: fig["layers"][layer].get(s, -1.0), default="")
                 for s in analysis.STATISTICS}
        rows.append(Row([text(fig["pair"]), *(_judged(fig["cells"][s]) for s in analysis.STATISTICS),
                         text(", ".join(f"{s}: {worst[s]}" for s in analysis.STATISTICS if worst[s]), mono=True)]))
    columns = _columns("pair", "running mean, max rel", "running variance, max rel", "worst layer", left=(0, 3))
    note = ("From each framework's trained canonical weights (trained.safetensors): per BatchNorm layer, max |a - b| "
            "of the statistic over its largest magnitude; the worst layer is judged.")
    return Table("BatchNorm running statistics after training", columns, rows, note=note)


def recurrent_forms(inputs: Inputs, model: str) -> Table | None:
    """Which form the recurrent layer took in each ONNX file (None for a model without one)."""
    forms = analysis.recurrent_forms(inputs, model)
    if not forms:
        return None
    rows = [Row([text(f.framework), text(f.file, mono=True), text(f.form), text(f.evidence, mono=True)])
            for f in forms]
    columns = _columns("framework", "file", "recurrent layer", "from the op histogram", left=(0, 1, 2, 3))
    whole = ", ".join(sorted(analysis.RECURRENT_OPS.values()))
    note = (f"A recurrent layer leaves an exporter as its own op ({whole}), as a loop (Loop or Scan, one step per "
            "iteration) or unrolled (one copy of the step per image row).")
    return Table("Recurrent layer in ONNX", columns, rows, note=note)


def inference_mode(inputs: Inputs, model: str) -> Table:
    rows = [
        Row(
            [
                text(r["framework"]),
                text(r["check"].removeprefix(analysis.INFERENCE_PREFIX), mono=True),
                cell(r.get("value"), "sci"),
                cell(r.get("tolerance")),
                text("yes" if r.get("passed") else "NO", failed=not r.get("passed")),
                text(r.get("detail", "")),
            ],
            failed=not r.get("passed"),
        )
        for r in analysis.inference_mode(inputs, model)
    ]
    columns = _columns("framework", "export", "largest change", "tolerance", "passed", "detail", left=(0, 1, 4, 5))
    note = ("Each export run twice on the validation batch and its first images alone (ONNX files under ONNX "
            "Runtime; native formats from the logits their reload recorded): an export in inference mode gives an "
            "image the same logits every time (no dropout, no batch statistics).")
    return Table("Inference mode of every export", columns, rows, note=note, empty="No inference-mode checks.")


def onnx_files(inputs: Inputs, model: str) -> Table:
    rows = []
    for fw in inputs.frameworks:
        for name in ("model.onnx", "init.onnx"):
            s = inputs.run(model, fw).onnx.get(name)
            head = [text(fw), text(name, mono=True)]
            if s is None:
                rows.append(Row([*head, text("missing"), *(text("") for _ in range(8))]))
                continue
            rows.append(
                Row(
                    [
                        *head,
                        cell(s.bytes, "kib"),
                        cell(s.opset, "int"),
                        text(str(s.ir_version)),
                        text(s.producer),
                        cell(s.nodes, "int"),
                        cell(s.initializers, "int"),
                        cell(s.initializer_values, "int"),
                        Cell("", lines=tuple(str(t) for t in s.inputs), mono=True),
                        Cell("", lines=tuple(str(t) for t in s.outputs), mono=True),
                    ]
                )
            )
    labels = ("framework", "file", "size", "opset", "IR", "producer", "nodes", "initializers", "weights")
    columns = _columns(*labels, "inputs", "outputs", left=(0, 1, 5, 9, 10))
    note = "Nodes count every node, subgraphs and local functions included; weights are the initializers' elements."
    return Table("ONNX files", columns, rows, note=note)


def op_types(inputs: Inputs, model: str) -> Table:
    _, op_rows = analysis.op_table(inputs, model)
    rows = [Row([text(r["op"], mono=True), *(cell(r[fw], "int") for fw in inputs.frameworks)]) for r in op_rows]
    return Table("Op types (model.onnx)", _columns("op type", *inputs.frameworks), rows, empty="No ONNX files.")


def environments(rows: list[EnvironmentRow]) -> Table:
    def pins(packages: dict[str, str]) -> Cell:
        return Cell("" if packages else MISSING, lines=tuple(f"{n}=={v}" for n, v in packages.items()), mono=True)

    table_rows = [
        Row(
            [
                text(e.name),
                text(e.python or MISSING),
                pins(e.packages),
                pins(e.measured),
                text(e.lock, mono=True),
                text(e.lock_sha256 or "missing", mono=True, sub=e.note),
            ]
        )
        for e in rows
    ]
    labels = ("environment", "Python", "key packages (as locked)", "as installed (export.json records)", "lock")
    return Table("Environments", _columns(*labels, "lock sha256", left=tuple(range(6))), table_rows)


def _judged_by(row: dict[str, Any], null: analysis.NullJudgement | None) -> Cell:
    """The checks table's "judged by" cell: the tolerance, or the measured null's statistic, p-value and Holm
    threshold (the float32 bound the figure exceeded is then no verdict, only a quieter second line)."""
    if null is None:
        return cell(row.get("tolerance"))
    return Cell(f"p {null.p_value:.3g} vs Holm {null.holm_threshold:.3g}",
                sub=f"{null.text()} ({null.samples}); "
                    f"alpha {null.alpha:g}, Holm over {null.holm_family}; float32 bound "
                    f"{fmt(row.get('tolerance'))} no longer applies")


def checks(inputs: Inputs, model: str) -> Table:
    found = analysis.check_rows(inputs, model)
    tapped = {model} if analysis.taps(inputs, model) is not None else set()
    nulls = analysis.null_judgements(inputs)
    rows = [
        Row(
            [
                text(r["framework"]),
                text(r["check"], mono=True,
                     link="" if r.get("passed") else tap_link(model, r["check"], tapped)),
                cell(r.get("value"), "sci"),
                _judged_by(r, nulls.get((model, r["framework"], r["check"]))),
                text("yes" if r.get("passed") else "NO", failed=not r.get("passed")),
                text(r.get("detail", "")),
            ],
            failed=not r.get("passed"),
        )
        for r in found
    ]
    failed = sum(not r.get("passed") for r in found)
    columns = _columns("framework(s)", "check", "value", "judged by", "passed", "detail", left=(0, 1, 4, 5))
    return Table(f"{model}: {len(found)} checks, {failed} failed", columns, rows, empty="No checks.", collapsed=True)


def taps(inputs: Inputs, model: str) -> Table | None:
    """Per comparison (each framework against the float64 reference, each pair), the first tap over the forward
    tolerance and the worst tap, for the init and the trained weights (None: no taps recorded for the model)."""
    record = analysis.taps(inputs, model)
    if record is None:
        return None
    rows = []
    for side, label in (("vs_reference", "{} vs reference"), ("pairs", "{}")):
        for who in record["init"][side]:
            cells = [text(label.format(who))]
            for kind in ("init", "trained"):
                found = record.get(kind, {}).get(side, {}).get(who)
                if found is None:
                    cells += [text(MISSING), text(MISSING)]
                    continue
                worst = max(found["taps"], key=lambda t: math.inf if t["max_abs"] is None else t["max_abs"])
                cells += [text(found["first_divergent"] or "none", mono=bool(found["first_divergent"]),
                               failed=kind == "init" and found["first_divergent"] is not None),
                          Cell(fmt(worst["max_abs"], "sci"), sub=worst["tap"])]
            rows.append(Row(cells))
    tolerance = inputs.spec.tolerances.forward_parity_abs
    columns = _columns("comparison", "init: first tap over tolerance", "init: worst max abs",
                       "trained: first tap over tolerance", "trained: worst max abs", left=(0, 1, 3))
    return Table(f"{model}: where the forwards part", columns, rows,
                 note=f"Tolerance {tolerance:.0e} (tolerances.forward_parity_abs) for every tap. Trained taps are "
                      "figures only: each framework against the reference on its own trained weights, and pairwise "
                      "(trained runs part once they leave lockstep).")


def serving(inputs: Inputs) -> Table:
    """What the model servers answered (the serve stage), against the same export run in process."""
    rows = [Row([text(label), *(_judged(c) if c else text(MISSING) for c in (cells.get(m) for m in inputs.models))])
            for label, cells in analysis.serving(inputs)]
    columns = _columns("", *inputs.models)
    note = ("The worst of V1 REST, V2 REST and V2 gRPC: the max abs difference of each server's answer to the "
            "validation batch from the same export run in process (torch, tf, jax: native_outputs.npz's record of "
            "the export the server runs; onnx: the validate stage's own ONNX Runtime session), required bit for "
            "bit; the ONNX server against its framework's server within onnx_vs_native's bound plus "
            "native_roundtrip's; every server's V2 model metadata, over REST and gRPC, identical.")
    off = analysis.serving_off(inputs)
    return Table("Served logits", columns, rows, note=note,
                 empty=f"Not served: {off}." if off else "No serving figures (reports/validation.json has no "
                 "'serving' section).")


def serving_init(inputs: Inputs) -> Table:
    """Every server's <model>-init: one model, the same canonical init weights, so the same answer everywhere."""
    def shown(label: str, c: analysis.Cell) -> Cell:
        if label.startswith("argmax"):  # counts of rows: whole numbers, the check's verdict beside them
            judged = _judged(c) if c.tolerance is not None else None
            return cell(c.value, "int", **({"sub": judged.sub, "failed": judged.failed} if judged else {}))
        return _judged(c)

    rows = [Row([text(label), *(shown(label, c) if c else text(MISSING)
                                for c in (cells.get(m) for m in inputs.models))])
            for label, cells in analysis.serving_init(inputs)]
    tolerance = inputs.spec.tolerances.forward_parity_abs
    note = (f"<model>-init on every server: each framework's own model built from the shared canonical init weights "
            f"(artifacts/init; the ONNX server: init.onnx), the worst of V1 REST, V2 REST and V2 gRPC. Against the "
            f"same model in process bit for bit; against the float64 reference forward and pairwise within "
            f"{tolerance:.0e} (tolerances.forward_parity_abs, as the init.onnx files are held); the same class as "
            f"the reference on every row whose reference top-two margin exceeds {2 * tolerance:.0e}, the rows "
            "within it (near-ties a difference within tolerance may flip) excluded and counted.")
    return Table("Served init logits across servers", _columns("", *inputs.models), rows, note=note,
                 empty="No served init figures.")


def serving_pairs(inputs: Inputs) -> Table:
    def figure(found: dict[str, Any] | None) -> Cell:
        if not found:
            return text(MISSING)
        return cell(found.get("max_abs"), "sci", sub=f"{fmt(found.get('argmax_differ'), 'int')} classified differently")

    rows = [Row([text(pair), *(figure(models.get(m)) for m in inputs.models)])
            for pair, models in analysis.serving_pairs(inputs)]
    note = ("Figures, not checks: max abs difference of two framework servers' answers, and the images they "
            "classify differently. Each framework serves its own trained model, and trained models differ by more "
            "than the forward tolerance (training parity judges that); what the servers add is bounded at 0 above.")
    return Table("Served logits across frameworks", _columns("servers", *inputs.models), rows, note=note,
                 empty="No serving figures.")


def _margin(margin: analysis.Margin | None, link: str) -> Cell:
    if margin is None:
        return text(MISSING)
    where = f"{margin.check} {margin.subject}"
    if margin.null is not None:
        return Cell(f"p {margin.null.p_value:.2g}, Holm {margin.null.holm_threshold:.2g}", sub=where, link=link)
    return Cell(f"{100 * margin.used:.0f} % of its tolerance", sub=where, link=link)


def _parting(model: str, recorded: bool, step: int | None) -> Cell:
    if not recorded:
        return text(MISSING)
    return Cell(f"step {step:,}" if step is not None else "never", link=f"#parity-{model}")


def overview(inputs: Inputs) -> Table:
    """The report's first table: models by frameworks. Each run's test accuracy, the step where each pair's runs
    part, the model's verdict and its passed check closest to its bound, each linking down to its section."""
    found = analysis.overview(inputs)
    rows = []
    for o in found:
        verdict = (text(f"✓ all {o.checks} passed", link=f"#checks-{o.model}") if not o.failed else
                   text(f"✗ {o.failed} of {o.checks} failed", link=f"#checks-{o.model}", failed=True))
        rows.append(Row([text(o.model, header=True, link=f"#runs-{o.model}"),
                         *(cell(o.accuracy[fw], "pct") for fw in inputs.frameworks),
                         *(_parting(o.model, *o.parting[p]) for p in o.parting),
                         verdict, _margin(o.margin, f"#checks-{o.model}")]))
    pairs = list(found[0].parting) if found else []
    columns = [Column("model", True),
               *(Column(fw, group="test accuracy") for fw in inputs.frameworks),
               *(Column(p, group="runs part at") for p in pairs),
               Column("checks", True, "verdict"), Column("closest to failing", True, "verdict")]
    note = ("Runs part where their step losses first differ beyond tolerances.lockstep_loss_rel (never: in "
            "lockstep to the end); after it, end-of-training figures are judged against the measured null. "
            "Closest to failing: the passed check that uses most of its tolerance, or for a null-judged check its "
            "p-value against its Holm threshold.")
    return Table("Do the frameworks agree?", columns, rows, note=note, empty="No models.", id="overview")
