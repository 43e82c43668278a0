"""`make tpu-check` where it can be tested, which is anywhere: its refusal without a TPU (one line, exit 2), the
bounds derived from the recorded op-accuracy file (tooling/devices/tpu_results/op_accuracy.json, measured on a TPU
v5e), the TPU lock, and the judgement and report section from the recorded results
(tooling/devices/tpu_results/result-*.json). The TPU runs themselves are `make tpu-check`'s alone."""

from __future__ import annotations

import copy
import glob
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rosetta_common.registry import ARCHITECTURES
from rosetta_common.spec import load_spec
from support import REPO, orchestrator_env
from tooling.devices import tpu_bounds, tpu_check
from tooling.devices import tpu_report as report

TPU = REPO / tpu_check.RESULTS
SPEC = load_spec(REPO / "params.yaml")


def recorded(name: str) -> dict:
    return json.loads((TPU / name).read_text())


# The models the recorded TPU runs hold: a model registered since is named by the report, not failed here.
RECORDED_MODELS = list(recorded("result-highest.json")["models"])


# ---------------------------------------------------------------- refusal


@pytest.mark.skipif(bool(glob.glob("/dev/accel*")), reason="a TPU host: make tpu-check runs here")
def test_tpu_check_refuses_without_a_tpu_in_one_line():
    env = {k: v for k, v in orchestrator_env().items() if k != "TPU_ACCELERATOR_TYPE"}
    done = subprocess.run([sys.executable, "-m", "tooling.devices.tpu_check"], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: make tpu-check needs a TPU that JAX can use: no TPU device visible (/dev/accel* and /dev/vfio/ list "
        "none, TPU_ACCELERATOR_TYPE unset)"]


def test_refusal_names_the_missing_tpu_runtime(tmp_path):
    (tmp_path / "accel0").touch()  # a TPU device, but an interpreter without libtpu (this one)
    why = tpu_check.refusal(tmp_path, {"ROSETTA_TPU_PYTHON": sys.executable})
    assert why.startswith("error: make tpu-check needs a TPU that JAX can use: ")
    assert "cannot import libtpu" in why and "requirements-tpu.lock" in why and "\n" not in why
    assert tpu_check.refusal(tmp_path, {"ROSETTA_TPU_PYTHON": "/nonexistent/python"}) != ""


# ---------------------------------------------------------------- bounds from the recorded op accuracy


def test_bounds_derive_from_the_recorded_op_accuracy_file():
    """The recorded bounds.json is what the method gives from the recorded op_accuracy.json and params.yaml,
    nothing else; and the method gives every registered model its bounds, recorded on a TPU or not."""
    derived = tpu_bounds.derive(recorded("op_accuracy.json"), SPEC.tolerances, RECORDED_MODELS)
    assert json.loads(json.dumps(derived)) == recorded("bounds.json")
    every = tpu_bounds.derive(recorded("op_accuracy.json"), SPEC.tolerances, list(ARCHITECTURES))
    assert list(every["precisions"]["highest"]) == list(ARCHITECTURES)


def test_models_not_run_on_a_tpu_are_named_not_failed():
    high, default = recorded("result-highest.json"), recorded("result-default.json")
    assert report.not_run([high, default]) == [m for m in ARCHITECTURES if m not in RECORDED_MODELS]
    assert report.not_run([high, default], [*RECORDED_MODELS, "tcn"]) == ["tcn"]
    without_gru = copy.deepcopy(high)
    del without_gru["models"]["gru"]
    assert report.not_run([without_gru], RECORDED_MODELS) == ["gru"]
    line = next(line for line in report.render([without_gru]).splitlines() if line.startswith("Not run on a TPU"))
    assert line.startswith(f"Not run on a TPU yet: {', '.join(report.not_run([without_gru]))} (")
    assert "gru" in line


def test_the_method_by_hand_for_mlp_and_lstm():
    ops = recorded("op_accuracy.json")["ops"]
    tol = SPEC.tolerances

    def rel(op: str, precision: str = "highest") -> float:
        return ops[op][precision]["rel_norm"]

    mlp = tpu_bounds.model_bounds("mlp", ops, tol, "highest")
    assert mlp["step1_loss_rel"] == pytest.approx(
        tol.step1_loss_rel + math.sqrt(2 * rel("matmul") ** 2 + rel("cross_entropy10") ** 2))
    assert mlp["lockstep_loss_rel"] == pytest.approx(tol.lockstep_loss_rel * mlp["step1_loss_rel"]
                                                     / tol.step1_loss_rel)
    lstm = tpu_bounds.model_bounds("lstm", ops, tol, "highest")
    assert lstm["uses"] == {"matmul": 17, "sigmoid": 24, "tanh": 16, "cross_entropy10": 1}
    assert lstm["largest_term"]["op"] == "tanh"  # the TPU's tanh, not its products, sets the recurrent bounds


def test_bounds_are_wider_than_the_cpu_and_bfloat16_products_wider_still():
    bounds = recorded("bounds.json")["precisions"]
    for model in RECORDED_MODELS:
        high, default = bounds["highest"][model], bounds["default"][model]
        assert SPEC.tolerances.step1_loss_rel < high["step1_loss_rel"] < default["step1_loss_rel"]
        assert default["largest_term"]["op"] in {"matmul", "conv"}  # bfloat16 passes dominate every model
    ops = recorded("op_accuracy.json")
    assert ops["device"]["platform"] == "tpu"
    assert ops["ops"]["matmul"]["default"]["rel_norm"] > 1e4 * ops["ops"]["matmul"]["highest"]["rel_norm"]


def test_tolerances_for_replaces_only_the_derived_bounds():
    bounds = recorded("bounds.json")["precisions"]["highest"]["text_transformer"]
    tol = tpu_bounds.tolerances_for(SPEC.tolerances, bounds)
    assert tol.step1_loss_rel == bounds["step1_loss_rel"]
    assert tol.lockstep_state_rel == bounds["lockstep_state_rel"]
    assert tol.test_loss_rel == SPEC.tolerances.test_loss_rel
    assert tol.lockstep_steps == SPEC.tolerances.lockstep_steps


# ---------------------------------------------------------------- the judgement and report from recorded results


def test_recorded_bounds_came_before_the_comparison():
    ops, high, default = recorded("op_accuracy.json"), recorded("result-highest.json"), recorded(
        "result-default.json")
    for result in (high, default):
        assert result["bounds"]["op_accuracy"]["measured_at"] == ops["measured_at"]
        assert ops["measured_at"] < result["judged_at"]


def test_recorded_runs_pass_and_fail_where_their_causes_say():
    """The recorded `highest` run passes every check (docs/tpu.md: every bound, and after parting the measured null
    of 16-ulp replicates, CPU ones trained on where its Holm family needed them); the default run fails every
    model, each failing check naming the matrix precision."""
    high, default = recorded("result-highest.json"), recorded("result-default.json")
    assert high["run"]["jax_default_matmul_precision"] == "highest"
    assert set(high["models"]) == set(default["models"]) <= set(ARCHITECTURES) and high["cpu_frameworks"]
    assert high["passed"] and all(c["passed"] for c in high["checks"])
    nulls = [c for c in high["checks"] if c.get("null")]
    assert nulls and all(c["null"]["p_value"] > c["null"]["threshold"] for c in nulls)
    assert not default["passed"]
    assert all(not m["passed"] for m in default["models"].values())  # every model, not one
    failed = [c for c in default["checks"] if not c["passed"]]
    assert failed and all(report.names_precision(c) for c in failed)
    assert all(c["framework"].startswith("jax@tpu-default") or "|jax@tpu-default" in c["framework"]
               for c in failed)
    assert report.expected_verdicts([high, default])  # make tpu-check exits 0 on them


def test_expected_verdicts_refuses_the_wrong_outcomes():
    high, default = recorded("result-highest.json"), recorded("result-default.json")
    assert report.expected_verdicts([high, default])
    failing_high = copy.deepcopy(high)
    failing_high["passed"] = False
    failing_high["checks"][0]["passed"] = False
    assert not report.expected_verdicts([failing_high, default])
    passing_default = copy.deepcopy(default)
    passing_default["passed"] = True
    assert not report.expected_verdicts([high, passing_default])
    unnamed = copy.deepcopy(default)
    next(c for c in unnamed["checks"] if not c["passed"])["detail"] = "beyond the bound"
    assert not report.expected_verdicts([high, unnamed])
    assert not report.expected_verdicts([default])


def test_report_section_from_the_recorded_results(tmp_path):
    code = tpu_check.main(["report", str(TPU / "result-highest.json"), str(TPU / "result-default.json"),
                           "--bounds", str(TPU / "bounds.json"), "--out", str(tmp_path)])
    assert code == 0  # highest passes and the default fails naming the precision: make tpu-check's expected verdicts
    text = (tmp_path / "report.md").read_text()
    assert "## jax@tpu: precision `highest`" in text and "PASSED: 206 of 206" in text
    assert "## jax@tpu-default: precision `default`" in text and "FAILED" in text
    assert "likely cause: the matrix precision" in text
    for model in RECORDED_MODELS:
        rows = [line for line in text.splitlines() if re.match(rf"\| {model} \| (\d+|never) \| ", line)]
        assert len(rows) == 2  # one row per precision
    text_row = next(line for line in text.splitlines() if line.startswith("| text_transformer | 344 |"))
    assert "| pass |" in text_row and "train_step1_loss_rel" in text_row  # its closest margin: the step-1 loss
    assert "Verdicts NOT as expected" not in text


# ---------------------------------------------------------------- the TPU lock


def test_tpu_lock_is_the_cpu_lock_plus_libtpu():
    pin = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)
    root = REPO / "packages/jax_impl"
    cpu = dict(pin.findall((root / "requirements-cpu.lock").read_text()))
    tpu_text = (root / "requirements-tpu.lock").read_text()
    tpu = dict(pin.findall(tpu_text))
    assert {k: v for k, v in tpu.items() if k != "libtpu"} == cpu
    assert tpu["libtpu"] == "0.0.42.1" and tpu["jax"] == tpu["jaxlib"] == "0.10.2"
    requirements = re.split(r"\n(?=[A-Za-z0-9])", tpu_text.strip())
    assert all("--hash=sha256:" in requirement for requirement in requirements)
    assert "find-links" not in tpu_text and "/opt/" not in tpu_text


