"""Tables and judgements derived from the collected inputs, independent of how they are rendered."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from pipelines.checks import ledger
from pipelines.report.collect import Inputs

REFERENCE = "reference"  # the float64 numpy forward of rosetta_common.reference


@dataclass
class Failure:
    model: str
    framework: str
    check: str
    value: float | None
    tolerance: float | None
    by: str  # how far from passing, in words
    detail: str = ""


@dataclass
class Verdict:
    status: str  # "passed" | "failed" | "not validated"
    checks: int
    failures: list[Failure] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def headline(self) -> str:
        if self.status == "passed":
            return f"PASSED: all {self.checks} checks passed."
        if self.status == "failed":
            return f"FAILED: {len(self.failures)} of {self.checks} checks failed."
        return "NOT VALIDATED: reports/validation.json is missing or unreadable."


def shortfall(value: float | None, tolerance: float | None, detail: str = "") -> str:
    """How far a failed check is from passing: a ratio for an error bound, points for a minimum."""
    if value is None or tolerance is None:
        return detail or "no value: the check could not be computed"
    if value < tolerance:  # a minimum (min_test_accuracy): the value had to reach the tolerance
        return f"{value:.4g} < required {tolerance:.4g} (short by {tolerance - value:.3g})"
    if tolerance == 0:
        return f"{value:.3g} where exactly 0 is required"
    return f"{value:.3g} > tolerance {tolerance:.3g} ({value / tolerance:.3g}x the tolerance)"


def verdict(inputs: Inputs) -> Verdict:
    report = inputs.validation
    if not report or "checks" not in report:
        return Verdict("not validated", 0, problems=inputs.problems)
    rows = report["checks"]
    failures = [
        Failure(
            r["model"],
            r["framework"],
            r["check"],
            r.get("value"),
            r.get("tolerance"),
            shortfall(r.get("value"), r.get("tolerance"), r.get("detail", "")),
            r.get("detail", ""),
        )
        for r in rows
        if not r.get("passed")
    ]
    # A report whose own flag disagrees with its rows is treated as failed: never claim more than the rows say.
    status = "passed" if report.get("passed") and not failures else "failed"
    return Verdict(status, len(rows), failures, inputs.problems)


def check_rows(inputs: Inputs, model: str) -> list[dict[str, Any]]:
    return [r for r in (inputs.validation or {}).get("checks", []) if r.get("model") == model]


def taps(inputs: Inputs, model: str) -> dict[str, Any] | None:
    """The model's per-layer taps figures from reports/validation.json's "taps" (pipelines/checks/taps.py
    taps_record), or None where the validate stage recorded none."""
    for record in (inputs.validation or {}).get("taps", []):
        if isinstance(record, dict) and record.get("model") == model:
            return record
    return None


def tap_anchor(model: str) -> str:
    """The report's anchor of a model's per-layer taps figure (its heading in the "taps" section)."""
    return f"#taps-{model}"


@dataclass
class ParityMatrix:
    labels: list[str]
    values: list[list[float]]  # NaN where there is no figure (diagonal, or a check that did not run)
    passed: list[list[bool | None]]
    tolerance: float


def forward_parity(inputs: Inputs, model: str) -> ParityMatrix:
    """Pairwise max abs differences of the init.onnx forwards (shared weights) plus each vs the reference."""
    labels = [REFERENCE, *inputs.frameworks]
    index = {name: i for i, name in enumerate(labels)}
    n = len(labels)
    values = [[math.nan] * n for _ in range(n)]
    passed: list[list[bool | None]] = [[None] * n for _ in range(n)]
    tolerance = inputs.spec.tolerances.forward_parity_abs
    for row in check_rows(inputs, model):
        if row["check"] == ledger.FORWARD_PARITY_INIT_ONNX:
            pair = row["framework"].split("|")
        elif row["check"] == ledger.INIT_ONNX_VS_REFERENCE:
            pair = [REFERENCE, row["framework"]]
        else:
            continue
        if len(pair) != 2 or not all(p in index for p in pair):
            continue
        i, j = index[pair[0]], index[pair[1]]
        value = row.get("value")
        for a, b in ((i, j), (j, i)):
            values[a][b] = math.nan if value is None else float(value)
            passed[a][b] = bool(row.get("passed"))
        if row.get("tolerance") is not None:
            tolerance = float(row["tolerance"])  # the one it was judged against
    return ParityMatrix(labels, values, passed, tolerance)


# training_parity figure -> (label, check it was judged by, tolerance field in params.yaml); None: a figure only.
# The checks' own definitions (pipelines/checks/ledger.py FIGURES), never restated here.
TRAINING_FIGURES: list[tuple[str, str, str | None, str | None]] = [
    (f.key, f.label, f.check, f.tolerance) for f in ledger.FIGURES]


def trained_tolerances(inputs: Inputs, model: str) -> Any:
    """The tolerances a model's trained runs are judged by: params.yaml's, the same for every model."""
    del model
    return inputs.spec.tolerances


@dataclass
class Cell:
    value: float | None
    tolerance: float | None = None
    passed: bool | None = None
    null: NullJudgement | None = None  # judged by the measured null, not by `tolerance`


def training_parity(inputs: Inputs, model: str) -> list[dict[str, Any]]:
    """One row per pair of frameworks: each figure with the tolerance and verdict of the check that used it."""
    rows_by_key = {(r["framework"], r["check"]): r for r in check_rows(inputs, model)}
    nulls = null_judgements(inputs)
    table = []
    for fig in (inputs.validation or {}).get("training_parity", []):
        if fig.get("model") != model:
            continue
        cells = {}
        for key, _, check, tol_field in TRAINING_FIGURES:
            row = rows_by_key.get((fig["frameworks"], check)) if check else None
            tolerance = row.get("tolerance") if row else None
            if tolerance is None and tol_field:
                tolerance = getattr(trained_tolerances(inputs, model), tol_field)
            cells[key] = Cell(fig.get(key), tolerance, bool(row["passed"]) if row else None,
                              nulls.get((model, fig["frameworks"], check)))
        table.append({"pair": fig["frameworks"], "optimizer": fig.get("optimizer", ""), "cells": cells})
    return table


QUALITY = ("test_accuracy", "test_loss")


def quality(inputs: Inputs, model: str, framework: str) -> dict[str, Any]:
    """Test accuracy and loss of one run: the validate stage's own figures (recomputed from the hashed artifacts)
    where reports/validation.json records them per run, else the train_export stage's metrics.json."""
    for row in (inputs.validation or {}).get("runs", []):
        if row.get("model") == model and row.get("framework") == framework and all(k in row for k in QUALITY):
            return {key: row[key] for key in QUALITY}
    metrics = inputs.run(model, framework).metrics or {}
    return {key: metrics.get(key) for key in QUALITY}


