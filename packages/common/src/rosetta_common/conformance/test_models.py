"""models.py and weights.py of the contract: canonical weights in and out, and what the model computes."""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import numpy as np
import pytest

from rosetta_common.conformance.selected import skip_unless_tested
from rosetta_common.errors import WeightsError
from rosetta_common.inputs import padding_mask
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward, forward_train, text_transformer
from rosetta_common.registry import REGISTRY, Section
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.testing import (
    NUM_CLASSES,
    asymmetric_weights,
    random_inputs,
    small_config,
    small_spec,
    swap_blocks,
)
from rosetta_common.training import dropout_features, dropout_masks, plan
from rosetta_common.weights import Weights, canonical_shapes, is_statistic

FORWARD_ABS = Spec().tolerances.forward_parity_abs  # the bound the validate stage applies between frameworks
NON_SQUARE = (6, 10)  # height != width: a swapped axis or an assumed square image cannot pass


def test_a_registered_architecture_without_a_builder_is_one_error(backend: ModuleType, monkeypatch) -> None:
    """A model added to the registry before its package builds it: one error naming it and the package."""

    class TCNSpec(Section):
        filters: int = 4

    monkeypatch.setitem(REGISTRY, "tcn", replace(REGISTRY["mlp"], name="tcn", settings=TCNSpec))
    config = ModelConfig.model_construct(arch="tcn", image_shape=(8, 8), num_classes=NUM_CLASSES,
                                         settings=TCNSpec())
    with pytest.raises(NotImplementedError, match=rf"^architecture = 'tcn': registered, but {backend.__name__} "):
        backend.build(config, {})


def test_canonical_round_trip_is_exact(backend: ModuleType, arch: str) -> None:
    config = small_config(arch)
    weights = asymmetric_weights(config, 1)
    back = backend.to_canonical(backend.build(config, weights))
    assert list(back) == list(canonical_shapes(config))  # same names, canonical order
    for name, value in weights.items():
        assert back[name].dtype == np.float32, name
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_from_canonical_replaces_every_weight(backend: ModuleType, arch: str) -> None:
    config = small_config(arch)
    model = backend.build(config, asymmetric_weights(config, 2))
    replacement = asymmetric_weights(config, 3)
    backend.from_canonical(model, replacement)
    back = backend.to_canonical(model)
    for name, value in replacement.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_build_copies_the_weights(backend: ModuleType, arch: str) -> None:
    config = small_config(arch)
    weights = asymmetric_weights(config, 4)
    kept = {name: value.copy() for name, value in weights.items()}
    model = backend.build(config, weights)
    for value in weights.values():
        value += 1.0  # the caller's arrays change; the model must not
    for name, value in backend.to_canonical(model).items():
        np.testing.assert_array_equal(value, kept[name], err_msg=name)


def test_model_config_is_the_validated_spec_object(backend: ModuleType, arch: str) -> None:
    config = small_config(arch, NON_SQUARE)
    model = backend.build(config, asymmetric_weights(config, 5))
    assert backend.model_config(model) == config


@pytest.mark.parametrize("image_shape", [(8, 8), NON_SQUARE], ids=["square", "non_square"])
def test_forward_matches_float64_reference(backend: ModuleType, arch: str, image_shape: tuple[int, int]) -> None:
    config = small_config(arch, image_shape)
    weights = asymmetric_weights(config, 6)
    if config.input.kind == "tokens":  # the two cases: the longest sequences, and shorter ones (a dynamic length)
        images = random_inputs(config, 5, 8, length=config.input.max_length if image_shape == (8, 8) else 5)
    else:
        images = np.random.default_rng(8).random((5, *image_shape), dtype=np.float32)
    logits = backend.predict(backend.build(config, weights), images)
    assert logits.dtype == np.float32 and logits.shape == (5, config.num_classes)
    assert max_abs_diff(logits, forward(config, weights, images)) <= FORWARD_ABS


def test_predict_handles_a_single_image(backend: ModuleType, arch: str, inputs: np.ndarray) -> None:
    config = small_config(arch)
    model = backend.build(config, asymmetric_weights(config, 9))
    one = backend.predict(model, inputs[:1])
    assert one.shape == (1, config.num_classes)
    assert max_abs_diff(one, backend.predict(model, inputs)[:1]) <= FORWARD_ABS


