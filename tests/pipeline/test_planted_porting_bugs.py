"""The judge against the porting bugs users make, for real: in a copy of the session's finished TINY run, one
framework's code gets one mistake (its text replaced in the copy's source), that framework's train_export reruns
for the model it is planted in (with its replicates and lockstep checkpoints, as params.yaml asks), and
validate runs. It must exit non-zero and fail the named check for both pairs with the planted framework, and
every check of the third pair must pass. The unplanted tiny run passes validate (test_pipeline_e2e.py).

Each mistake changes something the frameworks compute alike while their runs are in lockstep, so a float32 bound
catches it before the runs part and chaos hides it (a lockstep figure beyond it is judged against the
replicates' checkpoints, which every mistake here exceeds by orders of magnitude, or, where too few replicates
make the null unable to judge, the bound stands):
- torch's BatchNorm given the spec's momentum, and torch's unbiased running variance left uncorrected: training
  losses unchanged (training normalizes by the batch's statistics); the running statistics at the lockstep
  checkpoints (lockstep_running_stats_rel) part at once;
- Keras' BatchNormalization at its default epsilon (1e-3 for the spec's 1e-5): the init forward;
- an L2 weight decay of 1e-4 in one framework's optimizer: the step-1 loss is the same forward; the weights at
  the checkpoints are not (a weight with no gradient, an always-blank pixel's, moves by the learning rate a step);
- dropout scaled by 1 / (1 - 0.25) for 1 / (1 - 0.2), and label smoothing 0.1 in the loss: the step-1 loss;
- the learning rate multiplied by 1.01 after epoch 5 (the copy trains that model 7 epochs, in every framework):
  after the lockstep window and the checkpoints, so the runs part at epoch 6's second step (measured: 222, with
  44 steps an epoch) and the mlp, which has no replicates, fails its end-of-training test loss (1.7e-3 relative
  against 1e-3, measured): the thinnest margin of the seven.
Plants in different models and frameworks share one validate run (each judged on its own model's rows only), as
in test_taps_localize.py; a round has at most one plant per framework, so no plant reaches another's model. Two of
these mistakes are also test_taps_localize.py's plants, the same edit (torch's momentum, Keras' epsilon): they are
judged here on the validate run of that file's round (a copy with its plants in other models, each framework's
planted model untouched by the others' plants), made once for both files (conftest.py's planted_runs)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_taps_localize import BY_ID as TAPS_BY_ID
from test_taps_localize import round_run

from pipelines.checks import ledger as names
from support import TinyRun, retrain_and_validate
from support.planted import Validated, shared_round

TORCH_MODELS = "packages/torch_impl/src/rosetta_torch/models.py"
TORCH_TRAIN = "packages/torch_impl/src/rosetta_torch/train.py"
TF_MODELS = "packages/tf_impl/src/rosetta_tf/models.py"
JAX_MODELS = "packages/jax_impl/src/rosetta_jax/models.py"
JAX_TRAIN = "packages/jax_impl/src/rosetta_jax/train.py"
FORWARD_AT_INIT = names.FORWARD_PARITY_INIT_ONNX


@dataclass(frozen=True)
class Bug:
    id: str
    framework: str
    model: str
    source: str
    old: str  # must occur exactly once
    new: str
    fails: str | None  # the check that must fail for both pairs with the planted framework (None: any check)
    epochs: int | None = None  # the copy trains the model this long, in every framework (None: as the tiny run)

    def plant(self, root: Path) -> None:
        path = root / self.source
        text = path.read_text()
        assert text.count(self.old) == 1, f"{self.id}: {self.old!r} is not in {self.source} exactly once"
        path.write_text(text.replace(self.old, self.new))


# In the order their rounds are made: this file's own rounds first, then the two it shares with
# test_taps_localize.py (which that file, on another worker, has made by then or is making).
BUGS = [
    Bug("torch-running-variance-unbiased", "torch", "resnet", TORCH_MODELS,
        "            self.running_var = corrected_running_var(", "            _ = corrected_running_var(",
        names.LOCKSTEP_RUNNING_STATS_REL),
    Bug("jax-l2-weight-decay", "jax", "mlp", JAX_TRAIN, "        return torch_adam(optimizer, num_steps)\n",
        "        return optax.chain(optax.add_decayed_weights(1e-4), torch_adam(optimizer, num_steps))\n",
        names.LOCKSTEP_WEIGHTS_REL),
    Bug("torch-label-smoothing", "torch", "mlp", TORCH_TRAIN,
        "F.cross_entropy(forward_logits(module, inputs[idx_t], mask), labels[idx_t])",
        "F.cross_entropy(forward_logits(module, inputs[idx_t], mask), labels[idx_t], label_smoothing=0.1)",
        names.TRAIN_STEP1_LOSS_REL),
    Bug("jax-dropout-scale", "jax", "resnet", JAX_MODELS, "pooled * dropout_mask",
        "pooled * dropout_mask * (0.8 / 0.75)", names.TRAIN_STEP1_LOSS_REL),
    Bug("torch-learning-rate-after-epoch-5", "torch", "mlp", TORCH_TRAIN,
        "            epoch_start = time.perf_counter()\n",
        "            epoch_start = time.perf_counter()\n"
        "            if epoch == 5:\n"
        "                for group in optimizer.param_groups:\n"
        "                    group[\"lr\"] *= 1.01\n",
        names.TEST_LOSS_REL, epochs=7),
    Bug("torch-batchnorm-momentum", "torch", "resnet", TORCH_MODELS,
        "    return 1.0 - momentum\n", "    return momentum\n", names.LOCKSTEP_RUNNING_STATS_REL),
    Bug("tf-batchnorm-default-epsilon", "tf", "resnet", TF_MODELS, "epsilon=settings.batchnorm_epsilon,", "",
        FORWARD_AT_INIT),
]
BY_ID = {bug.id: bug for bug in BUGS}
# The mistakes test_taps_localize.py plants with the same edit, judged on its round: bug -> its plant there.
IN_TAPS_ROUNDS = {"torch-batchnorm-momentum": "torch-resnet-batchnorm-momentum",
                  "tf-batchnorm-default-epsilon": "tf-resnet-batchnorm-epsilon"}
# The others: at most one plant per framework and one per model in a round.
ROUNDS = [["torch-running-variance-unbiased", "jax-l2-weight-decay"],
          ["torch-label-smoothing"],
          ["jax-dropout-scale", "torch-learning-rate-after-epoch-5"]]
ROUND_OF = {bug: i for i, ids in enumerate(ROUNDS) for bug in ids}
assert set(ROUND_OF) | set(IN_TAPS_ROUNDS) == set(BY_ID) and not set(ROUND_OF) & set(IN_TAPS_ROUNDS)


def test_the_bugs_judged_on_the_taps_rounds_are_their_plants_edit_for_edit() -> None:
    for bug_id, plant_id in IN_TAPS_ROUNDS.items():
        bug, plant = BY_ID[bug_id], TAPS_BY_ID[plant_id]
        assert (bug.framework, bug.model, bug.source, bug.old, bug.new, bug.epochs) == \
            (plant.framework, plant.model, plant.source, plant.old, plant.new, None) and not plant.also, bug_id


def validate_round(tiny: TinyRun, root: Path, bugs: list[Bug]) -> Validated:
    """A fresh copy of the finished run with the round's bugs in its source; each planted model retrained (by its
    framework with the bug, by the others too where the copy trains it longer), then validate once."""
    assert len({b.framework for b in bugs}) == len(bugs) and len({b.model for b in bugs}) == len(bugs), bugs
    shutil.copytree(tiny.root, root, symlinks=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    retrain: dict[str, list[str]] = {}
    for bug in bugs:
        bug.plant(root)
        retrain.setdefault(bug.framework, []).append(bug.model)
        if bug.epochs is not None:
            epochs = params["train"]["epochs"]
            params["train"]["epochs"] = {**dict.fromkeys(params["models"], epochs), bug.model: bug.epochs} \
                if isinstance(epochs, int) else {**epochs, bug.model: bug.epochs}
            for fw in params["frameworks"]:
                if bug.model not in retrain.setdefault(fw, []):
                    retrain[fw].append(bug.model)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = retrain_and_validate(root, tiny.env, retrain)
    report = json.loads((root / "reports/validation.json").read_text())
    output = f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr}"
    return Validated(result.returncode, output, report["checks"], report["training_parity"],
                     {t["model"]: t for t in report["taps"]}, root)


@pytest.fixture(scope="module")
def validated(tiny_pipeline: TinyRun, planted_runs: Path) -> Any:
    """Each round's validate run, made on first use and shared by the round's bugs (a bug also planted by
    test_taps_localize.py: that file's round, made once for both)."""

    def get(bug: Bug) -> Validated:
        if bug.id in IN_TAPS_ROUNDS:
            return round_run(tiny_pipeline, planted_runs, IN_TAPS_ROUNDS[bug.id])
        index = ROUND_OF[bug.id]
        return shared_round(planted_runs, f"bugs_round{index}",
                            lambda root: validate_round(tiny_pipeline, root, [BY_ID[i] for i in ROUNDS[index]]))

    return get


@pytest.mark.parametrize("bug", BUGS, ids=lambda b: b.id)
def test_validate_fails_a_planted_porting_bug(bug: Bug, validated: Any) -> None:
    run = validated(bug)
    assert run.returncode != 0, run.output
    own = [r for r in run.rows if r["model"] == bug.model]
    assert f"FAILED {bug.model}/" in run.output, run.output
    pairs = sorted({r["framework"] for r in own if r["check"] == names.TRAIN_STEP1_LOSS_REL})
    assert len(pairs) == 3, pairs
    planted = [p for p in pairs if bug.framework in p.split("|")]
    (other,) = set(pairs) - set(planted)
    for pair in planted:
        if bug.fails is None:
            assert any(not r["passed"] for r in own if r["framework"] == pair), (pair, run.output)
            continue
        rows = [r for r in own if r["framework"] == pair and r["check"] == bug.fails]
        assert len(rows) == 1 and not rows[0]["passed"], (pair, rows, run.output)
        assert rows[0]["value"] > rows[0]["tolerance"], rows[0]
    if bug.epochs is not None:  # a mistake from epoch 6 on: the runs with it part there, not before
        steps = {f["frameworks"]: f["parting_step"] for f in run.parity if f["model"] == bug.model}
        log = run.root / "artifacts" / bug.framework / bug.model / "train_log.json"
        per_epoch = json.loads(log.read_text())["steps_per_epoch"]
        assert all(steps[p] is not None and steps[p] > 5 * per_epoch for p in planted), (steps, per_epoch)
    # The pair without the planted framework is untouched: every check of it passes.
    others = [r for r in own if r["framework"] == other]
    assert len(others) >= 6 and all(r["passed"] for r in others), [r for r in others if not r["passed"]]
