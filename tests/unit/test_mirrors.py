"""The three framework packages read side by side (the report prints their model sources next to each other), so
each module mirrors its namesakes, read with `ast` (nothing imported):
- every package has the same modules and the same test modules;
- a public top-level name of a module (a function, class or assignment without a leading underscore) is defined in
  that module of all three packages, or of one only: that framework's own helper (TF's Keras layers, JAX's
  LayerNorm). A name in two of the three is a helper the third lacks or spells otherwise, and fails;
- the names all three define come in the same order in all three (in models.py: SHARED, the registry's order)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"torch": "rosetta_torch", "tf": "rosetta_tf", "jax": "rosetta_jax"}
# What every models.py defines at top level, in this order: the models as the registry lists them, each with its
# parts (the encoder's attention, MLP and block; the ResNet's BatchNorm momentum, conv, BatchNorm and blocks; the text
# model's masks and block), then the contract's functions and the training forward's.
SHARED = ["MLP", "CNN", "SelfAttention", "FeedForward", "EncoderBlock", "AttentionClassifier", "batchnorm_momentum",
          "conv", "batchnorm", "ConvBN", "ResidualBlock", "ResNet", "LSTMClassifier", "GRUClassifier", "padding_mask",
          "attention_mask", "masked_mean", "TextEncoderBlock", "TextTransformer", "create", "build", "model_config",
          "model_input", "predict", "training_view", "check_dropout_mask", "forward_logits", "forward_train"]
# Names these packages once used for the same things, one framework each: never again, in any module.
RETIRED = ["Block", "TextBlock", "key_padding_mask", "token_mask", "as_input", "EncoderLayer", "MLPBlock",
           "torch_momentum", "flax_batchnorm_momentum", "mlp", "cnn", "attention", "resnet", "lstm", "gru",
           "text_transformer"]


def source(framework: str, *parts: str) -> Path:
    return REPO / "packages" / f"{framework}_impl" / "src" / PACKAGES[framework] / Path(*parts)


MODULES = sorted(p.name for p in source("torch").glob("*.py"))


def top_level_names(path: Path) -> list[str]:
    """Every name `path` defines at top level (functions, classes, assigned names), in the order it defines them."""
    names: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(names))


def public_names(path: Path) -> list[str]:
    return [name for name in top_level_names(path) if not name.startswith("_")]


def mirror_problems(names: dict[str, list[str]]) -> list[str]:
    """What breaks the rule among one module's public names, per framework: a name two frameworks define and the
    third does not, and the names all three define in another order than torch's."""
    problems = []
    for name in dict.fromkeys(n for framework_names in names.values() for n in framework_names):
        holders = [framework for framework, defined in names.items() if name in defined]
        if len(holders) == 2:
            problems.append(f"{name}: defined in {' and '.join(holders)} only")
    everywhere = [name for name in names["torch"] if all(name in defined for defined in names.values())]
    for framework, defined in names.items():
        order = [name for name in defined if name in everywhere]
        if order != everywhere:
            problems.append(f"{framework}'s shared names in another order than torch's: {order} != {everywhere}")
    return problems


def module_names(module: str, **planted: Path) -> dict[str, list[str]]:
    """`module`'s public names in each package, a framework's file replaced by its `planted` copy."""
    return {framework: public_names(planted.get(framework, source(framework, module))) for framework in PACKAGES}


@pytest.mark.parametrize("module", MODULES)
def test_every_module_mirrors_its_namesakes(module: str) -> None:
    assert mirror_problems(module_names(module)) == []


@pytest.mark.parametrize("framework", PACKAGES)
def test_models_define_the_shared_names_in_one_order(framework: str) -> None:
    names = top_level_names(source(framework, "models.py"))
    assert [n for n in names if n in SHARED] == SHARED, names


@pytest.mark.parametrize("module", MODULES)
def test_no_module_uses_a_retired_name(module: str) -> None:
    for framework in PACKAGES:
        names = top_level_names(source(framework, module))
        assert not set(RETIRED) & set(names), (framework, set(RETIRED) & set(names))


def test_every_package_has_the_same_modules_and_test_modules() -> None:
    modules = {fw: sorted(p.name for p in source(fw).glob("*.py")) for fw in PACKAGES}
    tests = {fw: sorted(p.name for p in (REPO / "packages" / f"{fw}_impl" / "tests").glob("*.py")) for fw in PACKAGES}
    assert modules["torch"] == modules["tf"] == modules["jax"], modules
    assert tests["torch"] == tests["tf"] == tests["jax"], tests
    assert {"__init__.py", "distributed.py", "export.py", "models.py", "serve.py", "taps.py", "train.py",
            "weights.py"} <= set(MODULES), MODULES


def plant(tmp_path: Path, framework: str, module: str, old: str, new: str) -> Path:
    """A copy of `framework`'s `module` with `old` (there once) replaced by `new`."""
    text = source(framework, module).read_text()
    assert text.count(old) == 1, old
    planted = tmp_path / f"{framework}_{module}"
    planted.write_text(text.replace(old, new))
    return planted


def test_the_check_fails_on_a_renamed_helper(tmp_path: Path) -> None:
    """A models.py with one shared helper under another framework's old name is caught."""
    planted = plant(tmp_path, "torch", "models.py", "def padding_mask(", "def key_padding_mask(")
    names = top_level_names(planted)
    assert [n for n in names if n in SHARED] != SHARED and "key_padding_mask" in names
    assert mirror_problems(module_names("models.py", torch=planted))


def test_the_rule_fails_on_a_name_in_two_of_three(tmp_path: Path) -> None:
    """torch's training loop named as JAX's epoch loop is (run_epochs): two packages of three define it."""
    planted = plant(tmp_path, "torch", "train.py", "def train_module(", "def run_epochs(")
    assert mirror_problems(module_names("train.py", torch=planted)) == ["run_epochs: defined in torch and jax only"]
    # A one-framework helper made private in one of two is the same mistake the other way round.
    planted = plant(tmp_path, "tf", "models.py", "def forward_logits(", "def _forward_logits(")
    problems = mirror_problems(module_names("models.py", tf=planted))
    assert problems == ["forward_logits: defined in torch and jax only"], problems


def test_the_rule_fails_on_shared_names_in_another_order(tmp_path: Path) -> None:
    """JAX's stop_worker defined before train_data_parallel, where torch and TF define it after."""
    text = source("jax", "distributed.py").read_text()
    tree = ast.parse(text)
    stop = next(node for node in tree.body if getattr(node, "name", "") == "stop_worker")
    segment = ast.get_source_segment(text, stop) + "\n\n\n"
    swapped = text.replace(segment, "").replace("def train_data_parallel(", segment + "def train_data_parallel(")
    planted = tmp_path / "distributed.py"
    planted.write_text(swapped)
    assert public_names(planted) != public_names(source("jax", "distributed.py"))
    problems = mirror_problems(module_names("distributed.py", jax=planted))
    assert len(problems) == 1 and problems[0].startswith("jax's shared names in another order"), problems
