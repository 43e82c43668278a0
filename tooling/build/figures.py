"""Every figure the docs quote, in one file (docs/figures.yaml), and the check that the docs quote it as it is.

A figure is a timing or a count of the project's own runs (seconds, minutes, checks, tests). The file groups the
figures by the run that measured them, with its command, its machine and its date; each figure holds its value and
unit and, where a run writes it to a file, `from`: that file and the field. The docs keep the number readable and
name the figure right after it, so that a page and the file cannot part unnoticed:

    passes all 842 checks<!-- figure: pipeline_checks -->, in about 7 minutes (418 s<!-- figure: pipeline_seconds -->)

    python -m tooling.build.figures check          # the docs against the file: one line per problem, exit 1
    python -m tooling.build.figures update <run>   # that run's figures with `from`, read from this checkout's outputs

A marker checks every timing or count between the previous marker on its line (or the line's start) and itself,
or, where there is none, the number right before it; minutes are the seconds rounded to the minute. `check`
fails on a quoted number that differs from the file, a marker naming no figure, a figure no page quotes, and a
timing or count outside code that carries no marker (a bound or a setting, "within 60 s", "`--timeout` (300 s)",
is no figure); a figure from a committed record (the TPU check's, tooling/devices/tpu_results/) is read again. A
run's outputs (reports/, measurements/) exist only after it, so `update` brings those figures into the file; what
only a person can measure (`make test` in a fresh clone, CI) is edited in the file by hand.
tests/unit/test_figures.py runs `check`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rosetta_common.errors import RosettaError

REPO_ROOT = Path(__file__).resolve().parents[2]
FIGURES = "docs/figures.yaml"
DOCS = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "tests/README.md", "benchmarks/README.md",
        "containers/README.md", "docs/*.md")
RUN_OUTPUTS = ("reports/", "measurements/")  # written by a run, ignored by git: only `update` reads them
UNITS = ("s", "ms", "checks", "tests")
# The word after a number in the prose -> the figure's unit and what the seconds are divided by.
PROSE_UNITS = {"s": ("s", 1), "seconds": ("s", 1), "minute": ("s", 60), "minutes": ("s", 60),
               "checks": ("checks", 1), "passed": ("tests", 1), "tests": ("tests", 1)}
# A `from` field `<list>[<filter>]` counts the list's rows that pass the filter.
ROW_FILTERS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "passed": lambda row: row.get("passed") is True,
    "data-parallel": lambda row: "-dp" in str(row.get("framework", "")),
}

NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
QUOTED = re.compile(rf"(?<![\w.,])({NUMBER})(?:\s+of\s+({NUMBER}))?\s+({'|'.join(PROSE_UNITS)})\b")
LAST_NUMBER = re.compile(rf"(?<![\w.,])({NUMBER})[\s*`_)]*$")
MARKER = re.compile(r"<!--\s*figure:\s*(\S*?)\s*-->")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
SPAN = re.compile(r"(`+).+?\1")
# A bound or a setting, not a measurement: "within 60 s", "every 0.2 s", "`T` = 60 s", "`--timeout` (300 s)",
# "0.5 s (`--min-steady-seconds`)".
SETTING_BEFORE = re.compile(r"(?:\b(?:within|every|until|under|for)|=|`\s*[(,])\s*$")
SETTING_AFTER = re.compile(r"\s*\(`--")  # matched where the number and its unit end


class FiguresError(RosettaError):
    """docs/figures.yaml or a file a figure comes from is not what it should be; the message is the whole line."""


@dataclass(frozen=True)
class Figure:
    key: str
    value: int | float
    unit: str
    run: str
    source: str | None = None  # `from`: "<file, relative to the repository; * sums the matches> <field>"


# ---- the file ----------------------------------------------------------------------------------------------------


def read_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise FiguresError(f"{FIGURES}: unreadable ({type(error).__name__})") from error
    if not isinstance(data, dict) or not isinstance(data.get("runs"), dict):
        raise FiguresError(f"{FIGURES}: no `runs` mapping")
    return data


def figures(data: dict[str, Any]) -> dict[str, Figure]:
    """Every figure of the file by key, each checked: a run has a command, a machine and figures; a figure a number,
    a known unit and, if any, a `from` with a file and a field; no key twice."""
    found: dict[str, Figure] = {}
    for run, entry in data["runs"].items():
        where = f"{FIGURES}: runs.{run}"
        if not isinstance(entry, dict) or not isinstance(entry.get("figures"), dict):
            raise FiguresError(f"{where}: no `figures` mapping")
        for field in ("command", "machine"):
            if not isinstance(entry.get(field), str) or not entry[field].strip():
                raise FiguresError(f"{where}: no `{field}` (the command that measures its figures, and where)")
        for key, figure in entry["figures"].items():
            at = f"{where}.figures.{key}"
            if not isinstance(figure, dict):
                raise FiguresError(f"{at}: not a mapping of value, unit and from")
            value, unit, source = figure.get("value"), figure.get("unit"), figure.get("from")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise FiguresError(f"{at}: value {value!r} is not a number")
            if unit not in UNITS:
                raise FiguresError(f"{at}: unit {unit!r} (one of {', '.join(UNITS)})")
            if source is not None and (not isinstance(source, str) or len(source.split(" ", 1)) != 2):
                raise FiguresError(f"{at}: from {source!r} (a file and a field: reports/validation.json "
                                   "summary.checks)")
            if key in found:
                raise FiguresError(f"{at}: the key is also in runs.{found[key].run}")
            found[key] = Figure(key, value, unit, run, source)
    return found


def render(data: dict[str, Any], header: str) -> str:
    """The file as `update` writes it: its leading comment, then the runs, each figure on one line."""
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=1000, allow_unicode=True)


def header_of(text: str) -> str:
    lines = text.splitlines(keepends=True)
    kept = []
    for line in lines:
        if not line.startswith("#"):
            break
        kept.append(line)
    return "".join(kept)


# ---- figures a run writes ----------------------------------------------------------------------------------------


def field_value(data: Any, field: str, where: str) -> float:
    """`field` of one JSON record: a dotted path to a number, or `<list>[<filter>]`, the rows that pass."""
    counted = re.fullmatch(r"(\w+)\[([\w-]+)\]", field)
    if counted:
        rows, keep = data.get(counted[1]) if isinstance(data, dict) else None, ROW_FILTERS.get(counted[2])
        if keep is None:
            raise FiguresError(f"{where}: field {field}: no filter {counted[2]!r} (one of {', '.join(ROW_FILTERS)})")
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise FiguresError(f"{where}: field {field}: no list of records {counted[1]!r}")
        return float(sum(1 for row in rows if keep(row)))
    node = data
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            raise FiguresError(f"{where}: no field {field}")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise FiguresError(f"{where}: field {field} is {node!r}, not a number")
    return float(node)


def source_files(source: str, root: Path) -> tuple[list[Path], str]:
    pattern, field = source.split(" ", 1)
    files = sorted(root.glob(pattern)) if "*" in pattern else [root / pattern]
    if not files or not all(f.is_file() for f in files):
        raise FiguresError(f"{pattern}: not found (run the command of its figures in this checkout first)")
    return files, field


def read_source(source: str, root: Path) -> int:
    """A figure's value from the files a run wrote: the field's sum over the matching files, to a whole number."""
    files, field = source_files(source, root)
    total = 0.0
    for path in files:
        where = path.relative_to(root).as_posix()
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise FiguresError(f"{where}: unreadable ({type(error).__name__})") from error
        total += field_value(data, field, where)
    return round(total)


def update(data: dict[str, Any], run: str, root: Path) -> list[tuple[str, int | float, int]]:
    """Read again every figure of `run` that has a `from`, in place; its `measured` becomes the date of the newest
    file read. (key, old, new) for each figure read."""
    if run not in data["runs"]:
        raise FiguresError(f"{FIGURES}: no run {run!r} (one of {', '.join(data['runs'])})")
    entry, changes, newest = data["runs"][run], [], 0.0
    for key, figure in entry["figures"].items():
        if figure.get("from") is None:
            continue
        value = read_source(figure["from"], root)
        newest = max([newest, *(p.stat().st_mtime for p in source_files(figure["from"], root)[0])])
        changes.append((key, figure["value"], value))
        figure["value"] = value
    if not changes:
        raise FiguresError(f"{FIGURES}: run {run!r} has no figure with `from`: edit its figures by hand")
    entry["measured"] = dt.datetime.fromtimestamp(newest, dt.UTC).date()
    entry["figures"] = entry.pop("figures")  # last, as in every run
    return changes


# ---- the docs ----------------------------------------------------------------------------------------------------


def blank(text: str, pattern: re.Pattern[str]) -> str:
    """`text` with every match of `pattern` turned to spaces, its line breaks kept: offsets and lines stay."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def formatted(value: int | float, divisor: int) -> str:
    return f"{round(value / divisor):,}" if divisor != 1 else f"{value:,}"


