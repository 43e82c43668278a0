"""Byte-reproducible lineage, for real, on copies of the session's finished TINY run (conftest.py's
`tiny_pipeline`; nothing here changes it):

- a run pushed to a DVC remote and pulled into a fresh clone is complete there: `dvc status` clean, `dvc repro`
  runs nothing, the report and reports/validation.json are present;
- `dvc repro` of two framework stages (and the data and init stages they need) SIGKILLed (its whole process
  group) five times at different moments, then run to the end, gives the same files as the uninterrupted
  run. It runs those stages again, in a fresh clone at another path with no outputs and no cache, so it also
  shows what `dvc repro -f` in place would (DVC removes a stage's outputs before it runs it). The two are torch's
  and JAX's train_export: every kill lands inside a train_export stage or in DVC's own bookkeeping around one,
  and the third framework's stage (TF's, the slowest) and the stages after them would add minutes and no moment
  to kill at that these do not have. The clone trains two of the seven models (KILLED_MODELS; params.yaml's
  `models` edited and committed there), the first two of every stage, one with replicates: every moment is
  still there, at a quarter of the time, and each file it writes must be the uninterrupted run's, byte for byte
  (every model's init, run folder and data are its own files, whatever else the run trains);
- `python -m tooling.build.dvc_lock_check` (`make lock-check`) fails, naming the stage, when code or params changed
  since dvc.lock was written, and passes on this checkout (its committed dvc.lock) and on a finished run.

Slow (the TINY run's data, init and two train_export stages again, killed five times). Every DVC command runs in
the orchestrator's environment with the checkout's framework environments (ROSETTA_ENVS_DIR), as the fixture's own
run does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from pipelines import paths
from support import REPO, TinyRun, orchestrator_env, ran_stages, sh
from support.integrity import Started, check_outputs, fingerprint, leftovers
from support.lineage import (
    GIT,
    Kill,
    KillEvent,
    copy_run,
    differences,
    lock_hashes,
    read_lock,
    recover,
    repro_and_kill,
    subset_differences,
)
from tooling.build.dvc_lock_check import pipeline_stages

# Five moments that exist on a machine of any speed. Four are inside a train_export stage, which holds there until
# it is killed (pipelines.measurements' test hold); one is DVC's own work, keyed to the line DVC prints as it
# starts it. A rerun resumes where the last one stopped, so "the first train_export of this run" is a later stage
# each time (or the same one again, when the kill came before DVC recorded it). The second stage's kill comes
# before the lock's: with two train_export stages, a run after the first one finished has only one left to start.
KILLED_STAGES = ["train_export@torch", "train_export@jax"]
KILLED_MODELS = ["mlp", "cnn"]  # params' first two: a stage holds "train#1" in the first, kills land between them
KILLS = [
    Kill.held("a train_export stage starting: inputs checked, framework not yet imported",
              "train_export:after:inputs#1"),
    Kill.held("a train_export stage training a model", "train_export:before:train#1"),
    Kill.held("a train_export stage measuring latency: every model's folder published, DVC has cached none",
              "train_export:before:latency#1"),
    Kill.held("the second train_export stage of the run, exporting", "train_export:before:export_onnx#2"),
    Kill("DVC writing dvc.lock", r"Updating lock file", 1, 0.0),
]


def test_pushed_run_pulls_complete_into_a_fresh_clone(tiny_pipeline: TinyRun, tmp_path: Path) -> None:
    env = tiny_pipeline.env
    origin = copy_run(tiny_pipeline.root, tmp_path / "origin")
    sh([*GIT, "add", "-A"], origin, env)  # dvc.lock, and any .gitignore DVC wrote
    sh([*GIT, "commit", "-qm", "a finished run", "--allow-empty"], origin, env)
    remote = tmp_path / "remote"
    remote.mkdir()
    sh(["dvc", "remote", "add", "-d", "tmpremote", str(remote)], origin, env)
    sh([*GIT, "add", ".dvc/config"], origin, env)
    sh([*GIT, "commit", "-qm", "a DVC remote"], origin, env)
    sh(["dvc", "push"], origin, env)

    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", str(origin), str(clone)], tmp_path, env)
    assert not (clone / "reports").exists() and not (clone / ".dvc/cache").exists()
    sh(["dvc", "pull"], clone, env)
    status = sh(["dvc", "status", "--json"], clone, env)
    assert json.loads(status.stdout or "{}") == {}, status.stdout
    result = sh(["dvc", "repro"], clone, env)
    assert ran_stages(result.stdout) == set(), result.stdout[-4000:]
    for path in ("reports/comparison/report.html", "reports/validation.json"):
        assert (clone / path).is_file(), path
    assert json.loads((clone / "reports/validation.json").read_text())["passed"] is True
    assert not (clone / "measurements").exists(), "measurements are not lineage: they must not travel"


class KilledClone(NamedTuple):
    root: Path
    events: list[KillEvent]  # one per kill, in order
    log: str  # the kills, one line each
    final: subprocess.CompletedProcess[str]  # the `dvc repro` that ran the clone to its end


@pytest.fixture(scope="module")
def killed_clone(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> KilledClone:
    """A fresh copy of the same files the session's run ran on (a git clone of its first commit, which copy_repo
    made with TINY params), training KILLED_MODELS only: `dvc repro` of KILLED_STAGES killed at each of KILLS, then
    run to its end. Both tests below read it: test_killed_repro_resumes_to_the_same_hashes judges what the kills
    left, test_dvc_repro_killed_between_two_models reruns a stage of the finished clone."""
    env = tiny_pipeline.env
    root = tmp_path_factory.mktemp("killed") / "repo"
    sh(["git", "clone", "-q", str(tiny_pipeline.root), str(root)], root.parent, env)
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["models"][:2] == KILLED_MODELS and set(params["replicates"]["models"]) & set(KILLED_MODELS)
    params["models"] = KILLED_MODELS
    for section in ("replicates", "data_parallel"):  # each names a subset of `models`
        params[section]["models"] = [m for m in params[section]["models"] if m in KILLED_MODELS]
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh([*GIT, "commit", "-qam", f"train {', '.join(KILLED_MODELS)} only"], root, env)
    events, recoveries = [], []
    for kill in KILLS:
        event = repro_and_kill(root, env, kill, targets=KILLED_STAGES)
        events.append(event)
        recoveries += recover(root, env, event)
    log = "\n".join(f"kill {i}: {e.moment}: killed={e.killed} after {e.seconds}s in {e.stage}, dvc.lock valid: "
                    f"{e.lock_parsed}, rwlock entries left: {e.rwlock_entries}" for i, e in enumerate(events, 1))
    print(log, *recoveries, sep="\n")
    return KilledClone(root, events, log, sh(["dvc", "repro", *KILLED_STAGES], root, env))


def test_killed_repro_resumes_to_the_same_hashes(tiny_pipeline: TinyRun, killed_clone: KilledClone) -> None:
    """Every kill landed, and the run then finished gives the uninterrupted run's files, byte for byte."""
    env = tiny_pipeline.env
    root, events, log, final = killed_clone
    assert all(e.killed for e in events), f"a run ended before its kill:\n{log}"
    print("after the kills, dvc repro ran:", sorted(ran_stages(final.stdout)))
    print("and said:", [line for line in (final.stdout + final.stderr).splitlines() if "had been killed" in line])
    status = sh(["dvc", "status", "--json", *KILLED_STAGES], root, env)
    assert json.loads(status.stdout or "{}") == {}, status.stdout

    # The stages that ran: the two targets and what they depend on (not a stale committed dvc.lock's entries of
    # stages that no longer exist, which DVC keeps or drops depending on how it rewrote the file).
    stages = {"data", "init", *KILLED_STAGES}
    assert stages <= set(pipeline_stages(root)) and stages <= set(read_lock(root)), sorted(read_lock(root))
    expected, got = lock_hashes(tiny_pipeline.root, stages=stages), lock_hashes(root, stages=stages)
    changed = subset_differences(tiny_pipeline.root, root, expected, got, KILLED_MODELS)
    # Code and lock files only: the data and init folders these stages read are a subset run's outputs, judged above.
    deps = [line for line in differences(lock_hashes(tiny_pipeline.root, ("deps",), stages),
                                         lock_hashes(root, ("deps",), stages))
            if not line.split()[2].startswith(("data/", "artifacts/"))]
    assert not changed, (
        "outputs whose files differ from the uninterrupted run's:\n" + "\n".join(changed)
        + ("\n(dependencies differ too, so the fixture's copy was edited since its run:\n" + "\n".join(deps) + ")"
           if deps else "") + f"\n{log}"
    )