def run_rows(inputs: Inputs, model: str) -> list[dict[str, Any]]:
    """Per framework: size, quality and training of one model (no timings: they are measurements, not lineage)."""
    rows = []
    for fw in inputs.frameworks:
        run = inputs.run(model, fw)
        m, log, e = run.metrics or {}, run.train_log or {}, run.export or {}
        rows.append(
            {
                "framework": fw,
                "parameters": m.get("parameters"),
                **quality(inputs, model, fw),
                "final_train_loss": m.get("final_train_loss"),
                "epochs": m.get("epochs", log.get("epochs")),
                "steps": len(log["step_losses"]) if isinstance(log.get("step_losses"), list) else None,
                "native_formats": ", ".join(sorted(e.get("native_roundtrip_max_abs", {}))),
            }
        )
    return rows


def op_table(inputs: Inputs, model: str, file: str = "model.onnx") -> tuple[list[str], list[dict[str, Any]]]:
    """Op types (most used first) x frameworks: what each converter emits for the same model."""
    counts = {fw: inputs.run(model, fw).onnx.get(file) for fw in inputs.frameworks}
    total: dict[str, int] = {}
    for summary in counts.values():
        for op, n in (summary.ops if summary else {}).items():
            total[op] = total.get(op, 0) + n
    ops = sorted(total, key=lambda op: (-total[op], op))
    rows = [{"op": op, **{fw: (s.ops.get(op, 0) if s else None) for fw, s in counts.items()}} for op in ops]
    return ops, rows