def test_dvc_pipeline_has_no_tpu_stage():
    """The TPU subject is optional: the default `dvc repro` neither runs nor reads it."""
    text = (REPO / "dvc.yaml").read_text()
    assert not re.search(r"\btpu\b|jax@tpu|tpu_", text, re.IGNORECASE)
    assert not Path(REPO / "artifacts" / "jax@tpu").is_symlink()


def test_judge_names_the_precision_in_the_validation_environment():
    """tooling/devices/tpu_judge.py, where it runs (ONNX Runtime, no framework): the cause each failing check of a
    run below float32 ends with, and the absence of that cause for a run at `highest`."""
    from support import run_in

    code = ("import json; from tooling.devices.tpu_judge import precision_cause; "
            "ops = json.load(open('tooling/devices/tpu_results/op_accuracy.json')); "
            "print(json.dumps([precision_cause({'precision': 'default', 'jax_default_matmul_precision': None}, ops), "
            "precision_cause({'precision': 'highest', 'jax_default_matmul_precision': 'highest'}, ops)]))")
    done = run_in("validation", code)
    assert done.returncode == 0, done.stderr
    default, highest = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.names_precision({"detail": default})
    assert "2.4e-03 relative error against 7.3e-08 at highest" in default
    assert not report.names_precision({"detail": highest}) and "not the matrix precision" in highest


