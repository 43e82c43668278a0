"""dvc.yaml's dependencies against the code: each stage's import closure, derived with `ast` from the modules its
command runs (nothing is imported), must lie inside the stage's `deps`; a forgotten dependency would leave a
stale stage looking current. Also: stages do not import each other, and every module under pipelines/ is run or
imported by some stage (pipelines/ holds what `dvc repro` executes, and nothing else).

Followed: imports of our own modules (pipelines.*, rosetta_common.*, rosetta_<framework>.*), lazy and type-only
ones included, and the packages above each module (importing a.b runs a/__init__.py). Exempt by name: the
measurement-only modules, whose output is outside the lineage by design (pipelines/measurements.py)."""

from __future__ import annotations

import ast
import copy
import re
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
# Top-level package -> the folder that holds it (rosetta_<framework> from the environments' member folders).
ROOTS = {"pipelines": REPO, **{p.name: p.parent for p in sorted(REPO.glob("packages/*/src/rosetta_*"))}}
# Timings, throughputs, latencies: written to measurements/, never to a stage's output, so not lineage.
MEASUREMENT_ONLY = frozenset({"pipelines.measurements", "pipelines.latency", "pipelines.resources"})
# Imports made by name at run time, which ast cannot see: the framework package a stage loads for its framework.
RUNTIME_IMPORTS = {"rosetta_common.interface": "rosetta_{framework}"}
# Modules a stage's code starts as processes of their own, named in a table ast does not read as imports: the model
# servers of pipelines/serving/servers.py's SERVERS (checked against it below), which the serve stage starts.
STARTED_MODULES = {"pipelines.serving.servers": ("rosetta_torch.serve", "rosetta_tf.serve", "rosetta_jax.serve",
                                                 "pipelines.serving.onnx")}
MODULE = re.compile(r"^(pipelines|rosetta_\w+)(\.\w+)*$")


def module_file(name: str) -> Path | None:
    """The file of our module `name` (a package's __init__.py), or None where it is not ours."""
    top = name.split(".")[0]
    if top not in ROOTS:
        return None
    base = ROOTS[top].joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _packages_above(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


@cache
def direct_imports(name: str) -> frozenset[str]:
    """Our modules that module `name` imports anywhere in its body (a.b.c for `from a.b import c` where c is a
    module, else a.b), with the packages above each."""
    path = module_file(name)
    assert path is not None, name
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if module_file(f"{base}.{alias.name}") else base for alias in node.names]
        for target in targets:
            while target and module_file(target) is None:
                target = target.rpartition(".")[0]  # `import a.b.attr` and the like: the module part
            if target:
                found.update([target, *_packages_above(target)])
    found.discard(name)
    return frozenset(found)