# The ONNX op a recurrent model's layer maps to when an exporter keeps it whole. An exporter may instead emit a
# loop (Loop or Scan, one step per iteration) or unroll it (one copy of the step per image row).
RECURRENT_OPS = {"lstm": "LSTM", "gru": "GRU"}
LOOP_OPS = ("Loop", "Scan")
STEP_OPS = ("MatMul", "Gemm", "Sigmoid", "Tanh")  # what an unrolled step is made of


@dataclass
class RecurrentForm:
    framework: str
    file: str  # "model.onnx" / "init.onnx"
    form: str  # "LSTM op", "Loop", "Scan", "unrolled", or "missing"
    evidence: str  # the op counts the form was read from


def recurrent_form(ops: Any, op: str) -> tuple[str, str]:
    """How an ONNX file (its op histogram, subgraphs included) holds a recurrent layer whose whole op is `op`."""
    if ops.get(op):
        return f"{op} op", f"{op} x{ops[op]}"
    loops = [name for name in LOOP_OPS if ops.get(name)]
    if loops:
        return " + ".join(loops), ", ".join(f"{name} x{ops[name]}" for name in loops)
    steps = ", ".join(f"{name} x{ops[name]}" for name in STEP_OPS if ops.get(name))
    return "unrolled", f"no {op}, Loop or Scan; {steps or 'no step ops'}"


def recurrent_forms(inputs: Inputs, model: str) -> list[RecurrentForm]:
    """Per framework and ONNX file, the form its recurrent layer took; empty for a model without one."""
    op = RECURRENT_OPS.get(model)
    if op is None:
        return []
    rows = []
    for fw in inputs.frameworks:
        for file in ("model.onnx", "init.onnx"):
            summary = inputs.run(model, fw).onnx.get(file)
            if summary is None:
                rows.append(RecurrentForm(fw, file, "missing", ""))
            else:
                rows.append(RecurrentForm(fw, file, *recurrent_form(summary.ops, op)))
    return rows


STATISTICS = ledger.RUNNING_STATISTICS


def running_statistics(inputs: Inputs, model: str) -> list[dict[str, Any]]:
    """Per pair of frameworks: each BatchNorm running statistic's worst relative difference after training, with
    the check that judged it, and every layer's figures (validation.json's `running_statistics`)."""
    rows_by_key = {(r["framework"], r["check"]): r for r in check_rows(inputs, model)}
    nulls = null_judgements(inputs)
    table = []
    for fig in (inputs.validation or {}).get("running_statistics", []):
        if fig.get("model") != model:
            continue
        cells = {}
        for statistic in STATISTICS:
            check = ledger.statistic_check(statistic)
            row = rows_by_key.get((fig["frameworks"], check))
            tolerance = row.get("tolerance") if row else trained_tolerances(inputs, model).running_stats_rel
            cells[statistic] = Cell(fig.get(f"{statistic}_max_rel"), tolerance,
                                    bool(row["passed"]) if row else None,
                                    nulls.get((model, fig["frameworks"], check)))
        table.append({"pair": fig["frameworks"], "cells": cells, "layers": fig.get("layers") or {}})
    return table


INFERENCE_PREFIX = ledger.INFERENCE_MODE_PREFIX


def inference_mode(inputs: Inputs, model: str) -> list[dict[str, Any]]:
    """Every export's inference-mode row (ONNX files and native formats), framework by framework."""
    return [r for r in check_rows(inputs, model) if str(r.get("check", "")).startswith(INFERENCE_PREFIX)]


