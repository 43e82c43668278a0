"""models.py and weights.py of the contract: canonical weights in and out, and what the model computes."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from rosetta_common.errors import WeightsError
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.spec import Spec
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_common.weights import canonical_shapes

FORWARD_ABS = Spec().tolerances.forward_parity_abs  # the bound the validate stage applies between frameworks
NON_SQUARE = (6, 10)  # height != width: a swapped axis or an assumed square image cannot pass


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
    images = np.random.default_rng(8).random((5, *image_shape), dtype=np.float32)
    logits = backend.predict(backend.build(config, weights), images)
    assert logits.dtype == np.float32 and logits.shape == (5, config.num_classes)
    assert max_abs_diff(logits, forward(config, weights, images)) <= FORWARD_ABS


def test_predict_handles_a_single_image(backend: ModuleType, arch: str, images: np.ndarray) -> None:
    config = small_config(arch)
    model = backend.build(config, asymmetric_weights(config, 9))
    one = backend.predict(model, images[:1])
    assert one.shape == (1, config.num_classes)
    assert max_abs_diff(one, backend.predict(model, images)[:1]) <= FORWARD_ABS


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
