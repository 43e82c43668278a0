"""The measured null: what a framework's own rounding does to a figure, and the test against it.

Once two frameworks' runs part, training is chaotic and a figure can no longer be held to a float32 bound. Each
framework's replicates (the shared init moved by one ulp, each batch's rows in an order of their own) show how far
that chaos alone carries a figure; a porting mistake shows as one framework further from the others than that.
For one model and figure, pooled_p pools every framework's run and replicates and asks, by permuting the framework
labels, whether the frameworks' groups lie further apart than their own spread (PERMANOVA's pseudo-F); pooled_null
records it for a row, partitions says when a null is too thin to judge, and Ledger.judge_nulls decides every test
of the run at once with holm_rejected. The samples, the test, its alpha and what a null too thin does:
docs/judge.md, 'The measured null'. Written with numpy alone (the validation environment has no scipy).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

PERMUTATIONS = 9999  # pooled_p's random relabellings: p-values from 1e-4, far below any Holm threshold


def pooled_null(groups: dict[str, Sequence[Any]], distance: Callable[[Any, Any], float], test: str
                ) -> dict[str, Any]:
    """A row's "null" (pooled_p over `groups`: each side's run and its replicates, those that parted from it for
    an end-of-training figure, every window replicate for a lockstep one): the pseudo-F, its p-value, the
    smallest p the group sizes allow, and each group's size; `test` names it in Holm's family and seeds its
    relabellings, so every pair it judges shares it."""
    statistic, p = pooled_p(list(groups.values()), distance, test)
    return {"method": "pooled_permutation", "test": test,
            "statistic": statistic if math.isfinite(statistic) else None, "p_value": p,
            "floor": max(1 / partitions([len(g) for g in groups.values()]), 1 / (PERMUTATIONS + 1)),
            "permutations": PERMUTATIONS, "groups": {name: len(g) for name, g in groups.items()}}


def holm_rejected(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected, keeping the family-wise error at `alpha`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for step, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - step):
            break
        rejected[i] = True
    return rejected


def pseudo_f(squared: np.ndarray, labels: np.ndarray, groups: int) -> np.ndarray:
    """PERMANOVA's pseudo-F of each labelling (rows of `labels`, a group index per point) of the points whose
    squared distances are `squared`: the spread between the groups' centroids over the spread within them, each
    per degree of freedom (Anderson 2001; from distances alone, so any figure's distance serves)."""
    n = squared.shape[0]
    total = float(squared.sum()) / (2 * n)
    onehot = (labels[..., None] == np.arange(groups)).astype(np.float64)  # (labellings, points, groups)
    sizes = onehot[0].sum(axis=0)
    within = (np.einsum("bng,nm,bmg->bg", onehot, squared, onehot) / (2 * sizes)).sum(axis=1)
    between = total - within
    with np.errstate(divide="ignore", invalid="ignore"):
        return (between / (groups - 1)) / (within / (n - groups))


def pooled_p(groups: Sequence[Sequence[Any]], distance: Callable[[Any, Any], float], key: str,
             permutations: int = PERMUTATIONS) -> tuple[float, float]:
    """The pooled permutation test of one end-of-training figure (docs/judge.md, 'The measured null'): each
    framework's run and its replicates that parted are one group; under the null every end state is a draw of the
    same training, so the framework labels are exchangeable. Returns the pseudo-F of the observed labels and its
    p-value, the share of `permutations` random relabellings (seeded by `key`, so a run gives the same bytes) with
    a pseudo-F at least as large, the observed one counted."""
    points = [point for group in groups for point in group]
    labels = np.concatenate([np.full(len(group), g) for g, group in enumerate(groups)])
    n = len(points)
    squared = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            squared[i, j] = squared[j, i] = float(distance(points[i], points[j])) ** 2
    observed = float(pseudo_f(squared, labels[None], len(groups))[0])
    if not np.isfinite(observed):  # no spread within any group: every point of a group equal
        return observed, 1.0 if squared.sum() == 0 else 1 / (permutations + 1)
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    larger = 0
    for start in range(0, permutations, 1000):
        drawn = rng.permuted(np.tile(labels, (min(1000, permutations - start), 1)), axis=1)
        larger += int(np.count_nonzero(pseudo_f(squared, drawn, len(groups)) >= observed * (1 - 1e-12)))
    return observed, (1 + larger) / (permutations + 1)


def partitions(sizes: Sequence[int]) -> int:
    """How many different splits of the pooled points into groups of these sizes there are (groups of one size
    swapped give the same pseudo-F): 1 over it is the smallest p the pooled test could give with every
    relabelling drawn (a null with fewer than 1 / alpha cannot reject)."""
    ways, left = 1, sum(sizes)
    for size in sizes:
        ways *= math.comb(left, size)
        left -= size
    for size in set(sizes):
        ways //= math.factorial(list(sizes).count(size))
    return ways