# Data-parallel figures (pipelines/checks/data_parallel.py): key, label, the check that judged it. An
# end-of-training figure with no data-parallel check (prediction disagreement) is a framework pairs' figure only.
DATA_PARALLEL_FIGURES: list[tuple[str, str, str | None]] = [
    (f.key, f.label, f.dp_check) for f in ledger.FIGURES if f.dp_check is not None or not f.end_of_training]


def data_parallel(inputs: Inputs) -> list[dict[str, Any]]:
    """One row per compared pair of runs ("torch-dp|torch": N workers vs one process; "torch-dp|tf-dp"), each
    figure with the tolerance and verdict of its check."""
    nulls = null_judgements(inputs)
    table = []
    for fig in (inputs.validation or {}).get("data_parallel", []):
        if "|" not in str(fig.get("runs", "")):
            continue  # a run's own test figures
        rows = {r["check"]: r for r in check_rows(inputs, fig["model"]) if r.get("framework") == fig["runs"]}
        cells = {}
        for key, _, check in DATA_PARALLEL_FIGURES:
            row = rows.get(check) if check else None
            cells[key] = Cell(fig.get(key), row.get("tolerance") if row else None,
                              bool(row["passed"]) if row else None, nulls.get((fig["model"], fig["runs"], check)))
        table.append({"model": fig["model"], "pair": fig["runs"], "workers": fig.get("workers"), "cells": cells})
    return table


SERVED_PROTOCOLS = ("v1", "v2", "grpc")  # pipelines.paths.SERVED_PROTOCOLS


def _worst(rows: list[dict[str, Any]]) -> Cell | None:
    """The worst of several judged rows (protocols) as one cell: the largest value, passed if every one did."""
    if not rows:
        return None
    worst = max(rows, key=lambda r: math.inf if r.get("value") is None else r["value"])
    return Cell(worst.get("value"), worst.get("tolerance"), all(r.get("passed") for r in rows))


def serving(inputs: Inputs) -> list[tuple[str, dict[str, Cell | None]]]:
    """The serving checks as rows of model -> cell (reports/validation.json, pipelines/checks/serving.py), the
    worst protocol of each: every server against the same export in process, the ONNX server against its
    framework's server, the metadata of every server, the served folder."""
    records = [r for r in (inputs.validation or {}).get("serving", []) if isinstance(r, dict) and not r.get("off")]
    if not records:
        return []  # none, or the serve stage served nothing (serving_off says why)
    by_model = {m: {(r["framework"], r["check"]): r for r in check_rows(inputs, m)} for m in inputs.models}

    def judged(subject: str, check: str, protocols: bool = True) -> dict[str, Cell | None]:
        names = [ledger.served(check, p) for p in SERVED_PROTOCOLS] if protocols else [check]
        return {m: _worst([rows[(subject, n)] for n in names if (subject, n) in rows]) for m, rows in by_model.items()}

    source = next((r.get("onnx_from") for r in records if r.get("onnx_from")), None)
    table = [(f"{fw} server vs in process", judged(fw, ledger.SERVED_NATIVE_VS_IN_PROCESS))
             for fw in inputs.frameworks]
    if source:
        table += [("onnx server vs in process", judged(source, ledger.SERVED_ONNX_VS_IN_PROCESS)),
                  (f"onnx server vs {source} server", judged(source, ledger.SERVED_ONNX_VS_NATIVE))]
    table += [("metadata: servers that differ", judged("servers", ledger.SERVED_METADATA_IDENTICAL, False)),
              ("served folder: problems", judged("servers", ledger.SERVED_READABLE, False))]
    return table