def doc_problems(text: str, doc: str, known: dict[str, Figure]) -> tuple[list[str], set[str]]:
    """One line per problem in one page's figures, and the keys the page quotes."""
    prose = blank(text, FENCE)  # fenced code holds commands and their output, not the project's figures
    outside_code = blank(prose, SPAN)
    quoted = list(QUOTED.finditer(prose))
    claimed: set[int] = set()
    problems: list[str] = []
    keys: set[str] = set()

    def line(at: int) -> int:
        return prose.count("\n", 0, at) + 1

    previous_end = 0
    for marker in MARKER.finditer(prose):
        key, at = marker[1], marker.start()
        start = max(previous_end, prose.rfind("\n", 0, at) + 1)
        previous_end = marker.end()
        where = f"{doc}:{line(at)}: {key}"
        mine = [m for m in quoted if m.start() >= start and m.end() <= at]
        claimed.update(m.start() for m in mine)
        figure = known.get(key)
        if figure is None:
            problems.append(f"{where}: no such figure in {FIGURES}")
            continue
        keys.add(key)
        if mine:
            said = [(m[2] or m[1], m[3]) for m in mine]
        elif last := LAST_NUMBER.search(prose, start, at):
            said = [(last[1], None)]
        else:
            problems.append(f"{where}: the marker follows no number")
            continue
        for number, word in said:
            unit, divisor = PROSE_UNITS[word] if word else (figure.unit, 1)
            if unit != figure.unit:
                problems.append(f"{where}: the prose says {number} {word}, {FIGURES} has it in {figure.unit}")
            elif number != formatted(figure.value, divisor):
                shown = f"{number} {word}" if word else number
                problems.append(f"{where}: the prose says {shown}, {FIGURES} says {figure.value:,} {figure.unit}"
                                + (f" (about {formatted(figure.value, divisor)} {word})" if divisor != 1 else ""))
    for m in quoted:
        if m.start() in claimed or outside_code[m.start():m.end()] != m[0]:
            continue
        if SETTING_BEFORE.search(prose, max(0, m.start() - 30), m.start()) or SETTING_AFTER.match(prose, m.end()):
            continue
        problems.append(f"{doc}:{line(m.start())}: {m[0]!r} is a timing or a count with no figure marker "
                        f"(<!-- figure: KEY --> right after it, KEY in {FIGURES})")
    return problems, keys


