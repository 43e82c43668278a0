"""The validate stage localizes a porting mistake in one framework's model code to the layer where it enters, for
real: in a copy of the session's finished TINY run, a mistake is planted in one layer of one framework's model
code (the plants of packages/*/tests/test_taps.py, written into the copy's source), only that framework's
train_export reruns for that model, and validate runs once. It must fail, and every failing check the taps
explain (init_taps_vs_reference, init_onnx_vs_reference, forward_parity_init_onnx, and the lockstep checks) of
a comparison with the planted framework must name the planted layer's tap as the first divergent one; the other
frameworks' taps must still agree with the reference. Plants in different models share one validate run (each
judged on its own model's rows), as in test_validate_failures.py.

Two mistakes change no init forward (the init biases are zero, the init running statistics 0 and 1): torch's
BatchNorm given the spec's momentum instead of 1 minus it moves only the running statistics, and torch's LSTM
bias counted twice (both of torch's biases given the canonical one, both trained) moves the bias twice as fast.
They show in the trained models, so their checks are the end-of-training ones of each pair with torch, which
must name the tap where the pair's trained taps part: the first BatchNorm's, the LSTM's cell state."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.checks import ledger as names
from support import TinyRun, retrain_and_validate
from support.planted import Validated, shared_round


@dataclass(frozen=True)
class Plant:
    id: str
    framework: str
    model: str
    source: str  # the model code, relative to the repository
    old: str  # the text the mistake replaces (must occur exactly once)
    new: str
    enters: str  # the tap where the mistake enters
    also: tuple[tuple[str, str, str], ...] = ()  # further edits of the same mistake: (source, old, new)

    def plant(self, root: Path) -> None:
        for source, old, new in [(self.source, self.old, self.new), *self.also]:
            path = root / source
            text = path.read_text()
            assert text.count(old) == 1, f"{self.id}: {old!r} is not in {source} exactly once"
            path.write_text(text.replace(old, new))


PLANTS = [
    # torch's padding=1 where the spec pads as TensorFlow does ("same", the extra row/column at the bottom and
    # right): the 3x3 stem (stride 1) and the 1x1 shortcut pad alike, the stride-2 conv1 does not.
    Plant("torch-resnet-symmetric-padding", "torch", "resnet", "packages/torch_impl/src/rosetta_torch/models.py",
          "from rosetta_common.reference import same_padding\n",
          "def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:  # planted\n"
          "    return (kernel - 1) // 2, (kernel - 1) // 2\n", "block.conv1"),
    # nnx.gelu's default, the tanh approximation, where the spec is exact (erf).
    Plant("jax-attention-tanh-gelu", "jax", "attention", "packages/jax_impl/src/rosetta_jax/models.py",
          "nnx.gelu(self.fc1(x), approximate=False)", "nnx.gelu(self.fc1(x), approximate=True)", "block.mlp.gelu"),
    # Keras' BatchNormalization left at its default epsilon (1e-3; the spec's is 1e-5).
    Plant("tf-resnet-batchnorm-epsilon", "tf", "resnet", "packages/tf_impl/src/rosetta_tf/models.py",
          "epsilon=settings.batchnorm_epsilon,", "", "stem.bn"),
    # torch's LSTM gate blocks mapped i, f exchanged (weights.py's GATE_ORDER): the first step's cell state,
    # i * g, is already f * g.
    Plant("torch-lstm-gate-order", "torch", "lstm", "packages/torch_impl/src/rosetta_torch/weights.py",
          'GATE_ORDER: dict[str, tuple[int, ...]] = {"lstm": (0, 1, 2, 3), "gru": (0, 1, 2)}',
          'GATE_ORDER: dict[str, tuple[int, ...]] = {"lstm": (1, 0, 2, 3), "gru": (0, 1, 2)}', "lstm.cell"),
    # The query kernel copied into nn.Linear untransposed, as Keras and Flax keep it: square (embed, embed), so
    # load_state_dict's shape check passes.
    Plant("torch-attention-query-kernel-transposed", "torch", "attention",
          "packages/torch_impl/src/rosetta_torch/weights.py",
          '    if name.endswith("kernel"):  # .kernel and .recurrent_kernel\n',
          '    if name == "block.attn.query.kernel":  # planted\n        return value\n'
          '    if name.endswith("kernel"):  # .kernel and .recurrent_kernel\n', "block.attn.query"),
    # The scores scaled by the model's width instead of the head's: 1 / sqrt(embed_dim) for 1 / sqrt(head_dim), in
    # the method TF's attention computes its weights with, whose output is the tap.
    Plant("tf-attention-scale", "tf", "attention", "packages/tf_impl/src/rosetta_tf/models.py",
          "/ math.sqrt(self.head_dim)", "/ math.sqrt(self.embed_dim)", "block.attn.weights"),
]
# Mistakes no init forward shows, named at the first tap where the pair's TRAINED taps part (the init biases are
# zero and the init running statistics 0 and 1, so a bias mapping or a momentum convention changes nothing there).
TRAINED_PLANTS = [
    # torch's BatchNorm momentum given the spec's number (the old average's weight) where torch's means the new
    # batch's: inference mode and training losses are unchanged (training normalizes by the batch's
    # statistics), only the running statistics are not.
    Plant("torch-resnet-batchnorm-momentum", "torch", "resnet", "packages/torch_impl/src/rosetta_torch/models.py",
          "    return 1.0 - momentum\n", "    return momentum\n", "stem.bn"),
    # torch's bias counted twice: bias_ih and bias_hh both given the canonical bias, both trained (torch's
    # default), so their sum moves twice as fast; the losses part at step 2.
    Plant("torch-lstm-bias-counted-twice", "torch", "lstm", "packages/torch_impl/src/rosetta_torch/weights.py",
          "    return bias, np.zeros_like(bias)\n", "    return bias, bias\n", "lstm.cell",
          also=(("packages/torch_impl/src/rosetta_torch/models.py",
                 "        self.lstm.bias_hh_l0.requires_grad_(False)\n", ""),)),
]
# A mapping wrong only on the way out of a framework: its trained model is right, its trained canonical file is
# not. Named at the first tap where the framework's trained taps leave the reference run on that file.
EXPORT_PLANTS = [
    # Keras' (2, 3h) GRU bias read with its rows exchanged (the input bias taken for the recurrent one): the init
    # biases are zero, so loading them is unaffected, and Keras trains its own layout correctly.
    Plant("tf-gru-bias-rows-exchanged", "tf", "gru", "packages/tf_impl/src/rosetta_tf/weights.py",
          'GRU_BIAS_ROWS = {"input_bias": 0, "recurrent_bias": 1}',
          'GRU_BIAS_ROWS = {"input_bias": 1, "recurrent_bias": 0}', "gru.hidden"),
]
LOCKSTEP_KEPT = {"torch-resnet-batchnorm-momentum"}  # the trained plants whose training losses do not change
# One validate run per round: plants of different models share one (and a framework's plants one train_export).
# Three rounds, as few as there can be: ResNet and attention have three plants each.
ROUNDS = [["torch-resnet-symmetric-padding", "jax-attention-tanh-gelu", "torch-lstm-gate-order"],
          ["tf-resnet-batchnorm-epsilon", "torch-attention-query-kernel-transposed", "torch-lstm-bias-counted-twice"],
          ["torch-resnet-batchnorm-momentum", "tf-attention-scale", "tf-gru-bias-rows-exchanged"]]
BY_ID = {p.id: p for p in [*PLANTS, *TRAINED_PLANTS, *EXPORT_PLANTS]}
ROUND_OF = {plant: i for i, ids in enumerate(ROUNDS) for plant in ids}
# The checks that compare the planted framework's forward with the reference or another framework's at init,
# and the lockstep checks, which the init taps explain: each must fail and name the planted tap.
MUST_FAIL = (names.INIT_TAPS_VS_REFERENCE, names.INIT_ONNX_VS_REFERENCE, names.FORWARD_PARITY_INIT_ONNX)


def validate_round(tiny: TinyRun, root: Path, plants: list[Plant]) -> Validated:
    """A fresh copy of the finished run with the round's plants in its source, each planted framework's
    train_export rerun for its model alone, then validate once."""
    shutil.copytree(tiny.root, root, symlinks=True)
    # No end-of-training replicates for the planted models: they judge end-of-training figures, which these
    # tests do not look at.
    params = yaml.safe_load((root / "params.yaml").read_text())
    planted = {plant.model for plant in plants}
    params["replicates"]["models"] = [m for m in params["replicates"]["models"] if m not in planted]
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    planted_models: dict[str, list[str]] = {}
    for plant in plants:
        plant.plant(root)
        planted_models.setdefault(plant.framework, []).append(plant.model)
    result = retrain_and_validate(root, tiny.env, planted_models)
    report = json.loads((root / "reports/validation.json").read_text())
    output = f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr}"
    return Validated(result.returncode, output, report["checks"], report["training_parity"],
                     {t["model"]: t for t in report["taps"]}, root)


def round_run(tiny: TinyRun, planted_runs: Path, plant_id: str) -> Validated:
    """The validate run of the round that holds `plant_id`, made on first use (conftest's planted_runs: also
    test_planted_porting_bugs.py's, for the mistakes both files plant)."""
    index = ROUND_OF[plant_id]
    return shared_round(planted_runs, f"taps_round{index}",
                        lambda root: validate_round(tiny, root, [BY_ID[i] for i in ROUNDS[index]]))


@pytest.fixture(scope="module")
def validated(tiny_pipeline: TinyRun, planted_runs: Path) -> Any:
    """Each round's validate run, made on first use and shared by the round's plants."""
    return lambda plant: round_run(tiny_pipeline, planted_runs, plant.id)


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.id)
def test_validate_names_the_layer_a_planted_mistake_enters_at(plant: Plant, validated: Any) -> None:
    run = validated(plant)
    assert run.returncode != 0, run.output
    own = [r for r in run.rows if r["model"] == plant.model]
    failed = {(r["framework"], r["check"]): r for r in own if not r["passed"]}
    with_it = [key for key in failed if plant.framework in key[0].split("|")]
    named = f"first divergent tap {plant.enters} "
    # The forward checks that compare the planted framework at init fail: against the reference, and every pair.
    pairs = sorted({r["framework"] for r in own if r["check"] == names.FORWARD_PARITY_INIT_ONNX
                    and plant.framework in r["framework"].split("|")})
    assert len(pairs) == 2, pairs
    for subject, check in [*((plant.framework, c) for c in MUST_FAIL if c != names.FORWARD_PARITY_INIT_ONNX),
                           *((pair, names.FORWARD_PARITY_INIT_ONNX) for pair in pairs)]:
        assert (subject, check) in failed, (subject, check, run.output)
    # Every failing check the taps explain, of a comparison with the planted framework, names its tap.
    # (ONNX against native is not among them: the planted native model and its ONNX export agree.)
    explained = [key for key in with_it if key[1] in names.TAP_LOCALIZED]
    assert len(explained) >= 4, failed
    for key in explained:
        assert named in failed[key]["detail"], (key, failed[key]["detail"])
    # The other frameworks' taps still agree with the reference: the mistake is localized to its framework.
    others = {r["framework"] for r in own if r["check"] == names.INIT_TAPS_VS_REFERENCE} - {plant.framework}
    assert len(others) == 2, others
    for fw in sorted(others):
        row = next(r for r in own if (r["framework"], r["check"]) == (fw, names.INIT_TAPS_VS_REFERENCE))
        assert row["passed"], row
    # validation.json's figures say the same: the planted framework leaves the reference at that tap.
    assert_enters(run.taps[plant.model]["init"]["vs_reference"][plant.framework], plant.enters)


