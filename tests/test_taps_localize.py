"""The validate stage localizes a porting mistake in one framework's model code to the layer where it enters, for
real: in a copy of the session's finished TINY run, a mistake is planted in one layer of one framework's model
code (the plants of packages/*/tests/test_taps.py, written into the copy's source), only that framework's
train_export reruns for that model, and validate runs once. It must fail, and every failing check the taps
explain (init_taps_vs_reference, init_onnx_vs_reference, forward_parity_init_onnx, and the lockstep checks) of
a comparison with the planted framework must name the planted layer's tap as the first divergent one; the other
frameworks' taps must still agree with the reference. Plants in different models share one validate run (each
judged on its own model's rows), as in test_validate_failures.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.checks import ledger as names
from support import VALIDATE, TinyRun, sh


@dataclass(frozen=True)
class Plant:
    id: str
    framework: str
    model: str
    source: str  # the model code, relative to the repository
    old: str  # the text the mistake replaces (must occur exactly once)
    new: str
    enters: str  # the tap where the mistake enters

    def plant(self, root: Path) -> None:
        path = root / self.source
        text = path.read_text()
        assert text.count(self.old) == 1, f"{self.id}: {self.old!r} is not in {self.source} exactly once"
        path.write_text(text.replace(self.old, self.new))


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
]
# One validate run per round: plants of different models share one (torch's and tf's resnet plants cannot).
ROUNDS = [["torch-resnet-symmetric-padding", "jax-attention-tanh-gelu"], ["tf-resnet-batchnorm-epsilon"]]
BY_ID = {p.id: p for p in PLANTS}
ROUND_OF = {plant: i for i, ids in enumerate(ROUNDS) for plant in ids}
# The checks that compare the planted framework's forward with the reference or another framework's at init,
# and the lockstep checks, which the init taps explain: each must fail and name the planted tap.
MUST_FAIL = (names.INIT_TAPS_VS_REFERENCE, names.INIT_ONNX_VS_REFERENCE, names.FORWARD_PARITY_INIT_ONNX)


@dataclass(frozen=True)
class Validated:
    returncode: int
    output: str
    rows: list[dict[str, Any]]
    taps: dict[str, dict[str, Any]]  # validation.json's "taps", by model


def validate_round(tiny: TinyRun, root: Path, plants: list[Plant]) -> Validated:
    """A fresh copy of the finished run with the round's plants in its source, each planted framework's
    train_export rerun for its model alone, then validate once."""
    shutil.copytree(tiny.root, root, symlinks=True)
    # No one-ulp replicates for the planted models: they judge end-of-training figures, which these tests do not
    # look at, and would train each planted model replicates.count more times.
    params = yaml.safe_load((root / "params.yaml").read_text())
    planted = {plant.model for plant in plants}
    params["replicates"]["models"] = [m for m in params["replicates"]["models"] if m not in planted]
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for plant in plants:
        plant.plant(root)
        sh(["python", "-m", "pipelines.runner", plant.framework, "--", "python", "-m", "pipelines.stages.train_export",
            plant.framework, plant.model], root, tiny.env)
    result = sh(VALIDATE, root, tiny.env, check=False)
    report = json.loads((root / "reports/validation.json").read_text())
    output = f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return Validated(result.returncode, output, report["checks"], {t["model"]: t for t in report["taps"]})


@pytest.fixture(scope="module")
def validated(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Each round's validate run, made on first use and shared by the round's plants."""
    done: dict[int, Validated] = {}

    def get(plant: Plant) -> Validated:
        index = ROUND_OF[plant.id]
        if index not in done:
            root = tmp_path_factory.mktemp(f"taps_round{index}") / "repo"
            done[index] = validate_round(tiny_pipeline, root, [BY_ID[i] for i in ROUNDS[index]])
        return done[index]

    return get


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
    record = run.taps[plant.model]["init"]
    assert record["vs_reference"][plant.framework]["first_divergent"] == plant.enters
    taps = record["vs_reference"][plant.framework]["taps"]
    at = [t["tap"] for t in taps].index(plant.enters)
    tolerance = record["vs_reference"][plant.framework]["tolerance"]
    assert all(t["max_abs"] <= tolerance for t in taps[:at]) and taps[at]["max_abs"] > tolerance, taps