def test_padding_changes_nothing(backend: ModuleType) -> None:
    """A token model's answer for a text does not depend on how far it is padded, nor on the rest of the batch."""
    skip_unless_tested("text_transformer")
    config = small_config("text_transformer")
    model = backend.build(config, asymmetric_weights(config, 9))
    tokens = random_inputs(config, 6, 16, length=6)
    padded = np.zeros((6, config.input.max_length), np.int64)
    padded[:, :6] = tokens
    assert max_abs_diff(backend.predict(model, padded), backend.predict(model, tokens)) <= FORWARD_ABS
    assert max_abs_diff(backend.predict(model, tokens[2:3]), backend.predict(model, tokens)[2:3]) <= FORWARD_ABS


@pytest.mark.parametrize(("value", "message"), [
    ("out_of_vocabulary", "outside the vocabulary"), ("int32", "dtype int32"), ("too_long", "longer than"),
    ("float_images", "dtype float32")])
def test_a_bad_token_input_is_one_line(backend: ModuleType, value: str, message: str) -> None:
    from rosetta_common.errors import InputError

    skip_unless_tested("text_transformer")
    config = small_config("text_transformer")
    model = backend.build(config, asymmetric_weights(config, 9))
    good = random_inputs(config, 2, 3)
    bad = {"out_of_vocabulary": np.where(good > 0, config.input.vocab_size, 0), "int32": good.astype(np.int32),
           "too_long": np.ones((2, config.input.max_length + 1), np.int64),
           "float_images": np.zeros((2, 8, 8), np.float32)}[value]
    with pytest.raises(InputError, match=message) as raised:
        backend.predict(model, bad)
    assert "\n" not in str(raised.value)


def _bad_weights(arch: str) -> list[tuple[str, dict[str, np.ndarray], str]]:
    """(case, weights, a name the message must mention), one per way canonical weights can be wrong."""
    config = small_config(arch)
    good = asymmetric_weights(config, 10)
    first, last = next(iter(good)), list(good)[-1]
    wrong_shape = {**good, first: np.zeros((*good[first].shape, 2), np.float32)}
    missing = {k: v for k, v in good.items() if k != last}
    unexpected = {**good, "extra.kernel": np.zeros((2, 2), np.float32)}
    wrong_dtype = {**good, first: good[first].astype(np.float64)}
    non_finite = {**good, first: np.full_like(good[first], np.nan)}
    return [("wrong_shape", wrong_shape, first), ("missing", missing, last), ("unexpected", unexpected, "extra.kernel"),
            ("wrong_dtype", wrong_dtype, first), ("non_finite", non_finite, first)]


@pytest.mark.parametrize("case", ["wrong_shape", "missing", "unexpected", "wrong_dtype", "non_finite"])
def test_bad_weights_give_one_line_weights_error(backend: ModuleType, arch: str, case: str) -> None:
    _, weights, name = next(c for c in _bad_weights(arch) if c[0] == case)
    with pytest.raises(WeightsError) as raised:
        backend.build(small_config(arch), weights)
    message = str(raised.value)
    assert "\n" not in message and name in message, message


STATISTICS_RTOL = 1e-5  # float32 running statistics against the float64 reference


def _training_batch(config: ModelConfig, batch: int = 4) -> tuple[np.ndarray, np.ndarray | None]:
    """A small batch (small, so that BatchNorm's n / (n - 1) is visible) and, for a model with dropout, one
    step's mask from rosetta_common.training.dropout_masks."""
    if config.input.kind == "tokens":
        return random_inputs(config, batch, 12), None
    images = np.random.default_rng(12).random((batch, *config.image_shape), dtype=np.float32)
    features = dropout_features(config)
    if features is None:
        return images, None
    spec = small_spec(batch_size=batch)
    masks = dropout_masks(plan(spec, config.arch, 4 * batch), config)
    return images, masks[1]


