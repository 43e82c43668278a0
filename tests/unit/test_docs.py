"""The documentation names only what exists: every repository path, Python module, `make` target and params.yaml
key that README.md, docs/*.md and the other guides (DOCS) name, and every relative link they make. Fast: it reads files,
imports nothing of ours and runs no pipeline.

What counts as a name (strict where a name is unambiguous, silent where prose could only guess):
- a path: an inline code span with no whitespace that contains "/" and no "://" (a URL), not starting with "/"
  (a system path), ".." or "~"; `<x>` and `*` match any one path component and `{a,b}` expands, and the pattern
  must match something. It is looked up against the repository root, the document's own folder and each Python
  package's source folder (packages/*/src, so `rosetta_common/weights.py` is found), when its first component is
  one of REPOSITORY_ROOTS or exists there (otherwise it names a file inside a run folder, an image or a
  cluster). Paths under what a run writes (OUTPUT_ROOTS: ignored by git, absent in a fresh clone) are not
  looked up.
- a module: a token of an inline code span, or the argument of `python -m` in a fenced block, that is a dotted
  name starting with one of our top-level packages (MODULE_ROOTS), optionally followed by `()`: the longest
  prefix that is a module or package must exist, and the next component, if any, must be a name that module
  defines or imports at its top level.
- a make target: `make <target>` inside an inline code span or a fenced block.
- a params.yaml key: a token of an inline code span (split at whitespace, `=`, `:`, `,`) that is a dotted name
  whose first component is a top-level section of params.yaml holding a mapping (so `models.py` or `seed` is
  not one); its last component may not be a file extension. `<x>` matches any key at its level.
- a relative link: a Markdown link `[text](target)` whose target is not a URL; the file must exist, and an
  `#anchor` into a Markdown file must be one of its headings (GitHub's slugs).

The same files, and every tracked source file, speak of the project as it is (HISTORY): no issue or item number
of a tracker the repository does not have, and no note of how it was built ("tried", "not kept"). An upstream
issue is cited as owner/repository#number.
"""

from __future__ import annotations

import ast
import glob
import itertools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([*(REPO / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "tests/README.md",
                                          "benchmarks/README.md", "containers/README.md")),
               *(REPO / "docs").glob("*.md")])

# What a run or a build writes: ignored by git (.gitignore), so a fresh clone has none of it.
OUTPUT_ROOTS = {"artifacts", "reports", "measurements", ".rosetta", ".envs", ".venv", "metrics", "plots"}
OUTPUT_PREFIXES = ("data/prepared", "containers/wheelhouse")
MODULE_ROOTS = ("pipelines", "tooling", "benchmarks", "rosetta_common", "rosetta_torch", "rosetta_tf",
                "rosetta_jax")
# A path starting with one of these is always looked up; another only where its first component exists (at one of
# the bases), since `native/model.pt2` or `saved_model/` name something inside a run folder, not the repository.
REPOSITORY_ROOTS = {"packages", "pipelines", "tooling", "benchmarks", "tests", "docs", "containers", "deploy", ".ci",
                    *MODULE_ROOTS}
FILE_EXTENSIONS = {"py", "md", "yaml", "yml", "json", "toml", "lock", "txt", "npz", "npy", "onnx", "keras", "pt2",
                   "safetensors", "log", "js", "html", "csv", "sh", "cfg"}

FENCE = re.compile(r"^```.*?$(.*?)^```", re.M | re.S)
SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
MAKE = re.compile(r"\bmake ([a-z][\w-]*)")
PYTHON_M = re.compile(r"\bpython3? -m ([\w.]+)")
DOTTED = re.compile(r"^[A-Za-z_][\w]*(?:\.(?:[\w]+|<[\w-]+>))+$")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
# How a sentence about the project's making reads: a bare issue number (#12; an upstream one is owner/repo#12, and a
# quoted "#2" is a literal), an issue or item number, a session, what was tried and not kept, "the reference article".
HISTORY = re.compile(r"(?<![\w/&#\"'-])#\d{1,4}\b|\b(?:issue|item)s? #?\d+\b|\breference article\b|\bthis session\b|"
                     r"\bnot kept\b|\(tried\b|\bwe tried\b|\bhelpers? (?:moved|wrote|added)\b", re.I)
SOURCES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "Makefile", "dvc.yaml", "params.yaml", ".ci", "docs",
           "packages", "pipelines", "tests", "tooling", "benchmarks", "containers")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".j2", ".js", ".css", ".sh", ".cfg", ""}


