from pathlib import Path

import numpy as np
import pytest

from rosetta_common.spec import ARCHITECTURES, Spec, SpecError, load_spec, parse_spec
from rosetta_common.training import plan

REPO = Path(__file__).resolve().parents[3]

# The registered models a section leaves out when it names only mlp (and cnn), in the registry's order.
BEYOND_MLP = ", ".join(a for a in ARCHITECTURES if a != "mlp")
BEYOND_MLP_CNN = ", ".join(a for a in ARCHITECTURES if a not in ("mlp", "cnn"))


def test_repository_params_are_valid():
    # Every key in params.yaml is a known field (extra="forbid"); its values need not repeat spec.py's defaults.
    spec = load_spec(REPO / "params.yaml")
    assert spec.models and spec.frameworks
    assert set(spec.quality.min_test_accuracy) >= set(spec.models)


def test_learning_rate_per_model_or_one_number():
    spec = parse_spec({"optimizers": {"sgd": {"learning_rate": 0.02}}, "train": {"optimizer": "sgd"}})
    assert spec.learning_rate("mlp") == spec.learning_rate("attention") == 0.02
    resolved = plan(Spec(), "cnn", 1000)
    assert resolved.learning_rate == 3e-3 and resolved.optimizer.beta1 == 0.9
    assert plan(parse_spec({"train": {"optimizer": "sgd"}}), "attention", 1000).learning_rate == 0.005
    assert resolved.steps_per_epoch == 1000 // 32 and resolved.all_batches().shape == (10 * 31, 32)
    with pytest.raises(SpecError, match=f"gives no rate for {BEYOND_MLP_CNN} "):
        parse_spec({"optimizers": {"adam": {"learning_rate": {"mlp": 0.1, "cnn": 0.1}}}})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"models": ["mlp", "vgg"]},
         f"models.1 = 'vgg': Input should be {', '.join(map(repr, ARCHITECTURES[:-1]))} or {ARCHITECTURES[-1]!r}"),
        (
            {"optimizers": {"adam": {"learning_rate": -0.1}}},
            "optimizers.adam.learning_rate = -0.1: Input should be greater than 0",
        ),
        ({"train": {"epochs": 0}}, "train.epochs = 0: Input should be greater than 0"),
        ({"train": {"epochs": "ten"}}, "train.epochs = 'ten': Input should be a valid integer"),
        ({"train": {"epochs": {"mlp": 3}}}, f"train.epochs = {{'mlp': 3}}: gives no epochs for {BEYOND_MLP} "),
        ({"train": {"epochs": {"vgg": 3}}}, "train.epochs = {'vgg': 3}: unknown model 'vgg'"),
        ({"train": {"optimizer": "rmsprop"}}, "train.optimizer = 'rmsprop': Input should be 'adam' or 'sgd'"),
        ({"data": {"source": "idx"}}, "data.idx_dir = None: required when data.source is 'idx'"),
        (
            {"architecture": {"attention": {"embed_dim": 10, "num_heads": 3}}},
            "architecture.attention.num_heads = 3: must divide embed_dim (10)",
        ),
        ({"trian": {}}, "trian = {}: unknown field"),
        ({"frameworks": []}, "frameworks = []: list at least one of torch, tf, jax"),
        (
            {"optimizers": {"adam": {"learning_rate": {"mlp": 0.1, "vgg": 0.1}}}},
            f"optimizers.adam.learning_rate = {{'mlp': 0.1, 'vgg': 0.1}}: unknown model 'vgg' (allowed: "
            f"{', '.join(ARCHITECTURES)})",
        ),
        (
            {"quality": {"min_test_accuracy": {"mlp": 0.9, "cnn": 0.9}}},
            f"quality.min_test_accuracy = {{'mlp': 0.9, 'cnn': 0.9}}: gives no floor for {BEYOND_MLP_CNN} ",
        ),
        ({"replicates": {"parted": 6, "at_most": 5}}, "parted = 6: must be at most at_most (5)"),
        ({"replicates": {"parted": 0}}, "replicates.parted = 0: Input should be greater than or equal to 1"),
    ],
)
def test_bad_values_give_one_line_naming_field_value_and_allowed(raw, expected):
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("params.yaml: ")
    assert expected in message