def test_training_forward_matches_float64_reference(backend: ModuleType, arch: str) -> None:
    """Training mode as a step runs it: batch statistics, running statistics updated by the spec's convention,
    the shared dropout mask; trainable weights untouched, and the model back in inference mode."""
    config = small_config(arch, NON_SQUARE)
    weights = asymmetric_weights(config, 13)
    images, mask = _training_batch(config)
    model = backend.build(config, weights)
    logits = backend.forward_train(model, images, mask)
    expected, statistics = forward_train(config, weights, images, mask)
    assert max_abs_diff(logits, expected) <= FORWARD_ABS
    after = backend.to_canonical(model)
    for name in canonical_shapes(config):
        if is_statistic(name):
            np.testing.assert_allclose(after[name], statistics[name], rtol=STATISTICS_RTOL, atol=1e-7, err_msg=name)
        else:
            np.testing.assert_array_equal(after[name], weights[name], err_msg=name)
    assert max_abs_diff(backend.predict(model, images), forward(config, after, images)) <= FORWARD_ABS



@pytest.mark.parametrize("seed", [15, 16])
def test_batchnorm_statistics_at_mnists_size_match_float64_reference(backend: ModuleType, seed: int) -> None:
    """The statistics of one training-mode forward at the pipeline's batch (32) of MNIST-sized, mostly blank
    images (about 80 % of the pixels 0, as data.source=mnist5k's): each channel's are sums of 32 * 28 * 28 =
    25,088 values, and over the blank margins a channel's mean is large against its spread, so summing
    carelessly shows. Keras' own BatchNormalization (TensorFlow's reduction over the leading axes) misses the
    reference by about 2e-5 to 4e-5 on these batches, enough to part TF's resnet from torch's and JAX's at step 1 on
    mnist5k; torch, JAX and rosetta_tf's BatchNormalization stay within 3.4e-6."""
    config = ModelConfig.of(Spec(), "resnet", (28, 28), NUM_CLASSES)  # params.yaml's default sizes
    weights = asymmetric_weights(config, seed)
    rng = np.random.default_rng(seed)
    images = (rng.random((32, 28, 28)) * (rng.random((32, 28, 28)) < 0.2)).astype(np.float32)
    model = backend.build(config, weights)
    mask = np.ones((len(images), dropout_features(config)), np.float32)
    backend.forward_train(model, images, mask)
    after = backend.to_canonical(model)
    for name, expected in forward_train(config, weights, images, mask)[1].items():
        np.testing.assert_allclose(after[name], expected, rtol=STATISTICS_RTOL, atol=1e-7, err_msg=name)

