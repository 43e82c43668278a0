"""The Keras <-> canonical mapping leaves no trainable variable out (one left out would silently not be
trained from the shared init nor exported). Round trips are the conformance suite's."""

from __future__ import annotations

import pytest

import rosetta_tf
from rosetta_common.testing import ARCHS, asymmetric_weights, small_config
from rosetta_tf.weights import keras_variables


@pytest.mark.parametrize("arch", ARCHS)
def test_every_trainable_variable_is_canonical(arch: str) -> None:
    config = small_config(arch)
    model = rosetta_tf.build(config, asymmetric_weights(config, 0))
    mapped = {id(v) for v in keras_variables(model).values()}
    assert len(mapped) == len(keras_variables(model))  # no variable mapped twice
    assert {id(v) for v in model.trainable_variables} == mapped
