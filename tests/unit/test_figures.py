"""tooling/build/figures.py: every timing and count the docs quote is docs/figures.yaml's, and the checker finds
what it is for: a number that differs from the file (naming the page, the key and both values), a marker naming no
figure, a timing or count with no marker, a figure from a committed record (RECORDS) that the record contradicts;
`update` reads a run's figures from the files the run writes (a small fake run in tmp_path). Files only: no run, no
framework."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest
import yaml

from support import REPO
from tooling.build import figures

KNOWN = figures.figures(figures.read_file(REPO / figures.FIGURES))
RECORDS = "tooling/devices/tpu_results"  # the committed records docs/figures.yaml reads: the TPU check's results


def copy_of(tmp_path: Path, doc: str, old: str, new: str) -> Path:
    """A repository in tmp_path holding docs/figures.yaml, the committed records it reads (RECORDS) and a copy
    of `doc` with `old` changed to `new`."""
    (tmp_path / "docs").mkdir(exist_ok=True)
    shutil.copyfile(REPO / figures.FIGURES, tmp_path / figures.FIGURES)
    shutil.copytree(REPO / RECORDS, tmp_path / RECORDS, dirs_exist_ok=True)
    text = (REPO / doc).read_text()
    assert text.count(old) == 1, f"{doc} no longer holds {old!r} once"
    copy = tmp_path / doc
    copy.write_text(text.replace(old, new))
    return copy


def problems_in(text: str, known: dict[str, figures.Figure] = KNOWN) -> list[str]:
    return figures.doc_problems(text, "page.md", known)[0]


# ---- the docs as they are ----------------------------------------------------------------------------------------


def test_every_figure_the_docs_quote_is_the_files() -> None:
    assert figures.check(REPO) == []


def test_the_docs_quote_the_headline_figures_the_file_holds() -> None:
    readme = (REPO / "README.md").read_text()
    for key in ("pipeline_seconds", "pipeline_checks", "tests_seconds", "tests_passed", "ci_seconds"):
        assert f"<!-- figure: {key} -->" in readme
    judge = (REPO / "docs/judge.md").read_text()
    for key in ("pipeline_checks", "mnist5k_checks", "dp_checks", "dp_checks_data_parallel"):
        assert f"<!-- figure: {key} -->" in judge


def test_the_file_is_as_update_writes_it() -> None:
    text = (REPO / figures.FIGURES).read_text()
    assert figures.render(figures.read_file(REPO / figures.FIGURES), figures.header_of(text)) == text, (
        f"{figures.FIGURES} is not in the form `python -m tooling.build.figures update` writes (one figure a line, "
        "{value: ..., unit: ...}): update would rewrite it")


# ---- what the checker finds --------------------------------------------------------------------------------------


def test_a_planted_disagreement_is_reported_naming_page_key_and_both_values(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    value = KNOWN["pipeline_seconds"].value
    marked = f"{value:,} s<!-- figure: pipeline_seconds -->"
    doc = copy_of(tmp_path, "README.md", marked, marked.replace(f"{value:,}", f"{value + 1:,}"))
    problems = figures.check(tmp_path, docs=[doc])
    assert len(problems) == 1, problems
    for part in ("README.md:", "pipeline_seconds", f"the prose says {value + 1:,} s", f"says {value:,} s"):
        assert part in problems[0]
    assert figures.main(["--repo", str(tmp_path), "check"]) == 1
    assert "pipeline_seconds" in capsys.readouterr().err


def test_minutes_are_checked_against_the_seconds() -> None:
    line = "takes about 8 minutes (418 s<!-- figure: pipeline_seconds -->)"
    known = {"pipeline_seconds": figures.Figure("pipeline_seconds", 418, "s", "pipeline")}
    assert problems_in(line.replace("8 minutes", "7 minutes"), known) == []
    [problem] = problems_in(line, known)
    assert "the prose says 8 minutes" in problem and "418 s (about 7 minutes)" in problem


def test_an_unknown_key_is_reported(tmp_path: Path) -> None:
    doc = copy_of(tmp_path, "README.md", "<!-- figure: ci_seconds -->", "<!-- figure: ci_secs -->")
    problems = figures.check(tmp_path, docs=[doc])
    assert len(problems) == 1 and "README.md:" in problems[0] and "ci_secs: no such figure" in problems[0]


def test_a_figure_without_its_marker_is_reported(tmp_path: Path) -> None:
    value = KNOWN["ci_seconds"].value
    doc = copy_of(tmp_path, "README.md", "<!-- figure: ci_seconds -->", "")
    problems = figures.check(tmp_path, docs=[doc])
    assert [p.split(": ", 1)[1] for p in problems] == [  # the seconds, and the minutes on the same line
        f"'{round(value / 60)} minutes' is a timing or a count with no figure marker (<!-- figure: KEY --> right "
        f"after it, KEY in {figures.FIGURES})",
        f"'{value:,} s' is a timing or a count with no figure marker (<!-- figure: KEY --> right after it, KEY in "
        f"{figures.FIGURES})"]
    assert all(p.startswith("README.md:") for p in problems)


def test_a_figure_no_page_quotes_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / figures.FIGURES).write_text(yaml.safe_dump({"runs": {"run": {
        "command": "make repro", "machine": "2 cores",
        "figures": {"quoted": {"value": 3, "unit": "checks"}, "forgotten": {"value": 4, "unit": "s"}}}}}))
    (tmp_path / "README.md").write_text("It makes 3 checks<!-- figure: quoted -->.\n")
    assert figures.check(tmp_path) == [f"{figures.FIGURES}: forgotten is quoted by no page (quote it, or remove it)"]


@pytest.mark.parametrize("text", [
    "stops within 60 s, naming it", "samples every 0.2 s", "with `T` = 60 s, two workers", "for 1 s, 20 calls",
    "within `--timeout` (300 s),", "the stage's `READY_SECONDS`, 300 s)", "and 4 s (`--max-requests`)",
    "a tolerance of 1e-5 on 2 cores", "torch (4h, in)", "```bash\nsleep 600 # 600 s\n```\n", "`make test: 9 passed`",
    "CI's 90-minute limit", "12 MiB in 3 steps",
])
def test_bounds_settings_and_code_are_no_figures(text: str) -> None:
    assert problems_in(text) == []


@pytest.mark.parametrize("text", [
    "takes 467 s", "passes 844 of 844 checks", "about 8 minutes", "1,539 passed", "all 842 checks", "in 0.85 s",
    "1,563 tests", "took 148 s (`highest`)",
])
def test_timings_and_counts_need_a_marker(text: str) -> None:
    [problem] = problems_in(text)
    assert "no figure marker" in problem


def test_a_marker_checks_the_number_right_before_it() -> None:
    known = {"a": figures.Figure("a", 205, "checks", "r"), "b": figures.Figure("b", 206, "checks", "r"),
             "c": figures.Figure("c", 0.85, "s", "r")}
    assert problems_in("205<!-- figure: a --> of 206 checks<!-- figure: b --> pass; **0.85 s**<!-- figure: c -->",
                       known) == []
    assert "the prose says 207 checks" in problems_in("205<!-- figure: a --> of 207 checks<!-- figure: b -->",
                                                      known)[0]
    assert "the marker follows no number" in problems_in("the run<!-- figure: a -->", known)[0]
    assert "has it in checks" in problems_in("took 205 s<!-- figure: a -->", known)[0]


def test_a_committed_record_is_read_again(tmp_path: Path) -> None:
    copy_of(tmp_path, "docs/tpu.md", "<!-- figure: tpu_highest_checks -->", "<!-- figure: tpu_highest_checks -->")
    path = tmp_path / figures.FIGURES
    real = KNOWN["tpu_highest_checks"].value
    path.write_text(path.read_text().replace(f"tpu_highest_checks: {{value: {real},",
                                             f"tpu_highest_checks: {{value: {real + 1},"))
    problems = figures.check(tmp_path, docs=[])
    assert problems == [f"{figures.FIGURES}: tpu_highest_checks is {real + 1:,}, {RECORDS}/result-highest.json "
                        f"summary.checks gives {real:,} (python -m tooling.build.figures update tpu_highest)"]


@pytest.mark.parametrize(("figure", "says"), [
    ({"value": 3, "unit": "sec"}, "runs.run.figures.x: unit 'sec' (one of s, ms, checks, tests)"),
    ({"value": "3", "unit": "s"}, "runs.run.figures.x: value '3' is not a number"),
    ({"value": 3, "unit": "s", "from": "reports/validation.json"}, "runs.run.figures.x: from 'reports/validation"),
])
def test_a_bad_figures_file_is_one_line(tmp_path: Path, figure: dict, says: str,
                                        capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / figures.FIGURES).write_text(yaml.safe_dump({"runs": {"run": {
        "command": "make repro", "machine": "2 cores", "figures": {"x": figure}}}}))
    assert figures.main(["--repo", str(tmp_path), "check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {figures.FIGURES}: {says}") and err.count("\n") == 1


# ---- update: a run's figures from the files it wrote ---------------------------------------------------------------


FAKE_FILE = """# a comment kept at the top
runs:
  run:
    command: make repro
    machine: 2 cores
    measured: 2026-01-01
    figures:
      run_seconds: {value: 999, unit: s}
      run_checks: {value: 0, unit: checks, from: reports/validation.json summary.checks}
      run_failed: {value: 0, unit: checks, from: reports/validation.json summary.failed}
      run_dp_checks: {value: 0, unit: checks, from: 'reports/validation.json checks[data-parallel]'}
      run_stage_seconds: {value: 0, unit: s, from: measurements/stages/*.json total_seconds}
  other:
    command: make test
    machine: 2 cores
    figures:
      other_seconds: {value: 7, unit: s}
"""


def fake_run(root: Path) -> None:
    (root / "docs").mkdir()
    (root / figures.FIGURES).write_text(FAKE_FILE)
    rows = [{"model": "mlp", "framework": subject, "check": "c", "value": 0.0, "tolerance": 1.0, "passed": passed}
            for subject, passed in [("torch", True), ("torch|tf", True), ("torch-dp|torch", True),
                                    ("torch-dp|tf-dp", False), ("onnx", True)]]
    (root / "reports").mkdir()
    (root / "reports/validation.json").write_text(json.dumps({"passed": False, "checks": rows,
                                                               "summary": {"checks": 5, "failed": 1}}))
    (root / "measurements/stages").mkdir(parents=True)
    for stage, seconds in [("data", 10.4), ("train_export@torch", 20.2), ("validate", 0.3)]:
        (root / f"measurements/stages/{stage}.json").write_text(json.dumps({"stage": stage,
                                                                            "total_seconds": seconds}))


def test_update_reads_a_runs_figures_from_its_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fake_run(tmp_path)
    assert figures.main(["--repo", str(tmp_path), "update", "run"]) == 0
    text = (tmp_path / figures.FIGURES).read_text()
    data = yaml.safe_load(text)
    assert {key: f["value"] for key, f in data["runs"]["run"]["figures"].items()} == {
        "run_seconds": 999, "run_checks": 5, "run_failed": 1, "run_dp_checks": 2, "run_stage_seconds": 31}
    assert data["runs"]["run"]["measured"] == dt.datetime.fromtimestamp(
        (tmp_path / "reports/validation.json").stat().st_mtime, dt.UTC).date()
    assert data["runs"]["other"] == yaml.safe_load(FAKE_FILE)["runs"]["other"]
    assert text.startswith("# a comment kept at the top\nruns:\n")
    assert "run_checks: {value: 5, unit: checks, from: reports/validation.json summary.checks}" in text
    out = capsys.readouterr().out
    assert "run_checks: 0 -> 5" in out and "measured by hand, not read: run_seconds" in out


def test_update_without_the_runs_files_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fake_run(tmp_path)
    shutil.rmtree(tmp_path / "measurements")
    assert figures.main(["--repo", str(tmp_path), "update", "run"]) == 2
    assert capsys.readouterr().err == ("error: measurements/stages/*.json: not found (run the command of its figures "
                                       "in this checkout first)\n")
    assert (tmp_path / figures.FIGURES).read_text() == FAKE_FILE
    assert figures.main(["--repo", str(tmp_path), "update", "nothing"]) == 2
    assert "no run 'nothing' (one of run, other)" in capsys.readouterr().err
    assert figures.main(["--repo", str(tmp_path), "update", "other"]) == 2
    assert "has no figure with `from`" in capsys.readouterr().err