def _planted(arch: str, mistake: str, config: ModelConfig, weights: Weights, images: np.ndarray,
             mask: np.ndarray | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """What the reference computes if a package made `mistake`: (inference logits, statistics after one
    training forward). The conformance tests above must tell it apart from the right answer."""
    w = dict(weights)
    if mistake == "symmetric_padding":  # torch's padding=1 on the stride-2 conv
        return forward(config, w, images, padding="symmetric"), {}
    if mistake == "momentum_convention":  # torch's momentum passed as Keras'/Flax's, or the reverse
        s = config.settings
        flipped = config.model_copy(update={"settings": s.model_copy(update={
            "batchnorm_momentum": 1.0 - s.batchnorm_momentum})})
        return forward(config, w, images), forward_train(flipped, w, images, mask)[1]
    if mistake == "unbiased_running_variance":  # torch's own update, uncorrected
        statistics = forward_train(config, w, images, mask)[1]
        m, sizes = config.settings.batchnorm_momentum, _batchnorm_sizes(config, len(images))
        for name, n in sizes.items():
            batch_var = (statistics[name] - m * w[name]) / (1 - m)
            statistics[name] = m * w[name] + (1 - m) * batch_var * n / (n - 1)
        return forward(config, w, images), statistics
    if mistake == "gate_order":  # LSTM i <-> f, GRU r <-> z
        blocks = 4 if arch == "lstm" else 3
        for name in w:
            if name.startswith(f"{arch}."):
                w[name] = swap_blocks(w[name], blocks, 0, 1)
    elif mistake == "bias_counted_twice":  # torch's bias_ih and bias_hh both given the canonical bias
        w["lstm.bias"] = 2 * w["lstm.bias"]
    elif mistake == "bias_sides_swapped":  # GRU input and recurrent bias exchanged
        w["gru.input_bias"], w["gru.recurrent_bias"] = w["gru.recurrent_bias"], w["gru.input_bias"]
    elif mistake in TEXT_MISTAKES:
        real = padding_mask(images)
        key_mask, pool_mask = {
            "mask_polarity_inverted": (~real, real),  # torch's key_padding_mask (True = ignore) given "attend"
            "padding_attended": (np.ones_like(real), real),  # no key mask at all
            "padding_pooled": (real, np.ones_like(real)),  # the mean over every position, padding included
            "pad_row_reserved_by_shift": (real, real),
        }[mistake]
        if mistake == "pad_row_reserved_by_shift":  # id i read from row i - 1 (a table shifted to reserve row 0)
            table = w["embed.embedding"]
            w["embed.embedding"] = np.concatenate([np.zeros_like(table[:1]), table[:-1]])
        w64 = {k: np.asarray(v, np.float64) for k, v in w.items()}
        return text_transformer(config, w64, images, key_mask=key_mask, pool_mask=pool_mask)["logits"], {}
    return forward(config, w, images), {}


# The ways a text model's padding goes wrong between frameworks (docs/conventions.md). The
# inputs they are planted on have padding in every row (the last position), so that each one shows; the inverted mask
# then leaves every row some key to attend.
TEXT_MISTAKES = ("mask_polarity_inverted", "padding_attended", "padding_pooled", "pad_row_reserved_by_shift")


def _batchnorm_sizes(config: ModelConfig, batch: int) -> dict[str, int]:
    """Running-variance name -> the number of values per channel its batch statistics average."""
    height, width = config.image_shape
    half = -(-height // 2) * -(-width // 2)
    return {"stem.bn.running_var": batch * height * width, "block.bn1.running_var": batch * half,
            "block.bn2.running_var": batch * half, "block.shortcut.bn.running_var": batch * half}


def _statistics_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Relative difference, with a floor of 1e-2 on the scale: a running mean near 0 (1e-3, say) would otherwise
    turn float32 rounding (1e-8 absolute) into a large relative figure."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-2)))


PLANTED = [("resnet", "symmetric_padding"), ("resnet", "momentum_convention"),
           ("resnet", "unbiased_running_variance"), ("lstm", "gate_order"), ("lstm", "bias_counted_twice"),
           ("gru", "gate_order"), ("gru", "bias_sides_swapped"),
           *(("text_transformer", mistake) for mistake in TEXT_MISTAKES)]


@pytest.mark.parametrize(("arch_name", "mistake"), PLANTED, ids=[f"{a}-{m}" for a, m in PLANTED])
def test_a_planted_convention_mistake_is_caught(backend: ModuleType, arch_name: str, mistake: str) -> None:
    """Each convention that differs between frameworks, planted wrongly: the package's model must agree with
    the reference and disagree with the planted version by far more than the tolerance the checks above use,
    so a package that made the mistake could not pass them."""
    skip_unless_tested(arch_name)
    config = small_config(arch_name, NON_SQUARE)
    weights = asymmetric_weights(config, 14)
    images, mask = _training_batch(config)
    if config.input.kind == "tokens":
        images[:, -1] = 0  # padding in every row (each row's first position holds a token)
    planted_logits, planted_statistics = _planted(arch_name, mistake, config, weights, images, mask)
    logits = backend.predict(backend.build(config, weights), images)
    model = backend.build(config, weights)
    backend.forward_train(model, images, mask)
    after = backend.to_canonical(model)
    if planted_statistics:
        expected = forward_train(config, weights, images, mask)[1]
        worst = max(_statistics_diff(after[k], planted_statistics[k]) for k in planted_statistics)
        right = max(_statistics_diff(after[k], expected[k]) for k in expected)
        assert right <= STATISTICS_RTOL < worst / 10, (right, worst)
    else:
        assert max_abs_diff(logits, forward(config, weights, images)) <= FORWARD_ABS
        assert max_abs_diff(logits, planted_logits) > 100 * FORWARD_ABS
