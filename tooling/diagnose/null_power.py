"""The power of the measured null, from its design alone (no run): for params.yaml's replicates and alpha, the
smallest shift of one framework's end-of-training figure, in within-framework standard deviations, that the validate
stage's pooled test (pipelines/checks/replicate_null.py) detects with 80 % power at Holm's first step, for each
family size m (one test per model and figure), with the interim look (`first` parted replicates a framework, the
test accepted where p is above `futility`, else `parted` in all; where the look's floor, 1/280 at `first` 2, is
above alpha / m, every test goes on, as the null_interim stage decides) and with every replicate trained at once;
how often it fails a correct port; how often when one framework's own spread is larger than the others'; and how
many replicates a framework trains with no bug, in expectation. For comparison, the shift an exact per-pair
rank-sum test finds at the same alpha / m with ten replicates per framework, each parted (each pair's K + 1 cross
against 2K within distances).

The model: each framework's run and its P parted replicates end at a figure drawn from N(0, 1); a porting bug moves
one framework's run and all its replicates by the shift; distance |a - b|. Each draw is judged by pseudo_f as
pooled_p judges it: over every relabelling where the groups allow at most EXACT_UP_TO (the interim look's three
groups of 3: 1,680, the exact p), otherwise over 1999 seeded relabellings shared by every draw (pooled_p draws 9999
per test): p from 1/2000, an eighth of alpha / 12; the interim look judges the run and its first replicates
alone. Monte-Carlo, seeded: the same command prints the same table on any machine. docs/judge.md, 'The power of the
null', shows its output.

With --parting, the same test on the groups as a finished run's trainings part (validate's `parting` record in
reports/validation.json): each null-judged model's run and replicates per framework drawn with the correlation their
parting steps give. Two trainings equal up to step p of T and independent after it (a random walk over the steps)
share p / T of their figure's variance: a replicate that follows its run late is a near-copy, and cross-framework
pairs share no more than their runs did. A group that stopped at the interim look is grown to the design's size
(completed), and each draw is judged as the design runs. It prints, per model and family, how often the model fails
with no bug and the shift (in sd of one training's figure) found with 80 % power when each framework in turn
carries it.

    python -m tooling.diagnose.null_power [--samples 2000] [--families 3 6 12] [--parted P] [--first F] [--futility B]
                                 [--spread 3]
    python -m tooling.diagnose.null_power --parting reports/validation.json [--samples 500] [--families 3 6 12]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from tqdm import tqdm

from pipelines.checks.replicate_null import EXACT_UP_TO, every_labelling, labellings, partitions, pseudo_f

REPO = Path(__file__).resolve().parents[2]
POWER = 0.8
FRAMEWORKS = 3  # framework 0 carries the bug or the larger spread
RELABELLINGS = 1999
KEY = "null_power"  # seeds the relabellings, as pooled_p's key does
SHIFTS = np.round(np.arange(0.0, 8.01, 0.25), 2)  # within-framework sd; beyond 8 the table says "> 8"


RANK_SUM_K = 10  # the per-pair rank sum's replicates per framework, for comparison


@dataclass(frozen=True)
class Design:
    """params.yaml's null: parted replicates per framework in all, those before the interim look, its futility
    boundary, and alpha."""

    parted: int
    first: int
    futility: float
    alpha: float


def design() -> Design:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    replicates = params["replicates"]
    return Design(int(replicates["parted"]), int(replicates["first"]), float(replicates["futility"]),
                  float(params["tolerances"]["null_alpha"]))


def seed(key: str) -> int:
    """The seed of the simulation's shared relabellings (pooled_p's `seed`)."""
    return zlib.crc32(key.encode())


def relabellings(points: int, count: int = RELABELLINGS, key: str = KEY) -> np.ndarray:
    """The observed labels (row 0: `points` per framework), then the others pooled_p compares it with: every other
    labelling where the groups allow at most EXACT_UP_TO (pooled_p's exact p), otherwise `count` random ones
    drawn as pooled_p draws them with the seed `key` gives (`seed(key)`)."""
    labels = np.repeat(np.arange(FRAMEWORKS), points)
    if labellings(labels.tolist()) <= EXACT_UP_TO:
        every = np.concatenate(list(every_labelling(labels.tolist())))
        return np.concatenate([labels[None], every[(every != labels).any(axis=1)]])
    rng = np.random.default_rng(seed(key))
    drawn = [rng.permuted(np.tile(labels, (min(1000, count - start), 1)), axis=1) for start in range(0, count, 1000)]
    return np.concatenate([labels[None], *drawn])


def pooled_ps(draws: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each draw's pooled p-value (draws: samples x frameworks x points, the run then its parted replicates)."""
    p = np.empty(len(draws))
    for i, states in enumerate(draws):
        points = states.ravel()
        f = pseudo_f((points[:, None] - points[None, :]) ** 2, labels, FRAMEWORKS)
        p[i] = (1 + np.count_nonzero(f[1:] >= f[0] * (1 - 1e-12))) / len(labels)
    return p


@dataclass(frozen=True)
class Interim:
    """The interim look of a group-sequential design: the relabellings of the run and its first replicates a
    framework, and the futility boundary above which the test is accepted there."""

    first: int
    labels: np.ndarray
    futility: float


def sequential_ps(draws: np.ndarray, labels: np.ndarray, interim: Interim) -> tuple[np.ndarray, np.ndarray]:
    """Each draw's p-value under the interim look (its interim p where that is above the futility boundary, else
    the p of every replicate) and whether it went on to more replicates."""
    early = pooled_ps(draws[:, :, :interim.first + 1], interim.labels)
    more = early <= interim.futility
    p = early.copy()
    if more.any():
        p[more] = pooled_ps(draws[more], labels)
    return p, more


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


def rank_sum_model_p(states: np.ndarray) -> float:
    """The smallest p of the two pairs with framework 0 under the per-pair rank sum: K + 1 cross distances against
    the 2K within distances (frameworks x (K + 1): the run, then its replicates, every one parted)."""
    def pair_p(a: int, b: int) -> float:
        within = np.concatenate([np.abs(states[a, 0] - states[a, 1:]), np.abs(states[b, 0] - states[b, 1:])])
        return rank_sum_p(np.abs(states[a] - states[b]), within)
    return min(pair_p(0, 1), pair_p(0, 2))


def power_curve(draws: np.ndarray, alphas: Sequence[float], labels: np.ndarray | None = None,
                desc: str = "pooled", interim: Interim | None = None) -> np.ndarray:
    """(shifts x alphas): the share of draws in which the moved framework is found at each alpha, by the pooled test
    over `labels` (after `interim`'s look, where given) or, without them, by the per-pair rank sum; from shift 0 up
    to the first shift where every alpha has POWER (the rows beyond are not needed)."""
    rows = []
    for shift in tqdm(SHIFTS, desc=desc, unit="shift", file=sys.stderr):
        moved = draws.copy()
        moved[:, 0] += shift
        if labels is None:
            rows.append([(np.array([rank_sum_model_p(s) for s in moved]) <= alpha).mean() for alpha in alphas])
        else:
            rows.append([(p <= alpha).mean() for p, alpha in zip(judged_ps(moved, labels, alphas, interim), alphas,
                                                                 strict=True)])
        if min(rows[-1]) >= POWER:
            break
    return np.array(rows)


def shift_at(curve: np.ndarray) -> float | None:
    """The shift where power first reaches POWER (linear between grid points), None beyond the grid."""
    above = np.nonzero(curve >= POWER)[0]
    if not len(above):
        return None
    i = int(above[0])
    if i == 0:
        return float(SHIFTS[0])
    lo, hi = curve[i - 1], curve[i]
    return float(SHIFTS[i - 1] + (POWER - lo) / (hi - lo) * (SHIFTS[i] - SHIFTS[i - 1]))


def false_failures(draws: np.ndarray, spread: float, alphas: Sequence[float], labels: np.ndarray,
                   interim: Interim | None = None) -> list[float]:
    """With no bug but framework 0's spread `spread` times the others': how often the pooled test (after
    `interim`'s look, where given) fails at each alpha."""
    wide = draws.copy()
    wide[:, 0] *= spread
    return [float((p <= alpha).mean()) for p, alpha in zip(judged_ps(wide, labels, alphas, interim), alphas,
                                                             strict=True)]


def judged_ps(draws: np.ndarray, labels: np.ndarray, alphas: Sequence[float], interim: Interim | None
              ) -> list[np.ndarray]:
    """Each draw's p-value as validate judges it at each alpha / m: after `interim`'s look where its floor (the
    smallest p of the first replicates' groups) is at most alpha / m, as the null_interim stage decides;
    otherwise, and without a look, on every replicate (the look then sends every test on)."""
    looks = interim is not None and [interim_floor(interim) <= alpha for alpha in alphas]
    looked = sequential_ps(draws, labels, interim)[0] if looks and any(looks) else None
    every = pooled_ps(draws, labels) if not looks or not all(looks) else None
    return [looked if looks and look else every for look, alpha in zip(looks or alphas, alphas, strict=True)]


def interim_floor(interim: Interim) -> float:
    """The smallest p the interim look's groups allow (replicate_null.partitions)."""
    return 1 / partitions([interim.first + 1] * FRAMEWORKS)


def found(curve: np.ndarray, alpha: float, floor: float) -> str:
    shift = shift_at(curve)
    return "never (alpha / m below the smallest p)" if alpha < floor else \
        f"> {SHIFTS[-1]:g} sd" if shift is None else f"{shift:.2f} sd"


def table(null: Design, count: int, families: Sequence[int], samples: int, spread: float, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    draws = rng.standard_normal((samples, FRAMEWORKS, null.parted + 1))
    ranked = rng.standard_normal((samples, FRAMEWORKS, count + 1))
    labels = relabellings(null.parted + 1)
    interim = Interim(null.first, relabellings(null.first + 1), null.futility)
    alphas = [null.alpha / m for m in families]
    curve = power_curve(draws, alphas, labels, "interim look", interim)
    at_once = power_curve(draws, alphas, labels, "at once")
    wrong = false_failures(draws, 1.0, alphas, labels, interim)
    wide = false_failures(draws, spread, alphas, labels, interim)
    ranked_curve = power_curve(ranked, alphas, desc="rank sum")
    more = float(sequential_ps(draws, labels, interim)[1].mean())
    floor = 1 / len(labels)
    lines = [f"P = {null.parted} parted replicates per framework ({null.parted + 1} points a group), the interim look "
             f"after {null.first} (accepting p above {null.futility:g}), alpha {null.alpha:g}, {samples} draws, "
             f"{RELABELLINGS} relabellings: smallest p {floor:.3g}. With no bug the look sends a test on {more:.3f} "
             f"of the time: {null.first + more * (null.parted - null.first):.2f} parted replicates a framework in "
             "expectation, for a model with one test.", "",
             f"| family size m | alpha / m | shift found with 80 % power | all {null.parted} at once: shift found | "
             f"false failures | false failures, one framework's spread x{spread:g} | per-pair rank sum, K = {count}: "
             "shift found |",
             "| --: | --: | --: | --: | --: | --: | --: |"]
    for j, m in enumerate(families):
        lines.append(f"| {m} | {alphas[j]:.4g} | {found(curve[:, j], alphas[j], floor)} | "
                     f"{found(at_once[:, j], alphas[j], floor)} | {wrong[j]:.3f} | {wide[j]:.3f} | "
                     f"{found(ranked_curve[:, j], alphas[j], 0.0)} |")
    return "\n".join(lines)


PARTING_FRAMEWORKS = ("torch", "tf", "jax")  # validate's order; framework i of a draw is the i-th here


def parting_correlation(record: dict, frameworks: Sequence[str] = PARTING_FRAMEWORKS) -> np.ndarray:
    """The correlation of a model's trainings' end-of-training figures under the random-walk model of how they part
    (the module's docstring), from validate's `parting` record: per framework, its run then its replicates in the
    record's order. A pair's shared steps: the recorded parting step (None, never parted: all T); across
    frameworks, at most what each shares with its run and what the runs share. Measured steps need not nest as a
    tree's do (a parting step is where a pair's loss first differs beyond a tolerance), so the matrix is projected
    onto the nearest correlation matrix (negative eigenvalues set to 0, the diagonal back to 1)."""
    steps = int(record["steps"])

    def shared(step: int | None) -> float:
        return float(steps if step is None else min(step, steps))

    groups = [record["within"][fw] for fw in frameworks]
    sizes = [len(group["run"]) + 1 for group in groups]
    starts = np.cumsum([0, *sizes])
    matrix = np.zeros((starts[-1], starts[-1]))
    for start, size, group in zip(starts[:-1], sizes, groups, strict=True):
        block = np.full((size, size), float(steps))
        for i, step in enumerate(group["run"], start=1):
            block[0, i] = block[i, 0] = shared(step)
        for (i, j), step in zip(itertools.combinations(range(1, size), 2), group["replicates"], strict=True):
            block[i, j] = block[j, i] = shared(step)
        matrix[start:start + size, start:start + size] = block
    pair = record["across"]
    for a, b in itertools.combinations(range(len(frameworks)), 2):
        runs = shared(pair.get(f"{frameworks[a]}|{frameworks[b]}", pair.get(f"{frameworks[b]}|{frameworks[a]}")))
        for i in range(sizes[a]):
            for j in range(sizes[b]):
                value = min(matrix[starts[a], starts[a] + i], runs, matrix[starts[b], starts[b] + j])
                matrix[starts[a] + i, starts[b] + j] = matrix[starts[b] + j, starts[a] + i] = value
    values, vectors = np.linalg.eigh(matrix / steps)
    nearest = (vectors * np.clip(values, 0.0, None)) @ vectors.T
    scale = 1 / np.sqrt(np.diag(nearest))
    return nearest * scale[:, None] * scale[None, :]


def parting_draws(correlation: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """`samples` draws of the figures (samples x frameworks x points) with that correlation, sd 1 each."""
    values, vectors = np.linalg.eigh(correlation)
    root = vectors * np.sqrt(np.clip(values, 0.0, None))
    flat = rng.standard_normal((samples, len(correlation))) @ root.T
    return flat.reshape(samples, FRAMEWORKS, -1)


def completed(record: dict, parted: int) -> dict:
    """The record with every framework's group grown to `parted` replicates, as the design trains them when a test
    goes on past the interim look: a replicate the run did not train parts from the run, and from each other
    replicate, at the median of the framework's recorded steps (never parted: T)."""
    steps = int(record["steps"])
    within = {}
    for fw, group in record["within"].items():
        runs = [steps if s is None else s for s in group["run"]]
        pairs = [steps if s is None else s for s in group["replicates"]] or runs
        have = len(runs)
        run_median, pair_median = int(np.median(runs)), int(np.median(pairs))
        by_pair = dict(zip(itertools.combinations(range(have), 2), pairs, strict=False))
        within[fw] = {"run": runs + [run_median] * (parted - have),
                      "replicates": [by_pair.get((i, j), pair_median)
                                     for i, j in itertools.combinations(range(parted), 2)]}
    return {**record, "within": within}


def moved_curve(draws: np.ndarray, framework: int, alphas: Sequence[float], labels: np.ndarray,
                interim: Interim) -> np.ndarray:
    """power_curve with the shift carried by `framework` (power_curve moves framework 0)."""
    order = [framework, *(f for f in range(FRAMEWORKS) if f != framework)]
    return power_curve(draws[:, order], alphas, labels, f"moved {PARTING_FRAMEWORKS[framework]}", interim)


def parting_table(records: Sequence[dict], null: Design, families: Sequence[int], samples: int,
                  seed: int = 0) -> str:
    """Per null-judged model of a run (its `parting` records) and family size, the design as it runs (the interim
    look, then every replicate) on the groups as they part: false failures with no bug and the shift found with
    80 % power by the framework that carries it."""
    alphas = [null.alpha / m for m in families]
    labels = relabellings(null.parted + 1)
    interim = Interim(null.first, relabellings(null.first + 1), null.futility)
    floor = 1 / len(labels)
    lines = ["| model | trained a group | earliest across / median run vs replicate | family size m | alpha / m | "
             "false failures | shift found with 80 % power, carried by torch / tf / jax |",
             "| --- | --: | --- | --: | --: | --: | --- |"]
    for record in records:
        trained = {len(record["within"].get(fw, {}).get("run", [])) + 1 for fw in PARTING_FRAMEWORKS}
        if len(trained) != 1 or min(trained) < 2 or max(trained) > null.parted + 1:
            lines.append(f"| {record['model']} | {sorted(trained)}: not drawn | | | | | |")
            continue
        points = trained.pop()
        rng = np.random.default_rng([seed, zlib.crc32(record["model"].encode())])
        draws = parting_draws(parting_correlation(completed(record, null.parted)), samples, rng)
        wrong = judged_ps(draws, labels, alphas, interim)
        curves = [moved_curve(draws, f, alphas, labels, interim) for f in range(FRAMEWORKS)]
        runs = [record["steps"] if s is None else s for fw in PARTING_FRAMEWORKS for s in record["within"][fw]["run"]]
        across = min((s for s in record["across"].values() if s is not None), default=None)
        for j, m in enumerate(families):
            lines.append(f"| {record['model']} | {f'{points} points' if j == 0 else ''} | "
                         f"{'never' if across is None else across} / {float(np.median(runs)):g} | {m} | "
                         f"{alphas[j]:.4g} | {(wrong[j] <= alphas[j]).mean():.3f} | "
                         f"{' / '.join(found(curve[:, j], alphas[j], floor) for curve in curves)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    null = design()
    parser = argparse.ArgumentParser(prog="python -m tooling.diagnose.null_power", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parted", type=int, default=null.parted,
                        help=f"parted replicates per framework (params.yaml: {null.parted})")
    parser.add_argument("--first", type=int, default=null.first,
                        help=f"parted replicates per framework before the interim look (params.yaml: {null.first})")
    parser.add_argument("--futility", type=float, default=null.futility,
                        help=f"the interim look accepts p above this (params.yaml: {null.futility})")
    parser.add_argument("--samples", type=int, default=2000, help="Monte-Carlo draws (default 2000)")
    parser.add_argument("--families", type=int, nargs="+", default=[3, 6, 12], help="Holm family sizes m")
    parser.add_argument("--spread", type=float, default=3.0, help="one framework's spread over the others'")
    parser.add_argument("--parting", type=Path, default=None,
                        help="a run's reports/validation.json: draw each null-judged model's groups as they part")
    args = parser.parse_args(argv)
    problems = [f"--parted {args.parted}: must be a whole number, at least 1" if args.parted < 1 else "",
                f"--samples {args.samples}: must be a whole number, at least 10" if args.samples < 10 else "",
                f"--families {min(args.families)}: each family size at least 1" if min(args.families) < 1 else "",
                f"--spread {args.spread}: must be above 0" if not args.spread > 0 else "",
                f"--first {args.first}: must be a whole number from 1 to --parted ({args.parted})"
                if not 1 <= args.first <= args.parted else "",
                f"--futility {args.futility}: must be above 0 and at most 1" if not 0 < args.futility <= 1 else ""]
    for problem in filter(None, problems):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.parting is not None:
        try:
            records = json.loads(args.parting.read_text())["parting"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"error: --parting {args.parting}: not a validate report with a parting record ({error})",
                  file=sys.stderr)
            return 2
        print(parting_table(records, Design(args.parted, args.first, args.futility, null.alpha), args.families,
                            args.samples))
        return 0
    print(table(Design(args.parted, args.first, args.futility, null.alpha), RANK_SUM_K, args.families, args.samples,
                args.spread))
    return 0


if __name__ == "__main__":
    sys.exit(main())