def test_epochs_per_model_or_one_number():
    per_model = {a: 10 for a in ARCHITECTURES} | {"text_transformer": 3}
    spec = parse_spec({"train": {"epochs": per_model}})
    assert spec.epochs("mlp") == 10 and spec.epochs("text_transformer") == 3
    assert plan(spec, "text_transformer", 1000).num_steps == 3 * (1000 // 32)
    assert plan(spec, "cnn", 1000).num_steps == 10 * (1000 // 32)
    assert parse_spec({"train": {"epochs": 4}}).epochs("gru") == 4


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML at line 2, column 1: expected ',' or ']'"):
        load_spec(bad)
    bad.write_text("- a list\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(bad)


def test_yaml_scientific_notation_without_dot_is_accepted():
    # PyYAML reads `1e-3` as a string; the spec still takes it as a number.
    assert parse_spec({"optimizers": {"adam": {"learning_rate": "1e-3"}}}).optimizer.learning_rate == 1e-3


SOURCES = {"sources": {"mnist5k": {"quality": {"min_test_accuracy": {"mlp": 0.9}}}}}


def test_a_sources_overrides_apply_only_when_that_source_is_chosen() -> None:
    digits = parse_spec(SOURCES)
    assert digits.quality.min_test_accuracy["mlp"] == 0.95
    mnist = parse_spec({**SOURCES, "data": {"source": "mnist5k"}})
    assert mnist.quality.min_test_accuracy["mlp"] == 0.9
    assert mnist.quality.min_test_accuracy["cnn"] == 0.95  # merged key by key: the other floors stay


@pytest.mark.parametrize(("raw", "field"), [
    ({"tolerances": {"models": {"cnn": {"reason": "chaotic (measured)", "test_loss_rel": 0.05}}}},
     r"tolerances\.models = "),
    ({"sources": {"mnist5k": {"tolerances": {"test_loss_rel": 0.05}}}}, r"sources\.mnist5k\.tolerances = "),
    ({"data_parallel": {"bounds": {"cnn": {"reason": "jax parted (measured)", "test_loss_rel": 0.01}}}},
     r"data_parallel\.bounds = "),
])
def test_no_weaker_bound_for_a_model_or_a_source_is_taken(raw, field):
    # Every model on every data source is judged by the same tolerances: a per-model or per-source bound is an
    # unknown field, one line.
    with pytest.raises(SpecError, match=field + ".*unknown field") as error:
        parse_spec(raw)
    assert "\n" not in str(error.value)


def test_a_bad_sources_override_is_one_line() -> None:
    with pytest.raises(SpecError, match=r"sources\.mnist5k\.quality\.min_test_accuracy\.mlp = 2") as error:
        parse_spec({"sources": {"mnist5k": {"quality": {"min_test_accuracy": {"mlp": 2}}}}})
    assert "\n" not in str(error.value)
    with pytest.raises(SpecError, match=r"sources\.mnist5k\.train = .*unknown field"):
        parse_spec({"sources": {"mnist5k": {"train": {"epochs": 3}}}})


def test_a_truncated_plan_is_the_first_steps_of_the_run():
    full = plan(Spec(), "resnet", 1000)
    for steps in (1, 10, 31):
        part = full.truncated(steps)
        assert part.num_steps == steps and part.epochs == 1
        assert (part.all_batches() == full.all_batches()[:steps]).all()
        # A schedule over the run (JAX's Adam table) is the whole run's, truncated again or not.
        assert full.schedule_steps == full.num_steps and part.schedule_steps == full.num_steps
        assert part.replicate(2).truncated(1).schedule_steps == full.num_steps
    with pytest.raises(SpecError, match=r"step 32: must be within the first epoch, 1\.\.31"):
        full.truncated(32)


def test_a_replicates_plan_reorders_only_the_rows_of_each_batch():
    # Replicate i trains on the same samples in the same steps, each batch's rows in an order of its own (other
    # summation orders, so other roundings every step); a truncated replicate passes through its whole run's.
    full = plan(Spec(), "resnet", 1000)
    first, again, second = full.replicate(1), full.replicate(1), full.replicate(2)
    base, one = full.all_batches(), first.all_batches()
    assert one.shape == base.shape and (np.sort(one, axis=1) == np.sort(base, axis=1)).all()
    assert (one != base).any(axis=1).all()  # every step reordered (32! orders: an identity is not drawn)
    assert (one == again.all_batches()).all() and not (one == second.all_batches()).all()
    assert (one[:10] == first.truncated(10).all_batches()).all()
    assert first.truncated(10).row_order == 1 and (full.row_permutations() == np.arange(32)).all()
    with pytest.raises(ValueError, match="replicates are numbered from 1"):
        full.replicate(0)


@pytest.mark.parametrize("steps", [[10, 1], [1, 1], [1, 21]])
def test_lockstep_checkpoints_are_increasing_steps_inside_the_window(steps):
    with pytest.raises(SpecError, match=r"lockstep_checkpoints = \[.*none after lockstep_steps \(20\)"):
        parse_spec({"tolerances": {"lockstep_checkpoints": steps}})
