"""The measured null: what a framework's own rounding does to a figure, and the test against it.

Once two frameworks' runs part, training is chaotic and a figure can no longer be held to a float32 bound. Each
framework's replicates (the shared init moved by one ulp, each batch's rows in an order of their own) show how far
that chaos alone carries a figure; a porting mistake shows as one framework further from the others than that.
For one model and figure, pooled_p pools every framework's run and replicates and asks, by permuting the framework
labels, whether the frameworks' groups lie further apart than their own spread (PERMANOVA's pseudo-F); pooled_null
records it for a row, partitions gives the smallest p its groups allow (its floor), and Ledger.judge_nulls decides
every test of the run at once with holm_rejected, which is statsmodels' multipletests (method "holm"), failing a
test that Holm could not reject even at its floor (floor_thresholds). The samples, the test, its alpha and what a
null too thin does: docs/judge.md, 'The measured null'. The permutation test is written with numpy alone (pseudo_f
says why no library's).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

PERMUTATIONS = 9999  # pooled_p's random relabellings where there are too many to enumerate: p from 1e-4
# pooled_p enumerates every relabelling, and so gives the exact p, where the groups allow at most this many (three
# groups of 3: 1,680; of 4, 4 and 3: 11,550; of 6, 3 and 3: 18,480): about half a second of numpy at the most. More
# (three groups of 4: 34,650; of 6: 17 million) are drawn instead.
EXACT_UP_TO = 20_000


def pooled_null(groups: dict[str, Sequence[Any]], distance: Callable[[Any, Any], float], test: str
                ) -> dict[str, Any]:
    """A row's "null" (pooled_p over `groups`: each side's run and its replicates, those that parted from it for
    an end-of-training figure, every window replicate for a lockstep one): the pseudo-F, its p-value, whether
    that p is exact (every relabelling) or drawn, the smallest p the group sizes allow, and each group's size;
    `test` names it in Holm's family, so every pair it judges shares it."""
    statistic, p = pooled_p(list(groups.values()), distance, test)
    sizes = [len(g) for g in groups.values()]
    count = labellings([g for g, size in enumerate(sizes) for _ in range(size)])
    exact = count <= EXACT_UP_TO
    return {"method": "pooled_permutation", "test": test,
            "statistic": statistic if math.isfinite(statistic) else None, "p_value": p,
            "floor": 1 / partitions(sizes) if exact else max(1 / partitions(sizes), 1 / (PERMUTATIONS + 1)),
            "exact": exact, "permutations": count if exact else PERMUTATIONS,
            "groups": {name: len(g) for name, g in groups.items()}}


