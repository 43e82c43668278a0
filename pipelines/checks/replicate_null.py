"""The validate stage's measured null: what a framework's own rounding does to a figure once two runs part.

Where two frameworks' runs part (their step losses differ beyond tolerances.lockstep_loss_rel), training is
chaotic from that step on, and an end-of-training figure (test loss, test accuracy, prediction disagreement,
BatchNorm running statistics) can no longer be held to a float32 bound. Each framework also trained
`replicates.count` replicates from the shared init moved by one ulp, each batch's rows in an order of their own
(train_export's `train_replicates`; rosetta_common.training.TrainPlan.replicate), replicate i the same experiment
in every framework: one ulp at the start and other summation orders at every step, the two ways two frameworks'
kernels differ. For a figure's distance d (say the
relative difference of two test losses), a pair of frameworks a, b gives

- cross distances: d(run_a, run_b) and d(replicate_a_i, replicate_b_i) for every i (K + 1 values);
- within distances: d(run_a, replicate_a_i) and d(run_b, replicate_b_i) for every replicate i that parted from
  its own run (its step losses beyond tolerances.lockstep_loss_rel somewhere; up to 2K values): what chaos does
  inside one framework once its own rounding has set it off. A replicate still in lockstep with its run at the end is no
  sample of chaos: its distance is a float32 step, and counting it would hold parted runs to the float32 bound
  by another name (TF's cnn replicates stayed in lockstep with TF's run in 13 of 50 runs, seeds 1 to 10).

A porting mistake makes the cross distances larger than the within ones: the check fails when an exact one-sided
permutation test of the rank sum (Wilcoxon-Mann-Whitney, ties at mid-ranks, every split of the pooled values
counted, so no approximation at small K) rejects "the cross distances are no larger" at tolerances.null_alpha,
Holm-corrected over every such test of the run. With K = 5 the smallest p-value possible is 1 / C(16, 6), about
1.2e-4: room for Holm over a few dozen tests. A null too thin to reject at any step of Holm's (its smallest
possible p above alpha; smallest_p) cannot judge: the figure stays held to its float32 bound, and fails. (Against
alpha over the family instead, one failing check elsewhere would widen the family and silence other nulls.)

Written with numpy alone (the validation environment has no scipy); the exact distribution is a subset-sum count.
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
    pick len(cross) of the pooled values whose rank sum is at least the observed one."""
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
    """The K + 1 cross distances of one figure and its within distances, of the replicates that parted from
    their own run (`parted_a`, `parted_b`: per replicate; module docstring)."""
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
