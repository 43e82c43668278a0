"""CONTRIBUTING.md's "Adding a model", followed for real: docs/examples/linear-model.patch adds `linear` (softmax
regression: flatten, one dense layer) by the recipe's steps 1, 2, 3, 5 and 7, and nothing else. In a copy of this
checkout with the example applied, step 4's command runs that model's tests in every environment (the conformance
suite, each package's own tests, packages/common/tests), and the registry's own checks (params.yaml's lists, the
KServe manifests, the stage dependencies) pass. When the code moves under the example (a renamed builder, a new
registry field), the patch stops applying or its model stops passing: the recipe is then out of date too.

Step 4 in every environment takes about 5 minutes alone on 2 cores and twice that beside the rest of `make test`, so
it is opt-in (ROSETTA_RECIPE_TESTS=1, `make test-recipe`, which CI's `.ci/run` runs after `make test`); the
patch's scope and the registry's checks run in `make test`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.environments import REPO_ROOT as REPO
from pipelines.environments import envs_dir
from tooling.build.tiny_run import copy_checkout

EXAMPLE = REPO / "docs/examples/linear-model.patch"
MODEL = "linear"


def recipe() -> str:
    """The numbered steps of CONTRIBUTING.md's "Adding a model" (the list, without the prose around it)."""
    section = (REPO / "CONTRIBUTING.md").read_text().split("## Adding a model", 1)[1].split("\n## ", 1)[0]
    return "\n1. " + section.split("\n1. ", 1)[1].split("\n\n", 1)[0]


def touched(patch: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/", patch, re.M)


def named_in(path: str, text: str) -> bool:
    """Whether the recipe names `path`: the file itself, or the folder it lies in (a package's src folder)."""
    parents = [str(p) + "/" for p in Path(path).parents if str(p) != "."]
    return f"`{path}`" in text or any(f"`{parent}`" in text for parent in parents)


def test_the_example_changes_only_what_the_recipe_names() -> None:
    paths, text = touched(EXAMPLE.read_text()), recipe()
    assert paths, f"{EXAMPLE}: no file in the patch"
    assert [p for p in paths if not named_in(p, text)] == []
    assert [p for p in paths if p.startswith(("pipelines/", "tooling/", "benchmarks/", "tests/"))] == []


def test_the_check_sees_a_file_the_recipe_does_not_name() -> None:
    """The check above fails for an example that reaches outside the recipe (here, into pipelines/)."""
    assert not named_in("pipelines/stages/train_export.py", recipe())
    assert named_in("packages/torch_impl/src/rosetta_torch/models.py", recipe())


@pytest.fixture(scope="module")
def added(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout as the user sees it (tracked and untracked files, not ignored) with the example applied."""
    root = tmp_path_factory.mktemp("added")
    copy_checkout(root)
    applied = subprocess.run(["git", "apply", "--verbose", str(EXAMPLE)], cwd=root, capture_output=True, text=True,
                             check=False)
    assert applied.returncode == 0, f"{EXAMPLE.name} no longer applies:\n{applied.stderr[-3000:]}"
    return root


def run_in(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A command of the orchestrator's interpreter in the copy, its sources first (the environments' own path
    files name this checkout's), sharing this checkout's framework environments."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=os.pathsep.join([str(root / "packages/common/src"), str(root)]),
               ROSETTA_ENVS_DIR=str(envs_dir()))
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, check=False)


@pytest.mark.skipif(os.environ.get("ROSETTA_RECIPE_TESTS") != "1",
                    reason="step 4 in every environment takes minutes: make test-recipe (ROSETTA_RECIPE_TESTS=1)")
def test_the_added_model_passes_its_tests_in_every_environment(added: Path) -> None:
    """Step 4: `make test-model MODEL=linear`'s command."""
    result = run_in(added, "-m", "tooling.build.run_tests", "model", "--model", MODEL)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    for suite in ("torch", "tf", "jax", "cross"):
        assert re.search(rf"{suite}: \d+ passed", out), (suite, out[-3000:])


def test_the_registry_checks_pass_with_it(added: Path) -> None:
    """params.yaml's lists in the registry's order, the stage dependencies, the manifests (step 7), the mirrors."""
    result = run_in(added, "-m", "pytest", "-q", "-p", "no:cacheprovider", "packages/common/tests/test_registry.py",
                    "tests/unit/test_kserve_manifests.py", "tests/unit/test_stage_dependencies.py",
                    "tests/unit/test_mirrors.py")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
