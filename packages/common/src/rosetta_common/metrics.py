"""Metrics computed once, in numpy, from each framework's logits: the same formula judges all three."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean softmax cross-entropy, computed in float64."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].mean())


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((np.argmax(logits, axis=1) == labels).mean())


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def relative_diff(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    """|a - b| / max(|a|, |b|), elementwise, 0 where both are 0."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.maximum(np.abs(a), np.abs(b))
    return np.divide(np.abs(a - b), scale, out=np.zeros_like(scale), where=scale > 0)


def inference_mode_problems(predict: Callable[[np.ndarray], np.ndarray], images: np.ndarray,
                            atol: float) -> list[str]:
    """What shows that a model runs in training mode, from its outputs alone (so it judges an ONNX file or a
    native export the same way): dropout makes two runs on the same images differ; BatchNorm on batch
    statistics makes an image's logits depend on the rest of its batch. Empty when neither shows.
    `images` needs at least 4 images that differ."""
    problems = []
    first, second = predict(images), predict(images)
    if (run_diff := max_abs_diff(first, second)) > atol:
        problems.append(f"two runs on the same images differ by {run_diff:.3g} (dropout active?)")
    alone = np.concatenate([predict(images[i:i + 1]) for i in range(min(len(images), 4))])
    if (batch_diff := max_abs_diff(alone, first[: len(alone)])) > atol:
        problems.append(f"an image's logits change by {batch_diff:.3g} with the rest of its batch "
                        "(batch statistics in use?)")
    return problems


def parting_step(a: Sequence[float], b: Sequence[float], tolerance: float) -> int | None:
    """The first step (1-based) whose losses differ by more than `tolerance` (relative_diff): where two runs stop
    being in lockstep. None while they agree at every step."""
    beyond = np.flatnonzero(relative_diff(np.asarray(a, np.float64), np.asarray(b, np.float64)) > tolerance)
    return int(beyond[0]) + 1 if beyond.size else None