def serving_init(inputs: Inputs) -> list[tuple[str, dict[str, Cell | None]]]:
    """Every server's <model>-init (the shared canonical init weights) as rows of model -> cell: each server against
    the same model in process and against the float64 reference (the worst protocol), every pair of servers, and
    the argmax check with the rows it excluded (a figure)."""
    records = [r for r in (inputs.validation or {}).get("serving", []) if isinstance(r, dict) and r.get("init")]
    if not records:
        return []
    by_model = {m: {(r["framework"], r["check"]): r for r in check_rows(inputs, m)} for m in inputs.models}

    def judged(subject: str, check: str, protocols: bool = True) -> dict[str, Cell | None]:
        names = [ledger.served(check, p) for p in SERVED_PROTOCOLS] if protocols else [check]
        return {m: _worst([rows[(subject, n)] for n in names if (subject, n) in rows]) for m, rows in by_model.items()}

    servers = list(dict.fromkeys(s for r in records for s in r["init"].get("vs_reference", {})))
    pairs = list(dict.fromkeys(p for r in records for p in r["init"].get("across_servers", {})))
    source = next((r.get("onnx_from") for r in records if r.get("onnx_from")), None)
    table = []
    for server in servers:
        onnx = server == "onnx"
        subject = source if onnx else server
        table += [(f"{server} server vs in process", judged(
                      subject, ledger.SERVED_ONNX_INIT_VS_IN_PROCESS if onnx else ledger.SERVED_INIT_VS_IN_PROCESS)),
                  (f"{server} server vs float64 reference", judged(
                      subject, ledger.SERVED_ONNX_INIT_VS_REFERENCE if onnx else ledger.SERVED_INIT_VS_REFERENCE))]
    table += [(f"{pair.replace('|', ' | ')} servers", judged(pair, ledger.SERVED_INIT_ACROSS_SERVERS, False))
              for pair in pairs]
    table.append(("argmax: rows classified otherwise", judged("servers", ledger.SERVED_INIT_ARGMAX_ACROSS_SERVERS,
                                                              False)))
    excluded = {r.get("model"): r["init"].get("argmax", {}).get("rows_excluded") for r in records}
    table.append(("argmax: rows excluded (near-ties)", {m: None if excluded.get(m) is None else Cell(excluded[m])
                                                       for m in inputs.models}))
    return table


def serving_off(inputs: Inputs) -> str | None:
    """Why the serve stage served nothing (its off.json, as validate recorded it), or None."""
    for record in (inputs.validation or {}).get("serving", []):
        if isinstance(record, dict) and record.get("off"):
            return str(record["off"])
    return None


def serving_pairs(inputs: Inputs) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """The framework servers' answers pairwise, as rows of model -> figures: figures only
    (pipelines/checks/serving.py says why)."""
    pairs: dict[str, dict[str, dict[str, Any]]] = {}
    for record in (inputs.validation or {}).get("serving", []):
        if isinstance(record, dict):
            for pair, figures in record.get("across_frameworks", {}).items():
                pairs.setdefault(pair, {})[record.get("model")] = figures
    return list(pairs.items())


@dataclass(frozen=True)
class NullJudgement:
    """How the measured null judged one check (validation.json's row "null", Ledger.judge_nulls): its pooled
    permutation test's pseudo-F, the groups it weighed, its p-value and the p-value Holm's step-down held it to."""

    statistic: float | None  # the pseudo-F; None: no spread within any group
    samples: str  # each group's size, in words
    p_value: float
    holm_threshold: float  # alpha / (family - its place among the family's p-values, smallest first)
    holm_family: int
    alpha: float

    def text(self) -> str:
        """The statistic in a few words: "pseudo-F 3.1"."""
        return f"pseudo-F {self.statistic:.3g}" if self.statistic is not None else "pseudo-F (no spread within)"


def null_judgements(inputs: Inputs) -> dict[tuple[str, str, str], NullJudgement]:
    """Every null-judged check of the run, by (model, subject, check), as its row records it."""
    alpha = inputs.spec.tolerances.null_alpha
    judged = {}
    for row in (inputs.validation or {}).get("checks", []):
        null = row.get("null")
        if not isinstance(null, dict):
            continue
        samples = "runs and replicates: " + ", ".join(f"{name} {n}" for name, n in null.get("groups", {}).items())
        if null.get("look") == "interim":
            samples += " (the interim look's)"
        judged[(row["model"], row["framework"], row["check"])] = NullJudgement(
            null.get("statistic"), samples, float(null["p_value"]), float(null.get("threshold", alpha)),
            int(null.get("holm_family", 1)), alpha)
    return judged