def assert_enters(record: dict[str, Any], tap: str | None) -> None:
    """One comparison of validation.json's taps parts first at `tap` (None: at none): every tap before it within
    the tolerance, that one over it."""
    assert record["first_divergent"] == tap, record
    taps, tolerance = record["taps"], record["tolerance"]
    at = [t["tap"] for t in taps].index(tap) if tap is not None else len(taps)
    assert all(t["max_abs"] <= tolerance for t in taps[:at]), taps
    assert tap is None or taps[at]["max_abs"] > tolerance, taps


INIT_FORWARD = (names.INIT_TAPS_VS_REFERENCE, names.INIT_ONNX_VS_REFERENCE, names.INIT_ONNX_VS_NATIVE,
                names.FORWARD_PARITY_INIT_ONNX, names.TRAIN_STEP1_LOSS_REL)


def failed_with_init_forward_intact(plant: Plant, validated: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Validate the planted copy: it fails, and every init-forward check of the planted model passes (a mistake only
    training or a trained file shows leaves the init forward alone). Returns the run and that model's rows."""
    run = validated(plant)
    assert run.returncode != 0, run.output
    own = [r for r in run.rows if r["model"] == plant.model]
    for check in INIT_FORWARD:
        rows = [r for r in own if r["check"] == check]
        assert len(rows) >= 3 and all(r["passed"] for r in rows), rows
    return run, own


@pytest.mark.parametrize("plant", TRAINED_PLANTS, ids=lambda p: p.id)
def test_validate_names_the_first_divergent_trained_tap_of_a_mistake_only_training_shows(plant: Plant,
                                                                                        validated: Any) -> None:
    # Nothing of the init forward changes, nor the first step's loss (the same init forward).
    run, own = failed_with_init_forward_intact(plant, validated)
    every_pair = {r["framework"] for r in own if r["check"] == names.TEST_LOSS_REL}
    pairs = sorted(pair for pair in every_pair if plant.framework in pair.split("|"))
    assert len(every_pair) == 3 and len(pairs) == 2, every_pair
    # The training losses stay in lockstep, or they part and the lockstep check says that the forwards agree, so
    # the difference is in training.
    lockstep = [r for r in own if r["check"] == names.TRAIN_LOCKSTEP_LOSS_REL and r["framework"] in pairs]
    assert len(lockstep) == 2, lockstep
    for row in lockstep:
        if plant.id in LOCKSTEP_KEPT:
            assert row["passed"], row
        else:
            assert not row["passed"] and "so the difference is in training" in row["detail"], row
    # Every failing end-of-training check of a pair with the planted framework names the first tap where the
    # pair's trained taps part (the running statistics among them, for the momentum).
    for pair in pairs:
        failing = [r for r in own if r["framework"] == pair and not r["passed"]
                   and r["check"] in names.END_OF_TRAINING_PAIR]
        assert len(failing) >= 2, (pair, failing, run.output)
        if plant.model == "resnet":
            assert {names.statistic_check(s) for s in names.RUNNING_STATISTICS} <= {r["check"] for r in failing}
        for row in failing:
            assert f"trained taps of {pair}: first divergent tap {plant.enters} " in row["detail"], row
    # The other pair's trained models agree: every check of it passes.
    (other,) = every_pair - set(pairs)
    others = [r for r in own if r["framework"] == other]
    assert len(others) >= 5 and all(r["passed"] for r in others), others
    # validation.json's figures: each pair with the planted framework parts at that tap after training, not at
    # init; the other pair never; and the planted framework's own trained forward agrees with the reference on
    # its own trained weights (its forward is right: what training made of its state is not).
    record = run.taps[plant.model]
    for pair in pairs:
        assert_enters(record["init"]["pairs"][pair], None)
        assert_enters(record["trained"]["pairs"][pair], plant.enters)
    assert_enters(record["trained"]["pairs"][other], None)
    assert_enters(record["trained"]["vs_reference"][plant.framework], None)


@pytest.mark.parametrize("plant", EXPORT_PLANTS, ids=lambda p: p.id)
def test_validate_names_the_first_tap_a_wrong_trained_file_leaves_its_framework_at(plant: Plant,
                                                                                 validated: Any) -> None:
    run, own = failed_with_init_forward_intact(plant, validated)  # nothing of the init forward changes
    # The planted framework's trained file is not its trained model, and the check says at which layer; the other
    # frameworks' files are theirs.
    rows = {r["framework"]: r for r in own if r["check"] == names.TRAINED_WEIGHTS_VS_NATIVE}
    assert set(rows) == {"torch", "tf", "jax"}, rows
    assert not rows[plant.framework]["passed"], rows[plant.framework]
    assert f"first divergent tap {plant.enters} " in rows[plant.framework]["detail"], rows[plant.framework]
    assert all(row["passed"] for fw, row in rows.items() if fw != plant.framework), rows
    record = run.taps[plant.model]["trained"]["vs_reference"]
    assert_enters(record[plant.framework], plant.enters)
