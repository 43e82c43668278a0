"""What only the Keras models need: the BatchNorm and padding choices of models.py, each planted wrong, fail
the float64 reference by far more than its tolerance (so the conformance checks would catch them); and the
training twin that applies common's dropout mask shares everything with the inference model and leaks nothing
into it. The forward and training forward themselves are the conformance suite's."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from keras import layers, ops

import rosetta_tf
from rosetta_common.metrics import max_abs_diff, relative_diff
from rosetta_common.reference import forward, forward_train
from rosetta_common.registry import ResNetSpec
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.testing import asymmetric_weights, small_config, small_spec
from rosetta_common.training import dropout_masks, plan
from rosetta_tf import models

FORWARD_ABS = Spec().tolerances.forward_parity_abs
STATISTICS_RTOL = 1e-5  # the conformance suite's bound on float32 running statistics
NON_SQUARE = (6, 10)


def _case(seed: int = 0) -> tuple[ModelConfig, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    config = small_config("resnet", NON_SQUARE)
    images = np.random.default_rng(seed).random((4, *NON_SQUARE), dtype=np.float32)
    mask = dropout_masks(plan(small_spec(batch_size=4), "resnet", 16), config)[0]
    return config, asymmetric_weights(config, seed + 1), images, mask


def _statistics_error(model: Any, config: ModelConfig, weights: dict[str, np.ndarray], images: np.ndarray,
                      mask: np.ndarray) -> float:
    """Largest relative difference between the model's running statistics after one training forward and the
    reference's."""
    rosetta_tf.forward_train(model, images, mask)
    after, expected = rosetta_tf.to_canonical(model), forward_train(config, weights, images, mask)[1]
    return max(float(np.max(relative_diff(after[k], expected[k]))) for k in expected)


def test_momentum_passed_with_torchs_meaning_fails_the_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' momentum is the spec's; torch's value (1 - m, 0.1 for 0.9) passed to Keras unconverted moves the
    running statistics nine times too far."""
    config, weights, images, mask = _case()
    assert _statistics_error(rosetta_tf.build(config, weights), config, weights, images, mask) <= STATISTICS_RTOL

    monkeypatch.setattr(models, "batchnorm_momentum", lambda momentum: 1.0 - momentum)
    assert _statistics_error(rosetta_tf.build(config, weights), config, weights, images, mask) > 100 * STATISTICS_RTOL


def test_keras_default_epsilon_fails_the_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' BatchNormalization defaults to epsilon 1e-3 (the spec's is 1e-5): left at the default, the
    logits move, in inference (running variances) and even more in training (small batch variances)."""
    config, weights, images, mask = _case(1)

    def keras_default(settings: ResNetSpec, name: str) -> layers.BatchNormalization:
        return layers.BatchNormalization(momentum=settings.batchnorm_momentum, name=name)

    monkeypatch.setattr(models, "batchnorm", keras_default)
    model = rosetta_tf.build(config, weights)
    assert max_abs_diff(rosetta_tf.predict(model, images), forward(config, weights, images)) > 10 * FORWARD_ABS
    planted = rosetta_tf.forward_train(model, images, mask)
    assert max_abs_diff(planted, forward_train(config, weights, images, mask)[0]) > 100 * FORWARD_ABS