@dataclass
class Margin:
    """The passed check of a model nearest to failing: `used` is how much of its room it takes (value over its
    bound; for a null-judged check, its Holm threshold over its p-value)."""

    check: str
    subject: str
    used: float
    null: NullJudgement | None = None


def closest_margin(inputs: Inputs, model: str, nulls: dict[tuple[str, str, str], NullJudgement]) -> Margin | None:
    """Of a model's passed checks with an upper bound above 0 or a null, the one that uses most of its room."""
    best: Margin | None = None
    for row in check_rows(inputs, model):
        value, tolerance = row.get("value"), row.get("tolerance")
        null = nulls.get((model, row["framework"], row["check"]))
        if not row.get("passed"):
            continue
        if null is not None:
            used = null.holm_threshold / null.p_value if null.p_value > 0 else math.inf
        elif value is not None and tolerance and value <= tolerance:
            used = value / tolerance
        else:
            continue  # exactly 0 required, or a minimum (min_test_accuracy)
        if best is None or used > best.used:
            best = Margin(row["check"], row["framework"], used, null)
    return best


@dataclass
class Overview:
    """One model's row of the report's first screen."""

    model: str
    accuracy: dict[str, float | None]  # framework -> test accuracy
    parting: dict[str, tuple[bool, int | None]]  # pair -> (figures recorded, the step where its runs part)
    checks: int
    failed: int
    margin: Margin | None


def overview(inputs: Inputs) -> list[Overview]:
    """Models by frameworks: each run's test accuracy, each pair's parting step, the model's checks and the passed
    check closest to its bound."""
    nulls = null_judgements(inputs)
    pairs = [f"{a}|{b}" for i, a in enumerate(inputs.frameworks) for b in inputs.frameworks[i + 1:]]
    table = []
    for model in inputs.models:
        figures = {f.get("frameworks"): f for f in (inputs.validation or {}).get("training_parity", [])
                   if f.get("model") == model}
        rows = check_rows(inputs, model)
        table.append(Overview(
            model,
            {fw: quality(inputs, model, fw)["test_accuracy"] for fw in inputs.frameworks},
            {p: (p in figures, figures.get(p, {}).get("parting_step")) for p in pairs},
            len(rows), sum(not r.get("passed") for r in rows), closest_margin(inputs, model, nulls)))
    return table


def parting(inputs: Inputs, model: str) -> dict[str, Any] | None:
    """The model's parting steps (validation.json's "parting", pipelines.checks.replicates.parting_record), or None
    for a model without end-of-training replicates."""
    for record in (inputs.validation or {}).get("parting", []):
        if isinstance(record, dict) and record.get("model") == model:
            return record
    return None


def spread(steps: list[int | None], total: int) -> str:
    """min / median / max of the steps at which pairs part (a pair that never parts counts as after the last step,
    `total`), and how many pairs; "-" for none."""
    if not steps:
        return "-"
    at = [total + 1 if s is None else s for s in steps]

    def word(s: float) -> str:
        return "never" if s > total else str(int(s))

    return f"{word(min(at))} / {word(statistics.median(at))} / {word(max(at))} ({len(at)})"


def parting_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per framework of a parting record: the spread of its run-vs-replicate and replicate-vs-replicate parting
    steps, the earliest step at which its run parts from another framework's, and how many of its within-framework
    pairs part later than that (or never): those are near-copies of the run where the frameworks differ."""
    total, rows = record["steps"], []
    for fw, mine in record["within"].items():
        across = [s for pair, s in record["across"].items() if fw in pair.split("|") and s is not None]
        first = min(across) if across else None
        steps = mine["run"] + mine["replicates"]
        later = sum(1 for s in steps if first is not None and (s is None or s > first))
        rows.append({"framework": fw, "run": spread(mine["run"], total),
                     "replicates": spread(mine["replicates"], total), "first_across": first,
                     "later": later, "pairs": len(steps)})
    return rows
