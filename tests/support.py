"""Helpers for the cross-cutting tests, which run in the orchestrator environment and reach the framework
environments only through the runner, as the pipeline does. (Not a conftest.py: packages/common/tests has
one too, and `from conftest import` would pick whichever pytest loaded last.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages/common/src"))
sys.path.insert(0, str(REPO))


def orchestrator_env(**extra: str) -> dict[str, str]:
    """The orchestrator's interpreter first on PATH (dvc.yaml says `python`), common importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "packages/common/src"), str(REPO)])
    return {**env, **extra}


def run_in(env_name: str, code: str, cwd: Path = REPO, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.runner", env_name, "--", "python", "-c", code],
        cwd=cwd,
        env=orchestrator_env(**extra),
        capture_output=True,
        text=True,
        check=False,
    )