def test_dvc_repro_killed_between_two_models(tiny_pipeline: TinyRun, killed_clone: KilledClone) -> None:
    """`dvc repro --force --single-item train_export@torch` in the finished two-model clone reruns torch's stage,
    which trains both models in one process, and is killed while the second one trains, the first one's folder
    published: the first is complete (the same bytes again), the second absent (DVC removes a stage's outputs
    before it runs the stage), nothing else touched. The same command again runs the stage to its end from what
    the kill left, and then `dvc repro` of the clone's stages runs nothing and every output is as before the kill,
    byte for byte. (Here, not on a copy of the seven-model run: torch's stage twice for two models instead of
    seven, about 30 s less; forced rather than made stale by an edit to torch's package, which would leave DVC
    restoring outputs from its cache once the edit is undone.)"""
    root, env = killed_clone.root, tiny_pipeline.env
    before = fingerprint(root)
    first, second = KILLED_MODELS
    forced = ["dvc", "repro", "--force", "--single-item", "train_export@torch"]
    started = Started(forced, root, env)
    started.kill_when(lambda: f"train_export: torch/{first}" in started.output()
                      and f"torch {second}:" in started.output().split(f"train_export: torch/{first}")[1])
    folders = {str(paths.run_dir(first, "torch")): "complete|old", str(paths.run_dir(second, "torch")): "absent"}
    states = check_outputs(root, before, folders)
    ran = ran_stages(sh(forced, root, env).stdout)
    assert ran == {"train_export@torch"}, ran
    again = sh(["dvc", "repro", *KILLED_STAGES], root, env)
    assert ran_stages(again.stdout) == set(), again.stdout
    assert not leftovers(root), leftovers(root)
    after = fingerprint(root)
    assert after == before, sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
    print(f"killed dvc repro while torch trained {second}: {states}; the next repro ran {sorted(ran)}")


