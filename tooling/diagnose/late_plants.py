"""The measured null's power against porting mistakes that act only after the runs part, measured on real trainings.

A mistake that starts after the lockstep window (a learning rate off by a factor, a weight decay switched on, label
smoothing, a BatchNorm momentum, from epoch E // 2 + 1 of E on) reaches no lockstep check and no float32 bound of
runs that have parted: only the end-of-training null can see it. This tool measures what that null does with it,
from trainings and not from a model of them.

`train` trains, for each model, a pool per framework: the run and replicates 1 to R, exactly as train_export and
the replicates stage train them (tooling/diagnose/late_plants_worker.py, in each framework's environment through
the runner), and in JAX the same pool again under each planted mistake. `judge` then runs the design as the
pipeline runs it, many times over: each draw takes each framework's run and its replicates in an order of its own,
keeps those that parted from their run, judges the run and its first `replicates.first` at the interim look (a
model whose every figure gives p above `replicates.futility` is accepted there) and the others on
`replicates.parted` each, with the validate stage's pooled test (replicate_null's pseudo-F, its p as pooled_p
computes it: exact over every relabelling at the look; with every replicate, 9,999 random relabellings, drawn once
and shared by the draws) on each end-of-training figure (test loss, test accuracy, prediction disagreement, each
with validate's distance) that some pair of runs misses its float32 bound on. A
model fails a draw where any such figure gives p at most alpha / m (Holm's first step, a family of m tests). It
prints, per model and plant, the shift of the planted framework's mean test loss in its own replicates' standard
deviations and the share of draws that fail: with no plant, how often a faithful port fails; with one, the power.
The draws resample one pool of R trainings per framework, so they are not independent: a share is the design's
power on one seed's trainings; `train` in a checkout of each seed (params.yaml's seed, its data and init stages
run), then one `judge` over every seed's files, prints a column per seed. Each row's draws are seeded by the row
itself, so the same files give the same table on any machine, whatever else is judged beside them.

    python -m tooling.diagnose.late_plants train [--models cnn resnet text_transformer] [--replicates 12] --out DIR
    python -m tooling.diagnose.late_plants judge DIR/*.jsonl [--draws 200] [--families 3 6 12]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks.parity import END_OF_TRAINING
from pipelines.checks.replicate_null import PERMUTATIONS, pseudo_f
from pipelines.environments import REPO_ROOT
from rosetta_common.errors import RosettaError
from rosetta_common.metrics import parting_step
from rosetta_common.spec import FRAMEWORKS, Spec, load_spec
from tooling.diagnose.null_power import relabellings

PLANTED = "jax"
# Per model, the plants `train` makes: around the smallest that the default design catches 4 times in 5 (a BatchNorm
# momentum only in the model that has BatchNorm); a model not named takes LABEL_SMOOTHING's sizes and the cnn's others.
LABEL_SMOOTHING = [("ls", 0.001), ("ls", 0.003), ("ls", 0.01)]
PLANTS = {"cnn": [("lr", 0.1), ("lr", 0.15), ("lr", 0.2), ("wd", 5e-5), ("wd", 1e-4), ("wd", 2e-4),
                  *LABEL_SMOOTHING],
          "resnet": [("lr", 0.01), ("lr", 0.02), ("lr", 0.05), ("wd", 2e-4), ("wd", 5e-4), ("wd", 1e-3),
                     ("wd", 2e-3), *LABEL_SMOOTHING, ("bn", 0.8), ("bn", 0.5), ("bn", 0.1)],
          "text_transformer": [("lr", 0.01), ("lr", 0.03), ("wd", 1e-5), ("wd", 3e-5), ("wd", 1e-4),
                               *LABEL_SMOOTHING]}
Key = tuple[int, str, str, str, float]  # seed, model, framework, plant, size
PLANT_NAMES = {"none": "no plant", "lr": "learning rate x (1 + {size:g})", "wd": "weight decay {size:g}",
               "ls": "label smoothing {size:g}", "bn": "BatchNorm momentum {size:g} (0.9 before)"}


@dataclass(frozen=True)
class Pool:
    """One framework's trainings of a model under one plant: the run (index 0) and its replicates."""

    run: dict[str, Any]
    replicates: list[dict[str, Any]]  # those that parted from the run, in index order


def read_pools(files: Sequence[Path], tolerance: float) -> dict[Key, Pool]:
    """Every worker's JSON lines, as pools keyed (seed, model, framework, plant, size); a replicate that never
    parted from its run is dropped, as validate drops it (replicates.null_group)."""
    rows: dict[Key, dict[int, dict[str, Any]]] = {}
    for path in files:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            key = (int(row["seed"]), row["model"], row["framework"], row["plant"], float(row["size"]))
            rows.setdefault(key, {})[int(row["index"])] = {**row, "test_predictions":
                                                           np.asarray(row["test_predictions"])}
    pools = {}
    for key, by_index in rows.items():
        if 0 not in by_index:
            raise RosettaError(f"{key}: no run (index 0) among its {len(by_index)} trainings")
        run = by_index[0]
        reps = [by_index[i] for i in sorted(by_index) if i > 0
                and parting_step(by_index[i]["step_losses"], run["step_losses"], tolerance) is not None]
        pools[key] = Pool(run, reps)
    return pools


