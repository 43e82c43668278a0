"""The meaning of each optimizer, written once in numpy: the reference all three frameworks must match.

PyTorch's `torch.optim.Adam` / `SGD(momentum=...)` compute exactly this. Mismatches found and how each
package reconciles them (documented in docs/conventions.md):
- Keras' `keras.optimizers.Adam` adds epsilon to sqrt(v) *before* the bias correction ("epsilon hat")
  and defaults to epsilon=1e-7; torch and optax add it after, default 1e-8. rosetta_tf uses a small
  Keras optimizer with this module's formula.
- `optax.adam` computes 1 - beta2**t in float32 (about 1.3e-5 relative off for small t); rosetta_jax
  uses a small optax transform that takes the bias corrections from `adam_bias_corrections` (float64).
- SGD with momentum: Keras (v = m*v - lr*g; p += v), torch (b = m*b + g; p -= lr*b) and optax's
  `sgd(momentum=...)` (trace) are the same update for a constant learning rate.
"""

from __future__ import annotations

import numpy as np

from rosetta_common.spec import AdamSpec, SGDSpec


def adam_bias_corrections(step: int, beta1: float, beta2: float) -> tuple[float, float]:
    """(1 - beta1**t, sqrt(1 - beta2**t)) in float64, for step t >= 1, as torch computes them."""
    return 1.0 - beta1**step, float(np.sqrt(1.0 - beta2**step))


def adam_step(
    param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, step: int, spec: AdamSpec
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One Adam update (step counts from 1): returns (param, m, v), float32 like the frameworks."""
    f32 = np.float32
    m = (f32(spec.beta1) * m + f32(1 - spec.beta1) * grad).astype(f32)
    v = (f32(spec.beta2) * v + f32(1 - spec.beta2) * grad * grad).astype(f32)
    bc1, bc2_sqrt = adam_bias_corrections(step, spec.beta1, spec.beta2)
    denom = np.sqrt(v) / f32(bc2_sqrt) + f32(spec.epsilon)
    return (param - f32(spec.learning_rate / bc1) * m / denom).astype(f32), m, v


def sgd_step(param: np.ndarray, grad: np.ndarray, buf: np.ndarray, spec: SGDSpec) -> tuple[np.ndarray, np.ndarray]:
    """One SGD-with-momentum update (no dampening, no Nesterov): returns (param, momentum buffer)."""
    f32 = np.float32
    buf = (f32(spec.momentum) * buf + grad).astype(f32)
    return (param - f32(spec.learning_rate) * buf).astype(f32), buf
