"""The measured null: what a framework's own rounding does to a figure once two runs part, and the test against it.

Once two frameworks' runs part, training is chaotic and a figure can no longer be held to a float32 bound. Each
framework's replicates (the shared init moved by one ulp, each batch's rows in an order of their own) show how far
that chaos alone carries a figure; a porting mistake shows as two frameworks further apart than that. For
one figure and one pair, cross_and_within gives the cross-framework and the within-framework distances; rank_sum_p
tests, exactly, that the cross ones are no larger; Ledger.judge_nulls decides every such test of the run at once
with holm_rejected, and smallest_p says when a null is too thin to judge. The samples, the test, its alpha and
what a null too thin does: docs/judge.md, 'The measured null'.

Written with numpy alone (the validation environment has no scipy): the exact distribution is a subset-sum count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def mid_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of `values`, ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), np.float64)
    sorted_values = values[order]
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def rank_sum_p(cross: Sequence[float], within: Sequence[float]) -> float:
    """Exact one-sided p-value that `cross` is stochastically no larger than `within`: the share of all ways to
    pick len(cross) of the pooled values whose rank sum is at least the observed one (Wilcoxon-Mann-Whitney's rank
    sum, ties at mid-ranks; every split counted, so no approximation at small sample sizes)."""
    pooled = np.asarray([*cross, *within], np.float64)
    k = len(cross)
    doubled = np.rint(2 * mid_ranks(pooled)).astype(np.int64)  # mid-ranks are halves: integers when doubled
    observed = int(doubled[:k].sum())
    top = int(doubled.sum())
    # ways[j][s]: subsets of j of the values seen so far whose doubled rank sum is s.
    ways = np.zeros((k + 1, top + 1), np.float64)
    ways[0, 0] = 1.0
    for r in doubled:
        ways[1:, r:] += ways[:-1, :top + 1 - r].copy()
    total = ways[k].sum()
    return float(ways[k, observed:].sum() / total)


def smallest_p(n_cross: int, n_within: int) -> float:
    """The smallest p-value rank_sum_p can give with these sample sizes: every cross value above every within."""
    return 1.0 / math.comb(n_cross + n_within, n_cross)


def cross_and_within(run_a: Any, run_b: Any, reps_a: Sequence[Any], reps_b: Sequence[Any],
                     distance: Callable[[Any, Any], float], parted_a: Sequence[bool], parted_b: Sequence[bool]
                     ) -> tuple[list[float], list[float]]:
    """The K + 1 cross distances of one figure (run_a vs run_b, replicate i of a vs replicate i of b) and its within
    distances (each run vs those of its own replicates that parted from it: up to 2K), `parted_a`, `parted_b`
    saying per replicate which did (docs/judge.md, 'The measured null')."""
    cross = [distance(run_a, run_b), *(distance(a, b) for a, b in zip(reps_a, reps_b, strict=True))]
    within = [*(distance(run_a, a) for a, p in zip(reps_a, parted_a, strict=True) if p),
              *(distance(run_b, b) for b, p in zip(reps_b, parted_b, strict=True) if p)]
    return [float(c) for c in cross], [float(w) for w in within]


def holm_rejected(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected, keeping the family-wise error at `alpha`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for step, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - step):
            break
        rejected[i] = True
    return rejected