def beyond_bound(spec: Spec, runs: Sequence[dict[str, Any]]) -> dict[str, bool]:
    """Per end-of-training figure, whether some pair of the runs misses its float32 bound: only those figures are
    judged by the null (parity.judge_end; prediction disagreement has none, so any differing prediction)."""
    tol = spec.tolerances
    bounds = {"test_loss_rel": tol.test_loss_rel, "test_accuracy_diff_points": tol.test_accuracy_points,
              "prediction_disagreement": 0.0}
    return {key: any(END_OF_TRAINING[key](a, b) > bounds[key] for a, b in itertools.combinations(runs, 2))
            for key in END_OF_TRAINING}


def squared_distances(groups: Sequence[Pool], key: str) -> np.ndarray:
    """The figure's squared distance (parity.END_OF_TRAINING, as validate measures it) between every two trainings
    of the pools, in order: each pool's run, then its parted replicates."""
    points = [t for pool in groups for t in [pool.run, *pool.replicates]]
    squared = np.zeros((len(points), len(points)))
    for i, j in itertools.combinations(range(len(points)), 2):
        squared[i, j] = squared[j, i] = END_OF_TRAINING[key](points[i], points[j]) ** 2
    return squared


def p_value(squared: np.ndarray, labels: np.ndarray) -> float:
    """pooled_p's p-value of the points whose squared distances are `squared` (each framework's run and its
    replicates, in order), over `labels`: the observed labelling, then every other (the exact p) or random ones."""
    if squared.sum() == 0:  # every point equal: no labelling is more extreme than any other (pooled_p)
        return 1.0
    f = pseudo_f(squared, labels, len(FRAMEWORKS))
    return float((1 + np.count_nonzero(f[1:] >= f[0] * (1 - 1e-12))) / len(labels))


def one_draw(spec: Spec, groups: Sequence[Pool], squared: dict[str, np.ndarray], labels: dict[int, np.ndarray],
             rng: np.random.Generator) -> dict[str, float]:
    """The design once on `groups` (each framework's replicates in an order drawn by `rng`): the p-value of each
    judged figure (`squared`), from the interim look where it accepts the model, else from `replicates.parted`
    replicates (`labels`, by replicates a framework: the relabellings)."""
    settings = spec.replicates
    starts = np.cumsum([0, *(1 + len(g.replicates) for g in groups)])[:-1]
    order = [start + 1 + rng.permutation(len(g.replicates)) for start, g in zip(starts, groups, strict=True)]

    def test(size: int) -> dict[str, float]:
        chosen = np.concatenate([[start, *picked[:size]] for start, picked in zip(starts, order, strict=True)])
        return {key: p_value(matrix[np.ix_(chosen, chosen)], labels[size]) for key, matrix in squared.items()}

    look = test(settings.first)
    if all(p > settings.futility for p in look.values()):
        return look
    return test(settings.parted)


def loss_shift(planted: Pool, unplanted: Pool) -> tuple[float, float]:
    """The planted pool's mean test loss minus the unplanted one's, in the unplanted trainings' standard deviation,
    and its standard error (each pool's run and parted replicates)."""
    a = np.array([r["test_loss"] for r in [planted.run, *planted.replicates]])
    b = np.array([r["test_loss"] for r in [unplanted.run, *unplanted.replicates]])
    sd = b.std(ddof=1)
    return float((a.mean() - b.mean()) / sd), float(np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)) / sd)


def judge_one(spec: Spec, groups: Sequence[Pool], unplanted: Pool, key: Key, draws: int, families: Sequence[int],
              labels: dict[int, np.ndarray]) -> dict[str, Any]:
    """One seed, model and plant (`key`, which seeds the draws): the loss shift and, per family size m, the share
    of `draws` that fail (`labels`: one_draw's relabellings)."""
    settings = spec.replicates
    short = [len(g.replicates) for g in groups if len(g.replicates) < settings.parted]
    if short:
        raise RosettaError(f"{key}: {short} parted replicates; the design needs {settings.parted} a framework")
    judged = beyond_bound(spec, [g.run for g in groups])
    squared = {figure: squared_distances(groups, figure) for figure, on in judged.items() if on}
    rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
    p_values = [one_draw(spec, groups, squared, labels, rng) for _ in range(draws)]
    failed = {m: float(np.mean([any(p <= spec.tolerances.null_alpha / m for p in ps.values()) for ps in p_values]))
              for m in families}
    shift, se = loss_shift(groups[-1], unplanted)
    return {"seed": key[0], "model": key[1], "plant": key[3], "size": key[4], "shift_sd": shift, "shift_se": se,
            "judged": sorted(squared), "failed": failed, "replicates": [len(g.replicates) for g in groups]}


