"""Helpers for the cross-cutting tests, which run in the orchestrator environment and reach the framework
environments only through the runner, as the pipeline does. (Not a conftest.py: packages/common/tests has
one too, and `from conftest import` would pick whichever pytest loaded last.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "packages/common/src"))
sys.path.insert(0, str(REPO))

# The tiny run (its params, the copy, the environment) is tooling's, shared with `make gpu-check`; the tests
# take it from here as before.
from tooling.build.tiny_run import (  # noqa: E402, F401  (needs the path above; re-exported for the tests)
    MODELS,
    TINY,
    TinyRun,
    copy_repo,
    merge,
    orchestrator_env,
    run_tiny_pipeline,
    sh,
    shared_tiny_pipeline,
)


def run_in(env_name: str, code: str, cwd: Path = REPO, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.runner", env_name, "--", "python", "-c", code],
        cwd=cwd,
        env=orchestrator_env(**extra),
        capture_output=True,
        text=True,
        check=False,
    )


def ran_stages(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


# The validate stage exactly as dvc.yaml runs it, for tests that rerun it alone on edited artifacts.
VALIDATE = ["python", "-m", "pipelines.runner", "validation", "--", "python", "-m", "pipelines.stages.validate"]


NULL_PLAN = ["python", "-m", "pipelines.runner", "validation", "--", "python", "-m", "pipelines.stages.null_plan"]
NULL_INTERIM = ["python", "-m", "pipelines.runner", "validation", "--", "python", "-m",
                "pipelines.stages.null_interim"]


def retrain_and_validate(root: Path, env: dict[str, str], retrain: dict[str, list[str]]
                         ) -> subprocess.CompletedProcess[str]:
    """The stages `dvc repro` reruns after a change to some runs, for those runs alone: each framework's
    train_export for its models in `retrain` (importing a framework costs more than training a tiny model), the
    null plan, each framework's replicates where the plan changed or names a model it retrained, the interim look,
    each framework's replicates after it where the look changed or its replicates before it reran, then validate
    (not checked). A framework whose retrained models the plan does not name keeps its replicates: they are the
    replicates of runs that did not change (tied to them by their step losses' digest)."""
    import json

    import yaml

    def named(file: str, key: str) -> list[str]:
        return json.loads((root / "artifacts" / file).read_text())[key]

    def stage(name: str, fw: str) -> None:
        sh(["python", "-m", "pipelines.runner", fw, "--", "python", "-m", f"pipelines.stages.{name}", fw], root, env)

    frameworks = yaml.safe_load((root / "params.yaml").read_text())["frameworks"]
    before = named("null_plan.json", "replicates"), named("null_interim.json", "more")
    for fw, models in retrain.items():
        sh(["python", "-m", "pipelines.runner", fw, "--", "python", "-m", "pipelines.stages.train_export", fw,
            *models], root, env)
    sh(NULL_PLAN, root, env)
    planned = named("null_plan.json", "replicates")
    rerun = [fw for fw in frameworks if planned and (planned != before[0] or set(retrain.get(fw, [])) & set(planned))]
    for fw in rerun:
        stage("replicates", fw)
    sh(NULL_INTERIM, root, env)
    more = named("null_interim.json", "more")
    for fw in frameworks:
        if more and (fw in rerun or more != before[1]):
            stage("replicates_more", fw)
    return sh(VALIDATE, root, env, check=False)


def replace_file(path: Path, data: bytes) -> None:
    """Write by rename, never through the old file: should DVC ever link a workspace file to its cache, an edit
    would otherwise corrupt the cache (and with it the session's shared run)."""
    tmp = path.with_name(f".{path.name}.edit")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class SavedEdits:
    """Edits of a copied run for one test case: every file written or removed is saved before its first change,
    and `restore` puts each back (or removes it, if it did not exist). Mixed into a dataclass with fields
    `run` (anything with a `root`) and `saved`."""

    run: Any
    saved: dict[Path, bytes | None]

    def keep(self, rel: str | Path) -> Path:
        """Save a file before its first change (by us or by a stage the case runs), so `restore` brings it back."""
        path = self.run.root / rel
        self.saved.setdefault(path, path.read_bytes() if path.is_file() else None)
        return path

    def write(self, rel: str | Path, data: bytes) -> None:
        path = self.keep(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, data)

    def remove(self, rel: str | Path) -> None:
        self.keep(rel).unlink()

    def restore(self) -> None:
        for path, data in self.saved.items():
            if data is None:
                path.unlink(missing_ok=True)
            else:
                replace_file(path, data)
        self.saved.clear()
