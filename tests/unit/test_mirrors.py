"""The three framework packages read side by side (the report prints their model sources next to each other): the
same module names, the same test modules, and in each models.py one name per shared thing, in the same order.
A helper only one framework needs (TF's Keras layers, JAX's custom LayerNorm) is its own; a name for something
all three have is the same in all three. Read with `ast`: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"torch": "rosetta_torch", "tf": "rosetta_tf", "jax": "rosetta_jax"}
# What every models.py defines at top level, in this order: the models as the spec lists them, the text model's
# masks and block, then the contract's functions.
SHARED = ["SelfAttention", "EncoderBlock", "padding_mask", "attention_mask", "masked_mean", "create", "build",
          "model_config", "model_input", "predict", "check_dropout_mask", "forward_train"]
# Names these packages once used for the same things, one framework each: never again.
RETIRED = ["Block", "TextBlock", "key_padding_mask", "token_mask", "as_input", "EncoderLayer"]


def top_level_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]


def source(framework: str, *parts: str) -> Path:
    return REPO / "packages" / f"{framework}_impl" / "src" / PACKAGES[framework] / Path(*parts)


@pytest.mark.parametrize("framework", PACKAGES)
def test_models_define_the_shared_names_in_one_order(framework: str) -> None:
    names = top_level_names(source(framework, "models.py"))
    assert [n for n in names if n in SHARED] == SHARED, names
    assert not set(RETIRED) & set(names), set(RETIRED) & set(names)


def test_text_models_share_their_block_names() -> None:
    """The text encoder's block: TextEncoderBlock where a framework defines a class for it (TF builds it from
    functional layers, EncoderBlock reused)."""
    for framework in ("torch", "jax"):
        assert "TextEncoderBlock" in top_level_names(source(framework, "models.py")), framework


def test_every_package_has_the_same_modules_and_test_modules() -> None:
    modules = {fw: sorted(p.name for p in source(fw).glob("*.py")) for fw in PACKAGES}
    tests = {fw: sorted(p.name for p in (REPO / "packages" / f"{fw}_impl" / "tests").glob("*.py")) for fw in PACKAGES}
    assert modules["torch"] == modules["tf"] == modules["jax"], modules
    assert tests["torch"] == tests["tf"] == tests["jax"], tests


def test_the_check_fails_on_a_renamed_helper(tmp_path: Path) -> None:
    """A models.py with one shared helper under another framework's old name is caught."""
    text = source("torch", "models.py").read_text().replace("def padding_mask(", "def key_padding_mask(")
    (tmp_path / "models.py").write_text(text)
    names = top_level_names(tmp_path / "models.py")
    assert [n for n in names if n in SHARED] != SHARED and "key_padding_mask" in names