def lock_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tooling.build.dvc_lock_check", *args], cwd=REPO,
                          env=orchestrator_env(), capture_output=True, text=True, check=False)


def test_committed_lock_is_in_step_with_code_and_params() -> None:
    """This checkout (its real params, not TINY), copied without outputs, as CI sees it."""
    result = lock_check()
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def regenerated_run(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the finished run whose dvc.lock is regenerated from scratch (`rm dvc.lock && dvc repro`, what
    regenerating a lock means): the run cache restores every stage, none runs, and entries that dvc.lock inherited
    for stages dvc.yaml no longer has are gone."""
    root = copy_run(tiny_pipeline.root, tmp_path_factory.mktemp("lock-check") / "repo")
    (root / "dvc.lock").unlink()
    result = sh(["dvc", "repro"], root, tiny_pipeline.env)
    assert ran_stages(result.stdout) == set(), "the run cache should restore every stage"
    assert set(read_lock(root)) == set(pipeline_stages(root))
    return root


def test_lock_check_passes_on_a_finished_run(regenerated_run: Path) -> None:
    root = regenerated_run
    for mode in ([], ["--in-place"]):
        result = lock_check("--repo", str(root), *mode)
        assert result.returncode == 0, f"lock_check {' '.join(mode)}:\n{result.stderr}"


def stale_stages(stderr: str) -> dict[str, str]:
    return dict(line.strip().split(": ", 1) for line in stderr.splitlines()[1:] if ": " in line)


def test_lock_check_names_the_stage_whose_code_changed(regenerated_run: Path, tmp_path: Path) -> None:
    root = copy_run(regenerated_run, tmp_path / "repo")
    code = root / "pipelines/stages/validate.py"
    code.write_text(code.read_text() + "\n# an edit\n")
    result = lock_check("--repo", str(root))
    assert result.returncode != 0
    assert stale_stages(result.stderr) == {"validate": "pipelines/stages/validate.py (modified)"}, result.stderr


def test_lock_check_names_the_stages_whose_params_changed(regenerated_run: Path, tmp_path: Path) -> None:
    root = copy_run(regenerated_run, tmp_path / "repo")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["tolerances"]["onnx_vs_native_abs"] *= 2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = lock_check("--repo", str(root))
    assert result.returncode != 0
    stale = stale_stages(result.stderr)
    assert set(stale) == {"validate", "report"}, result.stderr
    assert all("tolerances" in problems for problems in stale.values()), result.stderr


def test_lock_check_names_the_cpu_when_only_outputs_moved(regenerated_run: Path, tmp_path: Path) -> None:
    """Outputs that differ from the committed dvc.lock while their code, params and locks do not are what another
    CPU gives (docs/lineage.md): lock_check says so and names the stage, and stays green (the lock is in step);
    a stage whose code changed too is stale instead, and gets no such note."""
    root = copy_run(regenerated_run, tmp_path / "repo")
    env = orchestrator_env()
    sh([*GIT, "add", "dvc.lock"], root, env)
    sh([*GIT, "commit", "-qm", "this run's lock", "--allow-empty"], root, env)
    assert "note:" not in lock_check("--repo", str(root)).stderr, "the committed lock itself moved nothing"
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    out = lock["stages"]["train_export@jax"]["outs"][0]
    out["md5"] = "0" * 32 + ".dir"  # what a run on another CPU leaves in the working dvc.lock
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    result = lock_check("--repo", str(root))
    assert result.returncode == 0, result.stderr
    note = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and "train_export@jax" in note[0] and "CPU" in note[0], result.stderr
    assert "train_export@torch" not in note[0] and "validate" not in note[0], note[0]
