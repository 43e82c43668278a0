"""The architecture registry: every list of models derives from it, and a name it lacks is one error everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rosetta_common.registry import (
    ARCHITECTURES,
    REGISTRY,
    SpecError,
    entry,
    not_built,
    of_reading,
)
from rosetta_common.spec import TOKEN_ARCHITECTURES, ModelConfig, Spec, parse_spec
from rosetta_common.testing import MODELS_VARIABLE, models_under_test, small_config

PARAMS = yaml.safe_load((Path(__file__).resolve().parents[3] / "params.yaml").read_text())
UNKNOWN = f"architecture = 'tcn': unknown; allowed: {', '.join(ARCHITECTURES)}"


def test_the_spec_defaults_are_the_registry_entries():
    spec = Spec()
    assert spec.models == list(ARCHITECTURES)
    assert list(type(spec.architecture).model_fields) == list(ARCHITECTURES)
    for name, e in REGISTRY.items():
        assert isinstance(getattr(spec.architecture, name), e.settings)
        assert spec.optimizers.adam.learning_rate[name] == e.adam_rate
        assert spec.optimizers.sgd.learning_rate[name] == e.sgd_rate
        assert spec.quality.min_test_accuracy[name] == e.min_test_accuracy
    assert TOKEN_ARCHITECTURES == of_reading("tokens") == ("text_transformer",)
    assert set(of_reading("images")) | set(of_reading("tokens")) == set(ARCHITECTURES)
    assert [n for n, e in REGISTRY.items() if e.family == "recurrent"] == ["lstm", "gru"]


def test_params_yaml_lists_every_registered_model():
    """The committed pipeline trains, and may replicate, every model: a new entry is added there too."""
    assert PARAMS["models"] == list(ARCHITECTURES)
    assert PARAMS["replicates"]["models"] == list(ARCHITECTURES)
    assert list(PARAMS["architecture"]) == list(ARCHITECTURES)
    for section in ("adam", "sgd"):
        assert list(PARAMS["optimizers"][section]["learning_rate"]) == list(ARCHITECTURES)
    assert list(PARAMS["quality"]["min_test_accuracy"]) == list(ARCHITECTURES)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_each_entry_builds_its_small_and_tiny_settings(name):
    e = entry(name)
    assert e.name == name and e.ops and all(n > 0 for n in e.ops.values())
    e.settings.model_validate(dict(e.small))
    e.settings.model_validate(dict(e.tiny))
    assert 0 < e.tiny_floor < e.min_test_accuracy <= 1
    assert small_config(name).settings == e.settings.model_validate(dict(e.small))


def test_an_unknown_architecture_is_one_error_everywhere():
    with pytest.raises(SpecError) as raised:
        entry("tcn")
    assert str(raised.value) == UNKNOWN
    with pytest.raises(SpecError, match="^" + UNKNOWN):
        ModelConfig.of(Spec(), "tcn", (8, 8), 10)
    with pytest.raises(SpecError, match="^" + UNKNOWN):
        not_built("tcn", "rosetta_torch")
    with pytest.raises(SpecError, match=r"^params.yaml: models.0 = 'tcn': Input should be 'mlp', "):
        parse_spec({"models": ["tcn"]})
    with pytest.raises(SpecError, match="^" + UNKNOWN):
        models_under_test({MODELS_VARIABLE: "cnn tcn"})
    assert str(not_built("cnn", "rosetta_jax")).startswith("architecture = 'cnn': registered, but rosetta_jax ")


def test_models_under_test_follow_the_variable():
    assert models_under_test({}) == ARCHITECTURES
    assert models_under_test({MODELS_VARIABLE: "gru"}) == ("gru",)
    assert models_under_test({MODELS_VARIABLE: "gru,mlp"}) == ("mlp", "gru")  # the registry's order
    assert models_under_test({MODELS_VARIABLE: " "}) == ARCHITECTURES
