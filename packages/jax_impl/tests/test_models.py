"""NNX specifics: the ModelConfig is static graph data, so predict() compiles once per config and batch size."""

from __future__ import annotations

import numpy as np
from flax import nnx

import rosetta_jax
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_jax.models import _forward

SAME_ABS = 0.0  # one compiled function, different weights in: predict must equal a fresh model's bit for bit


def test_config_is_static_and_predict_reuses_the_compilation() -> None:
    config = small_config("attention", (6, 10))
    first = rosetta_jax.build(config, asymmetric_weights(config, 1))
    second = rosetta_jax.build(config, asymmetric_weights(config, 2))
    # The pydantic config lives in the graphdef (hashable, compared by value), never in the state.
    assert nnx.graphdef(first) == nnx.graphdef(second)
    assert hash(nnx.graphdef(first)) == hash(nnx.graphdef(second))
    assert {type(v) for _, v in nnx.to_flat_state(nnx.state(first))} == {nnx.Param}

    images = np.random.default_rng(3).random((4, 6, 10), dtype=np.float32)
    rosetta_jax.predict(first, images)
    compiled = _forward._cache_size()
    logits = rosetta_jax.predict(second, images)
    assert _forward._cache_size() == compiled  # same config and batch size: no retrace
    again = rosetta_jax.predict(rosetta_jax.build(config, asymmetric_weights(config, 2)), images)
    assert np.abs(logits - again).max() <= SAME_ABS