def doc_paths(root: Path, patterns: Iterable[str] = DOCS) -> list[Path]:
    return [path for pattern in patterns for path in sorted(root.glob(pattern)) if path.is_file()]


def check(root: Path = REPO_ROOT, docs: list[Path] | None = None) -> list[str]:
    """Every problem of the docs' figures against the file, one line each (empty: they agree)."""
    known = figures(read_file(root / FIGURES))
    problems: list[str] = []
    quoted: set[str] = set()
    for path in doc_paths(root) if docs is None else docs:
        found, keys = doc_problems(path.read_text(), path.relative_to(root).as_posix(), known)
        problems += found
        quoted |= keys
    problems += [f"{FIGURES}: {key} is quoted by no page (quote it, or remove it)" for key in known
                 if key not in quoted and docs is None]
    for figure in known.values():
        if figure.source is None or figure.source.startswith(RUN_OUTPUTS):
            continue
        got = read_source(figure.source, root)
        if got != figure.value:
            problems.append(f"{FIGURES}: {figure.key} is {figure.value:,}, {figure.source} gives {got:,} "
                            f"(python -m tooling.build.figures update {figure.run})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tooling.build.figures", description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the repository (default: this one)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="the docs' figures against docs/figures.yaml")
    refresh = commands.add_parser("update", help="a run's figures with `from`, from this checkout's outputs")
    refresh.add_argument("run", help="the run in docs/figures.yaml whose command made this checkout's outputs")
    args = parser.parse_args(argv)
    root = args.repo.resolve()
    try:
        if args.command == "check":
            problems = check(root)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print(f"error: {len(problems)} figure problem(s) in the docs against {FIGURES}", file=sys.stderr)
                return 1
            print(f"every figure the docs quote is {FIGURES}'s")
            return 0
        path = root / FIGURES
        text = path.read_text()
        data = read_file(path)
        figures(data)
        changes = update(data, args.run, root)
        path.write_text(render(data, header_of(text)))
    except FiguresError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for key, old, new in changes:
        print(f"{key}: {old:,} -> {new:,}" if old != new else f"{key}: {new:,}")
    by_hand = [key for key, figure in data["runs"][args.run]["figures"].items() if figure.get("from") is None]
    if by_hand:
        print(f"measured by hand, not read: {', '.join(by_hand)} (edit {FIGURES})")
    print("python -m tooling.build.figures check names the pages to change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