def test_the_recorded_runs_judged_again_by_the_current_rule():
    """`tpu_check rejudge`: the recorded rows' nulls decided by today's Ledger.judge_nulls (Holm over the same tests,
    the floor rule). The recorded results were judged by it, so no row moves: `highest` keeps 206 of 206, and no
    test of either run has a floor above Holm's threshold at its rank (tooling/devices/tpu_null.py trained the CPU
    replicates that the text model's tests needed)."""
    from tooling.devices.tpu_null import wanted

    done = subprocess.run([sys.executable, "-m", "pipelines.runner", "validation", "--", "python", "-m",
                           "tooling.devices.tpu_check", "rejudge", str(TPU / "result-highest.json"),
                           str(TPU / "result-default.json")],
                          cwd=REPO, env=orchestrator_env(), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].endswith("result-highest.json: 206 of 206 checks pass under the current rule"), lines
    default_passed = sum(c["passed"] for c in recorded("result-default.json")["checks"])
    assert lines[1].endswith(f"result-default.json: {default_passed} of 212 checks pass under the current rule"), lines
    assert len(lines) == 2  # no row moved
    for name in ("result-highest.json", "result-default.json"):
        assert wanted(recorded(name), SPEC.tolerances.null_alpha) == {}


# ---------------------------------------------------------------- the TPU host's side, on the CPU


