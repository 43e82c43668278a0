import numpy as np
import pytest

from rosetta_common.metrics import accuracy, max_abs_diff, parting_step, relative_diff, softmax_cross_entropy
from rosetta_common.optim import adam_bias_corrections, adam_step, sgd_step
from rosetta_common.spec import AdamSpec, SGDSpec


def test_adam_first_step_moves_each_weight_by_about_lr():
    spec = AdamSpec(learning_rate=0.01)
    p = np.ones(4, np.float32)
    g = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    p1, _m, _v = adam_step(p, g, np.zeros(4, np.float32), np.zeros(4, np.float32), 1, spec)
    # at t = 1 the bias-corrected update is lr * sign(g) (up to epsilon)
    np.testing.assert_allclose(p - p1, 0.01 * np.sign(g), rtol=1e-5)
    assert adam_bias_corrections(1, 0.9, 0.999) == pytest.approx((0.1, np.sqrt(0.001)), rel=1e-15)


def test_sgd_momentum_accumulates():
    spec = SGDSpec(learning_rate=0.1, momentum=0.9)
    p, buf = np.zeros(1, np.float32), np.zeros(1, np.float32)
    p, buf = sgd_step(p, np.ones(1, np.float32), buf, spec)
    p, buf = sgd_step(p, np.ones(1, np.float32), buf, spec)
    np.testing.assert_allclose(p, [-(0.1 + 0.1 * 1.9)], rtol=1e-6)


def test_metrics():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]], np.float32)
    labels = np.array([0, 1, 1])
    assert accuracy(logits, labels) == pytest.approx(2 / 3)
    expected = np.mean([np.log1p(np.exp(-2.0)), np.log1p(np.exp(-1.0)), np.log1p(np.exp(3.0))])
    assert softmax_cross_entropy(logits, labels) == pytest.approx(expected, rel=1e-12)
    assert max_abs_diff(np.ones(3), np.array([1.0, 1.5, 0.9])) == pytest.approx(0.5)
    np.testing.assert_allclose(relative_diff([1.0, 0.0, -2.0], [1.1, 0.0, -1.0]), [0.1 / 1.1, 0.0, 0.5])
    with pytest.raises(ValueError, match="shapes differ"):
        max_abs_diff(np.ones(2), np.ones(3))


def test_parting_step_is_the_first_step_beyond_the_lockstep_tolerance() -> None:
    a = np.array([1.0, 0.9, 0.8, 0.7, 0.6])
    assert parting_step(a, a.copy(), 1e-5) is None
    b = a * np.array([1, 1 + 5e-6, 1 + 2e-5, 1, 1 + 1e-3])  # within, beyond, back within, beyond
    assert parting_step(a, b, 1e-5) == 3
    assert parting_step(a, b, 1e-2) is None