@keras.saving.register_keras_serializable(package="rosetta_tf_tests")
class SymmetricConv(layers.Conv2D):
    """torch's padding=1 in Keras clothing: (k - 1) // 2 zeros on every side, then a "valid" convolution."""

    def _pad(self) -> int:
        return (self.kernel_size[0] - 1) // 2

    def call(self, x: Any) -> Any:
        p = self._pad()
        return super().call(ops.pad(x, [[0, 0], [p, p], [p, p], [0, 0]]))

    def compute_output_shape(self, shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
        p = self._pad()
        return super().compute_output_shape((shape[0], shape[1] + 2 * p, shape[2] + 2 * p, shape[3]))


def test_symmetric_padding_fails_the_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras' "same" pads a stride-2 conv's odd extra row/column at the bottom/right (the canonical choice);
    torch's padding=1 pads both sides. Only the stride-2 3x3 conv differs, and that is enough."""
    config, weights, images, _ = _case(2)
    expected = forward(config, weights, images)

    def symmetric(filters: int, size: int, stride: int, name: str) -> layers.Conv2D:
        return SymmetricConv(filters, size, strides=stride, padding="valid", use_bias=False, name=name)

    monkeypatch.setattr(models, "conv", symmetric)
    logits = rosetta_tf.predict(rosetta_tf.build(config, weights), images)
    assert max_abs_diff(logits, forward(config, weights, images, padding="symmetric")) <= FORWARD_ABS  # torch's
    assert max_abs_diff(logits, expected) > 100 * FORWARD_ABS


def test_training_twin_shares_the_layers_and_keeps_one_input_for_inference() -> None:
    config, weights, images, mask = _case(3)
    model = rosetta_tf.build(config, weights)
    twin = models.training_view(model)
    assert twin is not model and models.training_view(model) is twin  # built once per model
    assert {id(v) for v in twin.trainable_variables} == {id(v) for v in model.trainable_variables}
    assert len(model.inputs) == 1 and sorted(twin.input) == [models.MASK_INPUT, "images"]
    # Keras' own Dropout stays in the inference model, as the identity.
    assert isinstance(model.get_layer(models.DROPOUT), layers.Dropout)
    eager = np.asarray(model(images, training=False))  # Keras' own call, outside predict's graph
    assert max_abs_diff(eager, forward(config, weights, images)) <= FORWARD_ABS
    # The twin drops exactly the mask's units: a mask of ones is no dropout; the step's mask is the reference's.
    ones = rosetta_tf.forward_train(rosetta_tf.build(config, weights), images, np.ones_like(mask))
    assert max_abs_diff(ones, forward_train(config, weights, images, None)[0]) <= FORWARD_ABS
    dropped = rosetta_tf.forward_train(rosetta_tf.build(config, weights), images, mask)
    assert max_abs_diff(dropped, forward_train(config, weights, images, mask)[0]) <= FORWARD_ABS
    assert max_abs_diff(dropped, ones) > 100 * FORWARD_ABS


def test_the_training_twin_leaves_the_saved_model_unchanged(tmp_path: Path) -> None:
    """model.keras records the inference graph only: building the twin (a second call of the head layer) must
    not show in its config."""
    config, weights, images, mask = _case(4)
    model = rosetta_tf.build(config, weights)
    model.save(tmp_path / "before.keras")
    rosetta_tf.forward_train(model, images, mask)  # builds and runs the twin
    model.save(tmp_path / "after.keras")
    configs = []
    for name in ("before.keras", "after.keras"):
        with zipfile.ZipFile(tmp_path / name) as archive:
            configs.append(json.loads(archive.read("config.json")))
    assert configs[0] == configs[1]
    reloaded = keras.models.load_model(tmp_path / "after.keras", safe_mode=True, compile=False)
    assert len(reloaded.inputs) == 1


@pytest.mark.parametrize(("arch", "mask_shape", "named"), [("resnet", (4, 5), "(4, 6)"), ("lstm", (4, 12), "None")])
def test_a_wrong_dropout_mask_is_a_one_line_error(arch: str, mask_shape: tuple[int, int], named: str) -> None:
    config = small_config(arch)
    model = rosetta_tf.build(config, asymmetric_weights(config, 5))
    images = np.zeros((4, *config.image_shape), np.float32)
    with pytest.raises(ValueError) as raised:
        rosetta_tf.forward_train(model, images, np.ones(mask_shape, np.float32))
    message = str(raised.value)
    assert "\n" not in message and "dropout_mask" in message and named in message, message