def test_pin_precision_overrides_configure_in_the_jax_environment():
    """tooling/devices/tpu_train.py's default-precision run: every configure() ends with JAX's own default (None)."""
    from support import run_in

    code = ("import jax, rosetta_jax; from tooling.devices.tpu_train import pin_precision; rosetta_jax.configure(0); "
            "a = jax.config.jax_default_matmul_precision; pin_precision(None); rosetta_jax.configure(0); "
            "print(a, jax.config.jax_default_matmul_precision)")
    done = run_in("jax", code, JAX_PLATFORMS="cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "highest None"


def test_slim_keeps_what_the_validator_reads(tmp_path):
    import numpy as np

    from rosetta_common.io import sha256
    from tooling.devices.tpu_train import slim

    run = tmp_path / "mlp"
    (run / "native").mkdir(parents=True)
    for name in ("init.onnx", "taps.npz", "native/params.msgpack", "model.onnx"):
        (run / name).write_bytes(name.encode())
    with open(run / "checkpoints.npz", "wb") as f:
        np.savez(f, **{"step1/w": np.ones(3), "replicate1/step1/w": np.zeros(3),
                       "replicate1/step_losses": np.arange(4.0)})
    recorded = {name: sha256(run / name) for name in ("init.onnx", "taps.npz", "native/params.msgpack",
                                                       "model.onnx", "checkpoints.npz")}
    (run / "export.json").write_text(json.dumps({"sha256": recorded}))
    for name in ("replicates.json", "replicates.npz"):  # the end-of-training replicates, written after export.json
        (run / name).write_bytes(name.encode())
    moved = slim(run)
    assert set(moved["left_on_host"]) == {"init.onnx", "taps.npz", "native/params.msgpack"}
    assert not (run / "native").exists() and (run / "model.onnx").is_file()
    assert all((run / name).read_bytes() == name.encode() for name in ("replicates.json", "replicates.npz"))
    with np.load(run / "checkpoints.npz") as f:
        assert sorted(f.files) == ["replicate1/step_losses", "step1/w"]
    rewritten = moved["rewritten"]["checkpoints.npz"]
    assert rewritten["export_sha256"] == recorded["checkpoints.npz"]
    assert rewritten["sha256"] == sha256(run / "checkpoints.npz")



def test_tpu_replicates_go_beside_the_run_and_the_judge_reads_them_there(tmp_path, monkeypatch):
    """tooling/devices/tpu_train.py trains the end-of-training replicates into the run's own folder (a fake backend: the
    stopping rule and the files are the replicates stage's), and tooling/devices/tpu_judge.py, in the validation
    environment, reads the TPU subject's from its run folder, tied to its step losses by their digest; a CPU run
    has none without artifacts/null_plan.json."""
    import contextlib
    import shutil
    from types import SimpleNamespace

    import numpy as np

    from pipelines.stages.common import Job
    from rosetta_common.interface import TrainResult
    from rosetta_common.training import plan
    from support import run_in
    from tooling.devices.tpu_train import train_replicates

    job_plan = plan(SPEC, "mlp", 4 * SPEC.train.batch_size)
    own = [1.0 / (1 + step) for step in range(job_plan.num_steps)]

    def train(model: dict, train_plan, data) -> TrainResult:  # even replicates part from the run at step 3
        losses = [x * (1.5 if step == 2 and train_plan.row_order % 2 == 0 else 1.0) for step, x in enumerate(own)]
        return TrainResult(step_losses=losses, epoch_losses=[losses[-1]], train_seconds=0.0)

    backend = SimpleNamespace(
        FRAMEWORK="jax", configure=lambda seed: None, build=lambda config, init: dict(init),
        from_canonical=lambda model, init: model.update(init), train=train, to_canonical=dict,
        predict=lambda model, x: np.eye(10)[np.arange(len(x)) % 10])
    data = SimpleNamespace(test_inputs=np.zeros((20, 4)), test_labels=np.arange(20) % 10)
    job = Job("mlp", None, {"dense1.weight": np.ones((4, 3), np.float32)}, job_plan, data)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "artifacts" / "jax" / "mlp"
    run.mkdir(parents=True)
    (run / "train_log.json").write_text(json.dumps({"step_losses": own}))
    phases: list[str] = []
    clock = SimpleNamespace(phase=lambda name: phases.append(name) or contextlib.nullcontext())
    train_replicates(backend, SPEC, job, clock)
    record = json.loads((run / "replicates.json").read_text())
    wanted = SPEC.replicates
    assert phases == ["mlp.replicates"]
    assert record["trained"] == min(2 * wanted.parted, wanted.at_most) and record["parted"] == min(
        wanted.parted, wanted.at_most // 2)
    # Packed and unpacked as its own subject; the default-precision copy's log is another run's.
    shutil.copytree(run, tmp_path / "artifacts" / "jax@tpu" / "mlp")
    other = tmp_path / "artifacts" / "jax@tpu-default" / "mlp"
    shutil.copytree(run, other)
    (other / "train_log.json").write_text(json.dumps({"step_losses": own[::-1]}))
    code = ("import json; from pipelines.checks.ledger import Ledger; from rosetta_common.spec import load_spec; "
            "from tooling.devices import tpu_judge as judge; "
            f"spec = load_spec({str(REPO / 'params.yaml')!r}); ledger = Ledger(); "
            "reps = [judge.subject_replicates(spec, ledger, 'mlp', s) for s in ('jax@tpu', 'jax@tpu-default')]; "
            "print(json.dumps([[None if r is None else len(r) for r in reps], "
            "[[c.subject, c.name, c.passed, c.detail] for c in ledger.checks], judge.planned_models()]))")
    done = run_in("validation", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    counts, checks, planned = json.loads(done.stdout.strip().splitlines()[-1])
    assert "mlp" in wanted.models and counts == [record["trained"], None]
    assert [c[:3] for c in checks] == [["jax@tpu-default", "replicates_readable", False]]
    assert "another run" in checks[0][3] and str(Path("artifacts/jax@tpu-default/mlp")) in checks[0][3]
    assert planned == [[], []]  # no null_plan.json nor null_interim.json: no CPU run's replicates are read


def test_cpu_nulls_too_thin_for_the_tpu_family_are_named_and_read_after_the_stages(tmp_path):
    """tooling/devices/tpu_null.py names, per CPU framework, the models whose tests against the TPU run cannot
    judge (a floor above Holm's threshold at its rank: three CPU points against six TPU ones, floor 1/84, in a
    family of eight) and not those whose groups allow a p below it (six and six: 1/462); tpu_judge, in the
    validation environment, reads a CPU run's replicates without such a folder as before, and stops in one line
    naming the folder where one is there but unreadable."""
    from support import run_in
    from tooling.devices.tpu_null import wanted

    def row(model: str, cpu: str, floor: float, groups: dict) -> dict:
        return {"model": model, "framework": f"{cpu}|jax@tpu", "check": "prediction_disagreement", "passed": False,
                "null": {"test": f"{model} prediction_disagreement {cpu}|jax@tpu", "p_value": 0.8, "floor": floor,
                         "groups": groups}}

    rows = [row("text_transformer", "torch", 1 / 84, {"torch": 3, "jax@tpu": 6}),
            row("text_transformer", "tf", 1 / 84, {"tf": 3, "jax@tpu": 6})]
    rows += [row(f"m{i}", "jax", 1 / 462, {"jax": 6, "jax@tpu": 6}) for i in range(6)]
    assert wanted({"checks": rows}, 0.05) == {"tf": ["text_transformer"], "torch": ["text_transformer"]}
    assert wanted({"checks": rows[2:]}, 0.05) == {}
    folder = tmp_path / "artifacts" / "jax@tpu-null" / "torch" / "cnn"
    folder.mkdir(parents=True)
    (tmp_path / "artifacts" / "torch" / "cnn").mkdir(parents=True)
    (tmp_path / "artifacts" / "torch" / "cnn" / "train_log.json").write_text(json.dumps({"step_losses": [1.0]}))
    code = ("from tooling.devices.tpu_judge import with_tpu_null; print(with_tpu_null('mlp', 'torch', None)); "
            "with_tpu_null('cnn', 'torch', None)")
    before = run_in("validation", code, cwd=tmp_path)
    assert before.stdout.strip().splitlines()[-1] == "None"
    (folder / "replicates.json").write_text("{}")
    done = run_in("validation", code, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith(
        f"error: {Path('artifacts/jax@tpu-null/torch/cnn')}: unreadable"), done.stderr