def holm_rejected(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected, keeping the family-wise error at `alpha`
    (statsmodels' multipletests, method "holm"; an empty family rejects nothing)."""
    # Imported here, not at the top: statsmodels is in the validation environment, where Ledger.judge_nulls calls
    # this; the orchestrator's environment, which has none, imports this module too (the ledger's check names for
    # the report, pseudo_f and the relabellings for tooling/diagnose/null_power).
    from statsmodels.stats.multitest import multipletests

    return [bool(rejected) for rejected in multipletests(list(p_values), alpha=alpha, method="holm")[0]]


def floor_thresholds(p_values: Sequence[float], floors: Sequence[float], alpha: float) -> list[float]:
    """For each test of a Holm family, Holm's threshold at the rank its floor (the smallest p its groups allow)
    would take among the other tests' p-values: alpha over the tests not below it. A test whose floor lies above
    it could not be rejected whatever its figures, so accepting it would be a pass by construction (Ledger.
    judge_nulls fails it). A floor at most alpha / m meets it in any family of m (null_interim's criterion, made
    before the other tests' final p-values exist)."""
    m = len(p_values)
    return [alpha / (m - sum(p < floor for j, p in enumerate(p_values) if j != i)) for i, floor in enumerate(floors)]


def pseudo_f(squared: np.ndarray, labels: np.ndarray, groups: int) -> np.ndarray:
    """PERMANOVA's pseudo-F of each labelling (rows of `labels`, a group index per point) of the points whose
    squared distances are `squared`: the spread between the groups' centroids over the spread within them, each
    per degree of freedom (Anderson 2001; from distances alone, so any figure's distance serves). Ours, not a
    library's: scipy has no PERMANOVA, and scikit-bio's `permanova` draws random permutations only, while pooled_p
    enumerates every relabelling exactly up to EXACT_UP_TO."""
    n = squared.shape[0]
    total = float(squared.sum()) / (2 * n)
    onehot = (labels[..., None] == np.arange(groups)).astype(np.float64)  # (labellings, points, groups)
    sizes = onehot[0].sum(axis=0)
    within = (np.einsum("bng,nm,bmg->bg", onehot, squared, onehot) / (2 * sizes)).sum(axis=1)
    between = total - within
    with np.errstate(divide="ignore", invalid="ignore"):
        return (between / (groups - 1)) / (within / (n - groups))


def pooled_p(groups: Sequence[Sequence[Any]], distance: Callable[[Any, Any], float], key: str = "",
             permutations: int = PERMUTATIONS, seed: int | None = None) -> tuple[float, float]:
    """The pooled permutation test of one end-of-training figure (docs/judge.md, 'The measured null'): each
    framework's run and its replicates that parted are one group; under the null every end state is a draw of the
    same training, so the framework labels are exchangeable. Returns the pseudo-F of the observed labels and its
    p-value: the share of relabellings with a pseudo-F at least as large, the observed one counted. Where the
    groups allow at most EXACT_UP_TO relabellings, every one (the exact p, which no draw decides); otherwise
    `permutations` random ones, seeded by the points themselves (so the same figures give the same p, whatever
    the test is called) unless `seed` is given (tooling/diagnose/null_power shares one set of relabellings over its
    simulated draws). `key` names the test for the caller; it seeds nothing."""
    points = [point for group in groups for point in group]
    labels = np.concatenate([np.full(len(group), g) for g, group in enumerate(groups)])
    n = len(points)
    squared = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            squared[i, j] = squared[j, i] = float(distance(points[i], points[j])) ** 2
    if squared.sum() == 0:  # every point equal: no labelling is more extreme than any other
        return math.nan, 1.0
    observed = float(pseudo_f(squared, labels[None], len(groups))[0])
    # At least as large, relatively, as the observed pseudo-F; an observed infinity (no spread within any group)
    # is matched only by the labellings that also leave none.
    bar = observed * (1 - 1e-12) if math.isfinite(observed) else math.inf
    if labellings(labels.tolist()) <= EXACT_UP_TO:
        total = larger = 0
        for chunk in every_labelling(labels.tolist()):
            total += len(chunk)
            larger += int(np.count_nonzero(pseudo_f(squared, chunk, len(groups)) >= bar))
        return observed, larger / total
    if seed is None:
        seed = int.from_bytes(hashlib.sha256(squared.tobytes() + labels.tobytes()).digest()[:8])
    rng = np.random.default_rng(seed)
    larger = 0
    for start in range(0, permutations, 1000):
        drawn = rng.permuted(np.tile(labels, (min(1000, permutations - start), 1)), axis=1)
        larger += int(np.count_nonzero(pseudo_f(squared, drawn, len(groups)) >= bar))
    # Never below the exact p's own lower bound: the observed split and its equivalents (groups of one size
    # swapped) are 1 / partitions of every labelling, a share a lucky draw can miss (three groups of 4: 1 / 5,775,
    # where 9,999 draws allow 1e-4).
    return observed, max((1 + larger) / (permutations + 1), 1 / partitions([len(g) for g in groups]))


def labellings(labels: Sequence[int]) -> int:
    """How many different labellings of the points keep each group's size (the multinomial coefficient)."""
    ways, left = 1, len(labels)
    for size in np.bincount(np.asarray(labels, dtype=np.int64)).tolist():
        ways *= math.comb(left, size)
        left -= size
    return ways


def every_labelling(labels: Sequence[int], chunk: int = 1000) -> Iterator[np.ndarray]:
    """Every labelling of the points that keeps each group's size, the observed one among them, `chunk` rows at a
    time: each group's positions chosen in turn from those left."""
    sizes = np.bincount(np.asarray(labels, dtype=np.int64)).tolist()
    n = len(labels)

    def fill(left: tuple[int, ...], group: int) -> Iterator[dict[int, int]]:
        if group == len(sizes) - 1:
            yield dict.fromkeys(left, group)
            return
        for chosen in itertools.combinations(left, sizes[group]):
            rest = tuple(i for i in left if i not in chosen)
            for tail in fill(rest, group + 1):
                yield {**dict.fromkeys(chosen, group), **tail}

    rows: list[list[int]] = []
    for assignment in fill(tuple(range(n)), 0):
        rows.append([assignment[i] for i in range(n)])
        if len(rows) == chunk:
            yield np.asarray(rows)
            rows = []
    if rows:
        yield np.asarray(rows)


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
