"""Each architecture's definition as written in each framework package, read from source at report time
(with `ast`, never by importing the package: the report has no framework), so it cannot drift from the code.

For an architecture we pick the top-level class or function named after it (`MLP`, `mlp`; `TextTransformer` for
`text_transformer`: case and underscores aside), else the one
whose name contains it and that no other such candidate uses (`AttentionClassifier`, not `SelfAttention`),
and add the module's own classes and functions it uses, transitively, in source order. When nothing
matches, or the file does not parse, the whole models.py is shown: better too much than nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Source:
    framework: str
    path: str  # as shown in the report, relative to the repository
    code: str
    names: list[str] = field(default_factory=list)  # the definitions shown; empty when the whole file is
    note: str = ""


def models_path(root: Path, framework: str) -> Path:
    return root / "packages" / f"{framework}_impl" / "src" / f"rosetta_{framework}" / "models.py"


def _definitions(tree: ast.Module) -> dict[str, Definition]:
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    }


def _uses(node: ast.AST, known: dict[str, Definition]) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in known}


def _closure(name: str, known: dict[str, Definition]) -> set[str]:
    """`name` and every module-level definition it uses, directly or through another one."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo += sorted(_uses(known[current], known) - seen)
    return seen


def _folded(name: str) -> str:
    """A name as compared with an architecture's: case and underscores ignored (TextTransformer, text_transformer)."""
    return name.lower().replace("_", "")


def pick_root(arch: str, known: dict[str, Definition]) -> str | None:
    exact = [name for name in known if _folded(name) == _folded(arch)]
    if exact:
        return exact[0]
    candidates = [name for name in known if _folded(arch) in _folded(name)]
    closures = {name: _closure(name, known) for name in candidates}
    # Drop candidates that another candidate uses (SelfAttention inside AttentionClassifier).
    roots = [n for n in candidates if not any(n in closures[o] for o in candidates if o != n)] or candidates
    if not roots:
        return None
    return max(roots, key=lambda n: (len(closures[n]), -known[n].lineno))


def _segment(lines: list[str], node: Definition) -> str:
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return "".join(lines[start - 1 : node.end_lineno]).rstrip() + "\n"


def extract(root: Path, framework: str, arch: str) -> Source:
    path = models_path(root, framework)
    shown = str(path.relative_to(root))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        return Source(framework, shown, "", note=f"not readable: {type(error).__name__}: {error}")
    try:
        known = _definitions(ast.parse(text, filename=str(path)))
    except SyntaxError as error:
        return Source(framework, shown, text, note=f"does not parse ({error.msg}, line {error.lineno}): whole file")
    name = pick_root(arch, known)
    if name is None:
        return Source(framework, shown, text, note=f"no class or function named after {arch!r}: whole file")
    names = sorted(_closure(name, known), key=lambda n: known[n].lineno)
    lines = text.splitlines(keepends=True)
    return Source(framework, shown, "\n\n".join(_segment(lines, known[n]) for n in names), names)