@dataclass(frozen=True)
class Problem:
    doc: str
    kind: str  # "path", "module", "make target", "params key", "link"
    name: str

    def __str__(self) -> str:
        return f"{self.doc}: {self.kind} {self.name!r} does not exist"


def split_code(text: str) -> tuple[list[str], list[str]]:
    """The fenced blocks' bodies and the inline code spans outside them."""
    blocks = FENCE.findall(text)
    prose = FENCE.sub("", text)
    return blocks, [m.group(2).strip() for m in SPAN.finditer(prose)]


def make_targets(repo: Path) -> set[str]:
    targets = set()
    for line in (repo / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z][\w.-]*(?:\s+[A-Za-z][\w.-]*)*)\s*:(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return targets


def params_keys(repo: Path) -> dict:
    return yaml.safe_load((repo / "params.yaml").read_text())


def key_exists(node: object, parts: list[str]) -> bool:
    if not parts:
        return True
    if not isinstance(node, dict):
        return False
    head, rest = parts[0], parts[1:]
    if head.startswith("<"):  # a placeholder: any key at this level
        return any(key_exists(child, rest) for child in node.values())
    return head in node and key_exists(node[head], rest)


def expand_braces(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*,[^{}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    return list(itertools.chain.from_iterable(expand_braces(head + part + tail)
                                              for part in match.group(1).split(",")))


def path_exists(repo: Path, doc_dir: Path, name: str) -> bool:
    bases = [repo, doc_dir, *sorted(repo.glob("packages/*/src"))]
    first = name.split("/", 1)[0]
    if first not in REPOSITORY_ROOTS and ("<" in first or not any((base / first).exists() for base in bases)):
        return True  # not a path of the repository (see REPOSITORY_ROOTS)
    for pattern in expand_braces(re.sub(r"<[^<>]*>", "*", name.rstrip("/"))):
        if not any(glob.glob(str(base / pattern)) for base in bases):
            return False
    return True


def is_path(span: str) -> bool:
    return ("/" in span and not re.search(r"\s", span) and "://" not in span
            and not span.startswith(("/", "..", "~", "-", "$")) and re.fullmatch(r"[\w.\-/<>{},*+]+", span) is not None)


def is_output(span: str) -> bool:
    return span.split("/", 1)[0] in OUTPUT_ROOTS or span.startswith(OUTPUT_PREFIXES)


def module_file(repo: Path, dotted: str) -> Path | None:
    parts = dotted.split(".")
    roots = [repo, *sorted(repo.glob("packages/*/src"))]
    for root in roots:
        base = root.joinpath(*parts)
        if (base / "__init__.py").is_file():
            return base / "__init__.py"
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
    return None


def top_level_names(source: Path) -> set[str]:
    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    if source.name == "__init__.py":  # a package's submodules are its names too
        names.update(p.stem for p in source.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    return names


def module_exists(repo: Path, dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        source = module_file(repo, ".".join(parts[:i]))
        if source is not None:
            return i == len(parts) or parts[i] in top_level_names(source)
    return False


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    found: set[str] = set()
    for heading in HEADING.findall(text):
        base, n = slug(heading), 1
        name = base
        while name in found:
            name, n = f"{base}-{n}", n + 1
        found.add(name)
    return found


def is_params_key(token: str, sections: set[str]) -> bool:
    return (DOTTED.match(token) is not None and token.split(".")[0] in sections
            and token.rsplit(".", 1)[-1] not in FILE_EXTENSIONS)


def link_resolves(repo: Path, doc: Path, target: str) -> bool:
    file, _, anchor = target.partition("#")
    linked = (doc.parent / file).resolve() if file else doc
    if not linked.exists():
        return False
    return not anchor or linked.suffix != ".md" or anchor in anchors(linked)


def check(text: str, doc: Path, repo: Path = REPO) -> list[Problem]:
    """Every name in `text` (the contents of the document `doc`) that does not exist in `repo`."""
    where = doc.relative_to(repo).as_posix() if doc.is_relative_to(repo) else str(doc)
    blocks, spans = split_code(text)
    problems: list[Problem] = []
    params, targets = params_keys(repo), make_targets(repo)
    sections = {key for key, value in params.items() if isinstance(value, dict)}
    for span in spans:
        if is_path(span) and not is_output(span) and not path_exists(repo, doc.parent, span):
            problems.append(Problem(where, "path", span))
        for token in re.split(r"[\s=:,]+", span):
            token = re.sub(r"\(.*\)$", "", token.strip("'\"[]"))
            if token.split(".")[0] in MODULE_ROOTS and re.fullmatch(r"[\w.]+", token):
                if not module_exists(repo, token):
                    problems.append(Problem(where, "module", token))
            elif is_params_key(token, sections) and not key_exists(params, token.split(".")):
                problems.append(Problem(where, "params key", token))
    for code in [*blocks, *spans]:
        for target in MAKE.findall(code):
            if target not in targets:
                problems.append(Problem(where, "make target", target))
    for block in blocks:
        for module in PYTHON_M.findall(block):
            if module.split(".")[0] in MODULE_ROOTS and not module_exists(repo, module):
                problems.append(Problem(where, "module", module))
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"^[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        if not link_resolves(repo, doc, target):
            problems.append(Problem(where, "link", target))
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_name_in_the_docs_exists(doc: Path) -> None:
    problems = check(doc.read_text(), doc)
    assert not problems, "\n".join(map(str, problems))


def history_lines(text: str, where: str) -> list[str]:
    """Each line of text that tells how the project was made rather than what it is, as `where:line: text`."""
    return [f"{where}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def test_the_sources_speak_of_the_project_as_it_is() -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--", *SOURCES], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    found = []
    for name in filter(None, listed):
        path = REPO / name
        if path.suffix in TEXT_SUFFIXES and path.is_file() and name != "tests/unit/test_docs.py":
            found += history_lines(path.read_text(errors="replace"), name)
    assert not found, "\n".join(found)


def test_the_history_check_finds_what_it_is_for() -> None:
    planted = ["Fixed in #24.", "or item 7 asks less of K", "(tried, not kept)", "as the reference article does",
               "the helpers moved to integrity_support", "the cap comes from issue 21"]
    assert [len(history_lines(line, "x")) for line in planted] == [1] * len(planted)
    fine = ["tensorflow/tensorflow#62466", "color #ee4c2c", '"#2" is the second process', "train#1 of the run",
            "ONNX Runtime sessions", "item of the list"]
    assert [history_lines(line, "x") for line in fine] == [[]] * len(fine)


def test_the_docs_exist_and_the_readme_stays_short() -> None:
    assert (REPO / "docs").is_dir() and len(DOCS) > 3
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_the_checker_reports_a_missing_path_key_module_target_and_link(tmp_path: Path) -> None:
    """A document naming what does not exist fails, naming each; the same document with real names passes."""
    text = "\n".join([
        "Run `make repro`, then read `pipelines/checks/ledger.py` and `tolerances.null_alpha`.",
        "See `rosetta_common.interface.check_backend` and",
        "[the judge](judge.md#the-judge-what-the-validate-stage-checks).",
        "Outputs such as `artifacts/<framework>/<model>/` and `models.py` are not looked up.",
    ])
    doc = REPO / "docs" / "example.md"
    assert check(text, doc) == []
    broken = text.replace("pipelines/checks/ledger.py", "pipelines/checks/no_such_module.py") \
                 .replace("tolerances.null_alpha", "tolerances.no_such_key") \
                 .replace("make repro", "make no-such-target") \
                 .replace("check_backend", "no_such_function") \
                 .replace("judge.md#", "no-such-page.md#")
    reported = {(p.kind, p.name) for p in check(broken, doc)}
    assert reported == {("path", "pipelines/checks/no_such_module.py"), ("params key", "tolerances.no_such_key"),
                        ("make target", "no-such-target"),
                        ("module", "rosetta_common.interface.no_such_function"),
                        ("link", "no-such-page.md#the-judge-what-the-validate-stage-checks")}


def test_the_checker_fails_when_a_named_path_or_key_is_removed(tmp_path: Path) -> None:
    """The real README and judge page against a copy of the repository's named files with one path and one
    params key removed: both are reported."""
    repo = tmp_path / "repo"
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / name, repo / name)
    judge = repo / "docs" / "judge.md"
    assert check(judge.read_text(), judge, repo) == []
    (repo / "pipelines/checks/replicate_null.py").unlink()
    params = (repo / "params.yaml").read_text()
    (repo / "params.yaml").write_text(params.replace("  null_alpha:", "  # null_alpha:"))
    reported = {(p.kind, p.name) for p in check(judge.read_text(), judge, repo)}
    assert ("path", "pipelines/checks/replicate_null.py") in reported
    assert ("params key", "tolerances.null_alpha") in reported
