"""The TPU section: what `make tpu-check` found (tooling/devices/tpu_judge.py's results, one per matrix precision), as
reports/tpu-check/report.md: per model the step where the TPU run parts from each CPU run, the verdict, the
closest margin, and the TPU's training step time against the CPU's; then the bounds and every failing check.

Built from the result files alone (no framework, no run folders), so a recorded result renders anywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rosetta_common.registry import ARCHITECTURES

CLAIMED = "highest"
PRECISION_WORDS = ("matrix precision", "jax_default_matmul_precision")


def names_precision(check: dict[str, Any]) -> bool:
    """Whether a failing check's detail names the matrix precision as the likely cause."""
    detail = check.get("detail", "")
    return all(word in detail for word in PRECISION_WORDS) and "likely cause" in detail


def expected_verdicts(results: list[dict[str, Any]]) -> bool:
    """make tpu-check's exit: the `highest` run passes, and every run at another precision fails with every
    failing check naming the matrix precision."""
    seen = {r["precision"] for r in results}
    if CLAIMED not in seen:
        return False
    for result in results:
        if result["precision"] == CLAIMED:
            if not result["passed"]:
                return False
            continue
        failed = [c for c in result["checks"] if not c["passed"]]
        if result["passed"] or not failed or not all(names_precision(c) for c in failed):
            return False
    return True


def _e(value: float | None) -> str:
    return "-" if value is None else ("0" if value == 0 else f"{value:.2g}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _pair_cpu(pair: str, subject: str) -> str:
    return next(part for part in pair.split("|") if part != subject)


def model_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per model (header first)."""
    subject, cpu = result["subject"], result["cpu_frameworks"]
    header = ["model", *(f"parts from {fw} at step" for fw in cpu), "verdict", "closest margin (value / bound)",
              *(f"step-1 loss vs {fw}, rel" for fw in cpu), "TPU step, ms", *(f"{fw} CPU step, ms" for fw in cpu),
              "TPU test accuracy"]
    rows = [header]
    for model, s in result["models"].items():
        parting = {_pair_cpu(pair, subject): step for pair, step in s["parting_step"].items()}
        step1 = {_pair_cpu(pair, subject): value for pair, value in s["step1_loss_rel"].items()}
        closest = s.get("closest")
        margin = "-" if closest is None else (f"{closest['check']} {_e(closest['value'])} / "
                                              f"{_e(closest['tolerance'])}")
        verdict = "pass" if s["passed"] else "FAIL: " + ", ".join(s["failed"])
        rows.append([model, *("never" if parting.get(fw, "-") is None else str(parting.get(fw, "-")) for fw in cpu),
                     verdict, margin, *(_e(step1.get(fw)) for fw in cpu), _ms(s["step_seconds"].get(subject)),
                     *(_ms(s["step_seconds"].get(fw)) for fw in cpu), f"{s['test_accuracy']:.4f}"])
    return rows


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def section(result: dict[str, Any], failures_shown: int = 12) -> str:
    """One precision's part of the report, in Markdown."""
    run = result["run"]
    device = run.get("device", {})
    versions = ", ".join(f"{k} {v}" for k, v in sorted(run.get("versions", {}).items()))
    summary = result["summary"]
    verdict = "PASSED" if result["passed"] else "FAILED"
    parts = [
        f"## {result['subject']}: precision `{result['precision']}` "
        f"(jax_default_matmul_precision={run.get('jax_default_matmul_precision')!s})",
        f"{verdict}: {summary['checks'] - summary['failed']} of {summary['checks']} checks pass, against the CPU "
        f"runs of {', '.join(result['cpu_frameworks'])}. Device: {device.get('kind', '?')} "
        f"({device.get('platform', '?')}); {versions}. Judged {result.get('judged_at', '?')} with the bounds of "
        f"float32 products derived from the op accuracy measured {result['bounds']['op_accuracy']['measured_at']}.",
    ]
    if result.get("cause"):
        parts.append(f"Every failing check ends with the same cause: {result['cause']}.")
    parts.append(markdown_table(model_rows(result)))
    parts.append("A pair parts at the first step whose losses differ beyond the TPU's lockstep bound; "
                 "step times are the median epoch after the first (which compiles) over its steps.")
    failed = [c for c in result["checks"] if not c["passed"]]
    if failed:
        rows = [["model", "subject", "check", "value", "bound"]]
        rows += [[c["model"], c["framework"], c["check"], _e(c["value"]), _e(c["tolerance"])]
                 for c in failed[:failures_shown]]
        more = f" ({len(failed) - failures_shown} more in the result file)" if len(failed) > failures_shown else ""
        parts.append(f"Failing checks{more}:\n\n" + markdown_table(rows))
    return "\n\n".join(parts)


def bounds_table(bounds: dict[str, Any]) -> str:
    """The bounds of float32 products per model, with the op that dominates each."""
    rows = [["model", "step-1 loss, rel", "lockstep losses and state, rel", "ONNX vs TPU logits, rel",
             "largest term"]]
    for model, b in bounds["precisions"][CLAIMED].items():
        rows.append([model, _e(b["step1_loss_rel"]), _e(b["lockstep_loss_rel"]), _e(b["onnx_vs_native_rel"]),
                     f"{b['largest_term']['op']} ({b['largest_term']['share']:.0%})"])
    return markdown_table(rows)


def not_run(results: list[dict[str, Any]], models: list[str] | tuple[str, ...] = ARCHITECTURES) -> list[str]:
    """The architectures of `models` that no result holds: registered after the TPU runs were recorded. They are
    named, not failed: a model is added without a TPU, and `make tpu-check` on one records it."""
    recorded = {model for result in results for model in result["models"]}
    return [model for model in models if model not in recorded]


def render(results: list[dict[str, Any]], bounds: dict[str, Any] | None = None) -> str:
    order = sorted(results, key=lambda r: r["precision"] != CLAIMED)
    parts = ["# TPU check", "The JAX stage trained and exported on a TPU, judged against the CPU runs "
             "(tooling/devices/tpu_judge.py) at float32 products (`highest`) and at JAX's default TPU precision."]
    missing = not_run(results)
    if missing:
        parts.append(f"Not run on a TPU yet: {', '.join(missing)} (no result holds them; `make tpu-check` runs "
                     "every model of params.yaml).")
    if bounds is not None:
        parts += ["## Bounds (float32 products)", bounds_table(bounds)]
    parts += [section(r) for r in order]
    verdict = "as expected" if expected_verdicts(results) else "NOT as expected"
    parts.append(f"Verdicts {verdict}: the `highest` run must pass, a run at another precision must fail naming "
                 "the matrix precision.")
    return "\n\n".join(parts) + "\n"


def write_report(results: list[dict[str, Any]], out: Path, bounds: dict[str, Any] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    path.write_text(render(results, bounds))
    return path
