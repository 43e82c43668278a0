"""The import structure, read with `ast` (nothing is imported): no cycles among our modules or packages, the
shared package free of frameworks, each framework package on its own, the report free of benchmark code.

Every import counts, also one inside a function: a lazy import still ties two modules together, and it is how
the old runner -> containers -> lock -> runner cycle hid."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FRAMEWORK_PACKAGES = ("rosetta_torch", "rosetta_tf", "rosetta_jax")
FRAMEWORKS = ("torch", "tensorflow", "keras", "jax", "flax", "optax", "onnxruntime", "tf2onnx", "jax2onnx")
# Test modules import the support package by bare name (`from support import TinyRun`): tests/ is on sys.path, and
# pytest imports each test file by its name from its own folder (tests/unit, tests/pipeline, tests/system).
TESTS = REPO / "tests"
ROOTS = [REPO / "pipelines", REPO / "tooling", REPO / "benchmarks", *sorted((REPO / "packages").glob("*/src/*")),
         TESTS]


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted (for `from a import b`: a.b where that is a module, else a)
    top_level: bool  # at module level (not inside a function or class body), so it runs on import
    line: int


def module_name(path: Path) -> str:
    if TESTS in path.parents:
        rel = path.relative_to(TESTS).with_suffix("")
        if rel.parts[0] == "support":
            return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        return rel.name
    for root in ROOTS:
        if root in path.parents:
            rel = path.relative_to(root.parent).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            return ".".join(parts)
    raise ValueError(path)


def modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in root.rglob("*.py"):
            if "tests" not in path.relative_to(root).parts:
                found[module_name(path)] = path
    return found


MODULES = modules()


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    # Module-level code also includes the bodies of top-level if/try blocks (optional imports).
    for stmt in tree.body:
        if isinstance(stmt, ast.If | ast.Try):
            top |= {id(n) for n in ast.walk(stmt) if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    # `if TYPE_CHECKING:` imports count too: a type-only import still ties the two modules together (a reader,
    # a type checker and any later runtime use see the cycle), so it is no way around one.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, id(node) in top, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield Import(module, candidate if candidate in MODULES else base, id(node) in top, node.lineno)


IMPORTS = [imp for module, path in MODULES.items() for imp in imports_of(module, path)]


def _ours(target: str) -> str | None:
    """The module of ours that `target` names (a dotted prefix of it), or None for a third-party import."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_type_only_imports_are_scanned(tmp_path):
    """An import under `if TYPE_CHECKING:` is an import like any other here (the jax package's models/weights
    cycle hid behind one)."""
    module = tmp_path / "typed.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rosetta_jax.models import Model\n")
    assert [imp.target for imp in imports_of("typed", module)] == ["typing", "rosetta_jax.models"]


def test_the_scan_sees_our_modules():
    assert {"pipelines.runner", "pipelines.environments", "pipelines.containers", "rosetta_common"} <= set(MODULES)
    assert {"tooling.build.images", "tooling.devices.gpu_check", "tooling.diagnose.where_they_part", "support",
            "test_imports"} <= set(MODULES)
    assert any(m.startswith("rosetta_torch") for m in MODULES)


def test_no_import_cycle_among_our_modules():
    """Module by module, across pipelines/, tooling/, benchmarks/, tests/, rosetta_common and the framework
    packages, lazy imports inside functions included (a cycle hidden in a function is still a cycle); between
    packages, see the next test."""
    graph: dict[str, set[str]] = {}
    for imp in IMPORTS:
        target = _ours(imp.target)
        if target and target != imp.module:
            graph.setdefault(imp.module, set()).add(target)
    # A package's __init__ importing its own submodules is how packages re-export; a submodule importing the
    # package back is the same pair seen from below. Neither is a cycle between two modules of ours.
    for module, targets in graph.items():
        graph[module] = {t for t in targets if not (t.startswith(module + ".") or module.startswith(t + "."))}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_import_cycle_among_packages():
    """Between our packages (rosetta_common, each framework package, benchmarks, and each subpackage of pipelines:
    pipelines.stages, pipelines.report, and pipelines' own modules as one)."""

    def package(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:2]) if parts[0] == "pipelines" and len(parts) > 2 else parts[0]

    graph: dict[str, set[str]] = {}
    for imp in IMPORTS:
        target = _ours(imp.target)
        if target and package(target) != package(imp.module):
            graph.setdefault(package(imp.module), set()).add(package(target))
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def _imports(prefix: str) -> list[Import]:
    return [imp for imp in IMPORTS if imp.module == prefix or imp.module.startswith(prefix + ".")]


def _names(imp: Import, names: tuple[str, ...]) -> bool:
    return imp.target.split(".")[0] in names


def test_rosetta_common_imports_no_framework_at_module_level():
    found = [imp for imp in _imports("rosetta_common") if imp.top_level and _names(imp, FRAMEWORKS)]
    assert not found, found


@pytest.mark.parametrize("package", FRAMEWORK_PACKAGES)
def test_a_framework_package_imports_no_other_framework_package_nor_pipelines(package):
    others = tuple(p for p in FRAMEWORK_PACKAGES if p != package)
    found = [imp for imp in _imports(package) if _names(imp, (*others, "pipelines", "benchmarks"))]
    assert not found, found


def test_pipelines_imports_neither_tooling_nor_tests_nor_benchmarks():
    """What `dvc repro` executes depends on nothing outside it: tooling, tests and benchmarks import pipelines, never
    the reverse, so an edit to them can never move a stage's lineage (lazy imports included)."""
    outside = {m for m, path in MODULES.items() if path.is_relative_to(TESTS)} | {"tooling", "benchmarks"}
    found = [imp for imp in _imports("pipelines")
             if (target := _ours(imp.target)) and (target in outside or target.split(".")[0] in outside)]
    assert not found, found


def test_the_report_imports_no_benchmark_code():
    found = [imp for imp in _imports("pipelines.report") if _names(imp, ("benchmarks",))]
    found += [imp for imp in _imports("pipelines.stages.report") if _names(imp, ("benchmarks",))]
    assert not found, found


def test_no_module_imports_the_runner_for_its_constants():
    # The environment facts live in pipelines.environments; only the container runtime's caller is the runner.
    # (test_runner.py, which tests the runner itself, is the one module that may.)
    found = [imp for imp in IMPORTS if _ours(imp.target) == "pipelines.runner" and imp.module != "test_runner"]
    assert not found, found