def judge(spec: Spec, pools: dict[Key, Pool], draws: int, families: Sequence[int]) -> list[dict[str, Any]]:
    """Every seed, model and JAX plant of `pools`, against the same seed and model's unplanted pools."""
    rows = []
    settings = spec.replicates  # the relabellings of the look's groups and of the whole design's, drawn once
    labels = {size: relabellings(size + 1, PERMUTATIONS) for size in (settings.first, settings.parted)}
    for key in sorted((k for k in pools if k[2] == PLANTED), key=lambda k: (k[1], k[0], k[3] != "none", k[3:])):
        seed, model = key[:2]
        others = [pools.get((seed, model, fw, "none", 0.0)) for fw in FRAMEWORKS if fw != PLANTED]
        unplanted = pools.get((seed, model, PLANTED, "none", 0.0))
        if any(p is None for p in [*others, unplanted]):
            raise RosettaError(f"seed {seed} {model}: every framework needs an unplanted pool (plant none)")
        print(f"late_plants: judging seed {seed} {model} {key[3]} {key[4]:g}", file=sys.stderr, flush=True)
        rows.append(judge_one(spec, [*others, pools[key]], unplanted, key, draws,  # type: ignore[list-item]
                              families, labels))
    return rows


def table(rows: Sequence[dict[str, Any]], family: int) -> list[str]:
    """The rows as one Markdown table at family size `family`: per model and plant, each seed's share of draws
    that fail, and the planted pool's test-loss shift."""
    seeds = sorted({row["seed"] for row in rows})
    lines = ["| model | planted in jax, from epoch E // 2 + 1 on | "
             + " | ".join(f"seed {s}: fails (loss shift)" for s in seeds) + " |",
             "| --- | --- | " + " | ".join("--:" for _ in seeds) + " |"]
    cells: dict[tuple[str, str, float], dict[int, str]] = {}
    for row in rows:
        shift = "" if row["plant"] == "none" else f" ({row['shift_sd']:+.1f} sd)"
        cells.setdefault((row["model"], row["plant"], row["size"]), {})[row["seed"]] = \
            f"{row['failed'][family]:.2f}{shift}"
    for (model, plant, size), by_seed in cells.items():
        lines.append(f"| {model} | {PLANT_NAMES[plant].format(size=size)} | "
                     + " | ".join(by_seed.get(s, "") for s in seeds) + " |")
    return lines


def train(seed: int, models: Sequence[str], replicates: int, out: Path) -> None:
    """Each framework's unplanted pool and JAX's planted ones, one worker process each, one after another."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(fw, m, "none", 0.0) for m in models for fw in FRAMEWORKS]
    jobs += [(PLANTED, m, p, s) for m in models for p, s in PLANTS.get(m, PLANTS["cnn"][:6] + LABEL_SMOOTHING)]
    for fw, model, plant, size in jobs:
        target = out / f"seed{seed}-{fw}-{model}-{plant}-{size:g}.jsonl"
        print(f"late_plants: {fw} {model} {plant} {size:g} -> {target}", flush=True)
        command = [sys.executable, "-m", "pipelines.runner", fw, "--", "python", "-m",
                   "tooling.diagnose.late_plants_worker", fw, model, plant, str(size), str(replicates),
                   str(target.resolve())]
        if subprocess.run(command, cwd=REPO_ROOT, check=False).returncode != 0:
            raise RosettaError(f"{fw} {model} {plant} {size:g}: the worker failed (its output above)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tooling.diagnose.late_plants", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("train", help="train each framework's pool and JAX's planted pools")
    make.add_argument("--models", nargs="+", default=list(PLANTS))
    make.add_argument("--replicates", type=int, default=12)
    make.add_argument("--out", type=Path, required=True)
    judged = sub.add_parser("judge", help="run the design on the pools, many times over")
    judged.add_argument("pools", nargs="+", type=Path)
    judged.add_argument("--draws", type=int, default=200)
    judged.add_argument("--families", type=int, nargs="+", default=[3, 6, 12])
    args = parser.parse_args(argv)
    spec = load_spec(paths.PARAMS)
    try:
        if args.command == "train":
            unknown = [m for m in args.models if m not in spec.models]
            if unknown or args.replicates < spec.replicates.parted:
                raise RosettaError(f"--models {unknown}: not in params.yaml's models" if unknown else
                                   f"--replicates: {args.replicates}: at least replicates.parted "
                                   f"({spec.replicates.parted})")
            train(spec.seed, args.models, args.replicates, args.out)
            return 0
        if args.draws < 1 or any(m < 1 for m in args.families):
            raise RosettaError(f"--draws {args.draws}, --families {args.families}: each at least 1")
        pools = read_pools(args.pools, spec.tolerances.lockstep_loss_rel)
        rows = judge(spec, pools, args.draws, args.families)
    except (RosettaError, OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for m in args.families:
        print(f"\nFamily of m = {m} tests (alpha / m = {spec.tolerances.null_alpha / m:.4g}); {args.draws} draws:\n")
        print("\n".join(table(rows, m)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