def closure(entries: list[str], framework: str | None) -> set[str]:
    """Every module of ours that running `entries` can import (measurement-only ones reached, not followed)."""
    seen: set[str] = set()
    todo = [m for entry in entries for m in (*_packages_above(entry), entry)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in MEASUREMENT_ONLY:
            continue
        todo.extend(direct_imports(name))
        for started in STARTED_MODULES.get(name, ()):
            todo.extend([*_packages_above(started), started])
        if framework and name in RUNTIME_IMPORTS:
            loaded = RUNTIME_IMPORTS[name].format(framework=framework)
            todo.extend([*_packages_above(loaded), loaded])
    return seen


def stages(dvc: dict[str, Any], params: dict[str, Any]) -> dict[str, tuple[str, list[str], str | None]]:
    """Each stage of dvc.yaml, matrices expanded: its command, deps and framework (None outside a matrix)."""
    found = {}
    for name, stage in dvc["stages"].items():
        items = [None]
        if "matrix" in stage:
            (key, values), = stage["matrix"].items()
            assert key == "framework" and values == "${frameworks}", f"{name}: matrix {stage['matrix']}"
            items = list(params["frameworks"])
        for fw in items:
            def expand(text: str, fw: str | None = fw) -> str:
                return text.replace("${item.framework}", fw) if fw else text
            found[f"{name}@{fw}" if fw else name] = (expand(stage["cmd"]), [expand(d) for d in stage["deps"]], fw)
    return found


def command_modules(cmd: str) -> list[str]:
    """The modules a stage command names: each `python -m <module>`, and any argument that is one of ours (a
    module the stage starts in other processes, such as train_dp's workers)."""
    return [word for word in cmd.split() if MODULE.match(word) and module_file(word)]


def _covered(path: Path, deps: list[str]) -> bool:
    rel = PurePosixPath(path.relative_to(REPO).as_posix())
    return any(rel == PurePosixPath(dep) or PurePosixPath(dep) in rel.parents for dep in deps)


def _trivial(path: Path) -> bool:
    """A module that holds only a docstring (pipelines/__init__.py): nothing in it can change what a stage does."""
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def missing_dependencies(dvc: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """One line per stage and module it imports whose file dvc.yaml's deps for that stage do not cover."""
    problems = []
    for stage, (cmd, deps, fw) in stages(dvc, params).items():
        entries = command_modules(cmd)
        assert entries, f"{stage}: its command names no module of ours: {cmd}"
        for name in sorted(closure(entries, fw) - MEASUREMENT_ONLY):
            path = module_file(name)
            assert path is not None
            if not _covered(path, deps) and not _trivial(path):
                problems.append(f"{stage}: dvc.yaml's deps lack {path.relative_to(REPO)} (module {name}, "
                                "which the stage imports)")
    return problems


def _load() -> tuple[dict[str, Any], dict[str, Any]]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text()), yaml.safe_load((REPO / "params.yaml").read_text())


def test_every_stage_depends_on_every_module_it_imports():
    dvc, params = _load()
    assert missing_dependencies(dvc, params) == []


def test_a_deleted_dependency_fails_naming_the_stage_and_the_module():
    dvc, params = _load()
    for stage, dep, module in [("train_dp", "pipelines/workers.py", "pipelines.workers"),
                               ("train_export", "pipelines/stages/common.py", "pipelines.stages.common"),
                               ("validate", "packages/common/src", "rosetta_common.metrics")]:
        edited = copy.deepcopy(dvc)
        edited["stages"][stage]["deps"].remove(dep)
        problems = missing_dependencies(edited, params)
        assert problems, f"removing {dep} from {stage} went unnoticed"
        assert any(line.startswith(f"{stage}") and f"module {module}," in line for line in problems), problems
        assert all(line.split(":")[0].split("@")[0] == stage for line in problems), problems


def test_the_scan_follows_runtime_imports_and_the_commands_modules():
    _, params = _load()
    dvc, _ = _load()
    found = stages(dvc, params)
    assert command_modules(found["train_dp@torch"][0]) == ["pipelines.stages.train_dp",
                                                            "pipelines.stages.train_dp_worker"]
    reached = closure(command_modules(found["train_export@jax"][0]), "jax")
    assert {"pipelines.runner", "pipelines.containers", "rosetta_jax.train", "pipelines.latency"} <= reached
    assert not any(m.startswith(("rosetta_torch", "rosetta_tf")) for m in reached)


def _stage_modules() -> set[str]:
    return {m for cmd, _, _ in stages(*_load()).values() for m in command_modules(cmd)
            if m.startswith("pipelines.stages.")}


def test_stages_do_not_import_each_other():
    """Shared stage code lives in a module of its own (pipelines/stages/common.py), never in another stage."""
    entries = _stage_modules()
    assert {"pipelines.stages.data", "pipelines.stages.train_dp_worker", "pipelines.stages.report"} <= entries
    found = [(stage, other) for stage in sorted(entries) for other in closure([stage], "torch")
             if other in entries and other != stage]
    assert not found, found


def test_every_module_under_pipelines_is_run_or_imported_by_a_stage():
    dvc, params = _load()
    reached = set().union(*(closure(command_modules(cmd), fw) for cmd, _, fw in stages(dvc, params).values()))
    # A package's __main__ is a command for a person (`python -m pipelines.serving`), which no stage runs.
    ours = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            for p in (REPO / "pipelines").rglob("*.py") if p.name != "__main__.py"}
    assert ours - reached == set()


def test_the_started_modules_are_the_servers_serving_starts():
    from pipelines.serving import servers

    assert STARTED_MODULES["pipelines.serving.servers"] == tuple(module for _, module in servers.SERVERS.values())
    reached = closure(["pipelines.stages.serve"], None)
    assert {"rosetta_torch.serve", "rosetta_tf.export", "rosetta_jax.serve", "pipelines.serving.onnx"} <= reached
