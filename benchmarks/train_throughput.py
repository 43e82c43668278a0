"""Training throughput: our train() beside each framework's idiomatic loop, on the same model, data and batch.

    .venv/bin/python benchmarks/train_throughput.py            # both scales, all frameworks and six models
    .venv/bin/python benchmarks/train_throughput.py --tricks   # also times each named trick and parity requirement
    .venv/bin/python benchmarks/train_throughput.py --frameworks jax --models cnn --scales mnist5k --epochs 4

Parity makes our train() do what a framework's users would not (the same batches, every step's loss, torch's Adam
to the last bit), so this shows what that costs in speed. Per scale (`digits`, `mnist5k`), framework and model, one
worker per framework in its own environment (benchmarks/train_throughput_worker.py) trains the same model from the
same init with our loop and with each idiomatic loop (benchmarks/idiomatic), alternating, and this reports steady
samples/s, the ratio ours / idiomatic with its spread over the repeats, and a verdict: ok, noise, or the parity
cost PARITY_COSTS names. A benchmark, not a test: reported, never asserted. It writes measurements/throughput.json
and the table the report shows. Method, defaults and latest figures: benchmarks/README.md, "train_throughput.py".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.workers import run_worker
from rosetta_common.io import write_text
from rosetta_common.registry import of_reading

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "measurements" / "throughput.json"
# pipelines.measurements.THROUGHPUT_TABLE: the report's measurements section shows it (through timings.js, which
# `python -m pipelines.measurements` regenerates; run, not imported: pipelines never imports benchmarks).
TABLE_OUT = REPO / "measurements" / "throughput_table.json"
FRAMEWORKS = ("torch", "tf", "jax")
MODELS = of_reading("images")  # the registry's image models (the text model reads token ids)
SCALES = ("digits", "mnist5k")
# The attention model is compute-bound (embed 512: about 0.08 GFLOP per training sample on 8 digits rows, 0.3 on 28
# MNIST rows): its first 512 / 256 training images (16 / 8 steps an epoch) keep its epochs near a second or two.
# On MNIST's 28x28 images the resnet (BatchNorm on 28x28x16 maps) and the recurrent models (28 time steps) take
# 1 to 3 s an epoch over all 4,000 images: their first 1,024 (32 steps an epoch) keep each epoch near 0.2 to 0.7 s
# and the run's time where most of it goes, in tracing and compilation (first epochs; TF's unrolled GRU: ~3.5 s).
# Per-sample speed is what is compared, and both loops see the same subset.
DEFAULT_LIMITS = ("attention@digits=512", "attention@mnist5k=256", "resnet@mnist5k=1024", "lstm@mnist5k=1024",
                  "gru@mnist5k=1024")
# One thread per runtime: on a shared machine a 2-thread OpenMP/Eigen pool stalls at every barrier whose other
# thread is descheduled (torch's digits MLP: 4 s an epoch at 2 threads under load 7, 0.08 s at 1).
DEFAULT_THREADS = "1"

# What our train() does that the idiomatic loop does not, because parity requires it (same batches in the same
# order, every step's loss, rosetta_common.optim's Adam to the last bit, the same dropped units, the spec's
# BatchNorm statistics, one LSTM bias): the cost a ratio below 1.0 stands for. Per framework: "*" for every
# model, then what one model adds (each loop's PARITY measures them one by one with --tricks).
PARITY_COSTS = {
    "torch": {
        "*": "none beyond the plan's own batch order (indexing a preloaded tensor, no DataLoader)",
        "resnet": "the shared dropout masks (a preloaded (steps, batch, features) tensor, indexed per step and "
                  "multiplied into the pooled features) instead of nn.Dropout; rosetta_torch's BatchNorm2d, which "
                  "corrects torch's running-variance update to the biased batch variance (a clone and three "
                  "elementwise ops per BatchNorm layer per step)",
        "lstm": "bias_hh_l0 frozen at zero (one bias, as the canonical LSTM has): less work than the idiomatic "
                "loop, which trains it",
    },
    "tf": {
        "*": "TorchAdam (torch's Adam: float64 bias corrections, epsilon after them) instead of keras Adam; the "
             "StepLoss metric (every step's loss, not fit's running mean: a row per step, read once an epoch)",
        "resnet": "fit on the training twin (rosetta_tf.models.training_view), the shared dropout mask a second "
                  "input from the tf.data stream, multiplied into the pooled features, instead of Keras' Dropout",
    },
    "jax": {
        "*": "torch's Adam as an optax transform (bias corrections looked up from a float64-computed table) "
             "instead of optax.adam, whose float32 1 - b2**t is ~1e-5 off",
        "attention": "against the linen loop (flax defaults): the two-pass LayerNorm (use_fast_variance=False), the "
                     "exact erf GELU (approximate=False) and the attention written out with einsum (canonical "
                     "(embed, embed) kernels, scores scaled after q.k) instead of nn.MultiHeadDotProductAttention",
        "resnet": "the shared dropout masks (each step's numpy row, one more input moved to the device with the "
                  "batch, multiplied into the pooled features) instead of nnx.Dropout drawing from its RNG stream "
                  "inside the step",
    },
}


def parity_costs(framework: str, model: str) -> str:
    """What parity makes our train() do for this framework and model that the idiomatic loop does not."""
    costs = PARITY_COSTS[framework]
    return "; ".join(costs[key] for key in ("*", model) if key in costs)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run, the first excluded (default 3)")
    parser.add_argument("--min-steady-seconds", type=float, default=0.5,
                        help="more epochs (up to 40) for a case whose epochs 2..N would take less (default 0.5; "
                             "0: exactly --epochs)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each loop per case, alternating (default 3)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--scales", nargs="+", choices=SCALES, default=list(SCALES))
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument("--limit", nargs="*", default=list(DEFAULT_LIMITS), metavar="MODEL@SCALE=N",
                        help="train on the first N training images for that case (default: %(default)s; "
                             "--limit alone: none)")
    parser.add_argument("--tricks", action=argparse.BooleanOptionalAction, default=False,
                        help="also time the idiomatic loop with each speed-up our train() does not use, and with "
                             "each thing parity requires of it (default: off; about doubles the time)")
    parser.add_argument("--threads", default=DEFAULT_THREADS,
                        help="ROSETTA_THREADS for the workers (default: %(default)s; the pipeline's is 2)")
    parser.add_argument("--params", default="params.yaml", help="the spec: batch size, optimizer, architectures")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is excluded from the steady rate")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    limits = {}
    for item in args.limit:
        case, _, number = item.partition("=")
        model, _, scale = case.partition("@")
        if model not in MODELS or scale not in SCALES or not number.isdigit() or int(number) < 1:
            parser.error(f"--limit {item!r}: expected MODEL@SCALE=N with MODEL in {MODELS}, SCALE in {SCALES}")
        limits[(model, scale)] = int(number)
    args.limits = limits
    return args


def prepare_data(scales: list[str], params: str, root: Path) -> dict[str, Path]:
    """Each scale's split, as the data stage would prepare it with data.source = scale (its own max_pixel), into
    root/<scale>/ (a second or two: made afresh each run, so nothing can go stale or be removed mid-run); the
    framework environments have neither scikit-learn nor mlxtend."""
    from rosetta_common.data import prepare, save_prepared
    from rosetta_common.spec import load_spec

    spec = load_spec(REPO / params)
    folders = {}
    for scale in scales:
        data_spec = spec.data.model_copy(update={"source": scale, "max_pixel": None, "idx_dir": None})
        save_prepared(prepare(data_spec, spec.seed), root / scale)
        folders[scale] = root / scale
    return folders


def throughput_worker(framework: str, job: dict[str, Any], scratch: Path) -> dict[str, Any]:
    started = time.perf_counter()
    result = run_worker(framework, "benchmarks.train_throughput_worker", job, job["threads"], scratch, framework)
    result["process_seconds"] = time.perf_counter() - started
    return result


def steady(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One loop's figures over its repeats: steady samples/s (median of epochs 2..N), first-epoch seconds."""
    later = [s for run in runs for s in run["epoch_seconds"][1:]]
    samples = runs[0]["samples_per_epoch"]
    return {
        "samples_per_epoch": samples,
        "steady_samples_per_second": samples / statistics.median(later),
        "steady_epoch_seconds": statistics.median(later),
        "first_epoch_seconds": statistics.median(run["epoch_seconds"][0] for run in runs),
        "final_epoch_loss": statistics.median(run["epoch_losses"][-1] for run in runs),
        "per_repeat_samples_per_second": [samples / statistics.median(run["epoch_seconds"][1:]) for run in runs],
    }


def idiomatic_loops(loops: dict[str, Any]) -> list[str]:
    """The idiomatic loops among a case's loops: `idiomatic` and each peer style (`idiomatic_linen`), not the
    variants with a trick or a parity requirement (`donate`, `idiomatic_linen:torch_adam`)."""
    return [name for name in loops if name == "idiomatic" or (name.startswith("idiomatic_") and ":" not in name)]


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for result in results:
        framework = result["framework"]
        for case in result["cases"]:
            figures = {name: steady(runs) for name, runs in case["runs"].items()}
            ours = figures["ours"]
            row = {"framework": framework, "scale": case["scale"], "model": case["model"],
                   "epochs": case["epochs"], "repeats": len(case["runs"]["ours"]),
                   "train_samples": case["train_samples"], "batch_size": case["batch_size"], "loops": figures}
            for name, other in figures.items():
                if name == "ours":
                    continue
                per_repeat = [a / b for a, b in zip(ours["per_repeat_samples_per_second"],
                                                    other["per_repeat_samples_per_second"], strict=True)]
                other["ratio_ours_over_this"] = ours["steady_samples_per_second"] / other["steady_samples_per_second"]
                other["ratio_per_repeat"] = per_repeat
            # The yardstick: the fastest idiomatic loop of the case (JAX has two styles, benchmarks/idiomatic).
            yardstick = max(idiomatic_loops(figures), key=lambda name: figures[name]["steady_samples_per_second"])
            row["yardstick"] = yardstick
            ratio = figures[yardstick]["ratio_ours_over_this"]
            row["ratio"] = ratio
            if ratio >= 1.0:
                row["verdict"], row["verdict_short"] = "ok", "ok"
            elif max(figures[yardstick]["ratio_per_repeat"]) >= 1.0:
                row["verdict"] = "within noise (ours was at least as fast in one repeat)"
                row["verdict_short"] = "noise"
            else:
                row["verdict"] = f"below 1.0; parity costs: {parity_costs(framework, case['model'])}"
                row["verdict_short"] = "parity cost"
            rows.append(row)
    return rows


def report_table(rows: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """summarize()'s rows in the form pipelines.measurements.THROUGHPUT_TABLE documents, for the report."""
    flat = []
    for row in rows:
        ours, idiomatic = row["loops"]["ours"], row["loops"][row["yardstick"]]
        flat.append({
            "scale": row["scale"], "framework": row["framework"], "model": row["model"],
            "samples_per_epoch": ours["samples_per_epoch"], "epochs": row["epochs"],
            "ours_samples_per_second": ours["steady_samples_per_second"],
            "idiomatic_samples_per_second": idiomatic["steady_samples_per_second"],
            "ratio": row["ratio"], "ratio_range": [min(idiomatic["ratio_per_repeat"]),
                                                   max(idiomatic["ratio_per_repeat"])],
            "verdict": row["verdict_short"], "why": row["verdict"],
            "ours_first_epoch_seconds": ours["first_epoch_seconds"],
            "idiomatic_first_epoch_seconds": idiomatic["first_epoch_seconds"],
            "idiomatic_loop": row["yardstick"],
        })
    return {"settings": settings, "rows": flat}


def table(rows: list[dict[str, Any]], named: dict[str, dict[str, Any]]) -> str:
    header = ("scale", "framework", "model", "samples", "epochs", "ours samples/s", "idiomatic samples/s",
              "idiomatic loop", "ratio", "ratio range", "verdict", "ours 1st epoch s", "idiomatic 1st epoch s")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        ours, idiomatic = row["loops"]["ours"], row["loops"][row["yardstick"]]
        spread = idiomatic["ratio_per_repeat"]
        lines.append("| " + " | ".join([
            row["scale"], row["framework"], row["model"], str(row["train_samples"]), str(row["epochs"]),
            f"{ours['steady_samples_per_second']:,.0f}", f"{idiomatic['steady_samples_per_second']:,.0f}",
            row["yardstick"], f"**{row['ratio']:.2f}**", f"{min(spread):.2f}-{max(spread):.2f}", row["verdict_short"],
            f"{ours['first_epoch_seconds']:.2f}", f"{idiomatic['first_epoch_seconds']:.2f}",
        ]) + " |")
    several = [row for row in rows if len(idiomatic_loops(row["loops"])) > 1]
    if several:  # each idiomatic loop of a framework with more than one style, the yardstick the fastest
        lines += ["", "Each idiomatic loop (ratio: ours / it, with the range of per-repeat ratios):", "",
                  "| scale | framework | model | idiomatic loop | its samples/s | ours / it | range | "
                  "its 1st epoch s |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in several:
            for name in idiomatic_loops(row["loops"]):
                figures = row["loops"][name]
                spread = figures["ratio_per_repeat"]
                lines.append(f"| {row['scale']} | {row['framework']} | {row['model']} | {name} | "
                             f"{figures['steady_samples_per_second']:,.0f} | {figures['ratio_ours_over_this']:.2f} | "
                             f"{min(spread):.2f}-{max(spread):.2f} | {figures['first_epoch_seconds']:.2f} |")
    variant_rows = [(row, name, figures) for row in rows for name, figures in row["loops"].items()
                    if name != "ours" and name not in idiomatic_loops(row["loops"])]
    if variant_rows:
        lines += ["", "The idiomatic loop with one trick (a speed-up our train() does not use) or one parity "
                  "requirement (what our train() must do):", "",
                  "| scale | framework | model | idiomatic + | kind | its samples/s | ours / it | range | "
                  "its 1st epoch s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row, name, figures in variant_rows:
            kind = "parity" if name in named[row["framework"]]["parity"] else "trick"
            spread = figures["ratio_per_repeat"]
            lines.append(f"| {row['scale']} | {row['framework']} | {row['model']} | {name} | {kind} | "
                         f"{figures['steady_samples_per_second']:,.0f} | {figures['ratio_ours_over_this']:.2f} | "
                         f"{min(spread):.2f}-{max(spread):.2f} | {figures['first_epoch_seconds']:.2f} |")
    models = {row["model"] for row in rows}

    def applies(kinds: dict[str, Any], name: str) -> bool:  # a variant of ONLY_FOR only where its models ran
        return not set(kinds["only_for"].get(name, models)).isdisjoint(models)

    lines += ["", "Named tricks (speed-ups our train() does not use) and parity requirements (--tricks measures both):"]
    lines += [f"- {fw} {name}: {text}" for fw, kinds in named.items() for name, text in kinds["tricks"].items()
              if applies(kinds, name)]
    lines += [f"- {fw} {name} (parity, measured as idiomatic + it): {text}"
              for fw, kinds in named.items() for name, text in kinds["parity"].items() if applies(kinds, name)]
    below = [row for row in rows if row["ratio"] < 1.0]
    if below:
        lines += ["", "Ratio below 1.0 (the noise verdict, else what parity makes our train() do that the idiomatic "
                  "loop does not):"]
        lines += [f"- {r['scale']} {r['framework']} {r['model']} {r['ratio']:.2f}: {r['verdict']}" for r in below]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="rosetta-throughput-") as scratch:
        folders = prepare_data(args.scales, args.params, Path(scratch) / "data")
        cases = [{"scale": scale, "model": model, "epochs": args.epochs, "data": str(folders[scale]),
                  "train_samples": args.limits.get((model, scale))}
                 for scale in args.scales for model in args.models]
        job = {"params": str(REPO / args.params), "repeats": args.repeats, "cases": cases, "threads": args.threads,
               "min_steady_seconds": args.min_steady_seconds}
        for framework in args.frameworks:
            print(f"[throughput] {framework}: {len(cases)} cases x {args.repeats} repeats", file=sys.stderr)
            results.append(throughput_worker(framework, {**job, "tricks": args.tricks}, Path(scratch)))
    rows = summarize(results)
    named = {result["framework"]: {"tricks": result["tricks"], "parity": result["parity"],
                                   "only_for": result["only_for"]} for result in results}
    report = table(rows, named)
    print(report)
    settings = {"epochs": args.epochs, "min_steady_seconds": args.min_steady_seconds, "repeats": args.repeats,
                "limits": {f"{m}@{s}": n for (m, s), n in args.limits.items()},
                "tricks": args.tricks, "threads": args.threads}
    write_text(args.out, json.dumps({
        "what": "steady training samples/s, ours vs each framework's idiomatic loop, side by side in one run",
        "settings": settings,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cores": os.cpu_count()},
        "rows": rows, "tricks": named, "parity_costs": PARITY_COSTS,
        "workers": [{k: r[k] for k in ("framework", "import_seconds", "process_seconds", "environment")}
                    for r in results],
        "raw": results, "table": report, "seconds": time.perf_counter() - started,
    }, indent=1))
    if args.out == OUT:  # the report's measurements section shows its table
        write_text(TABLE_OUT, json.dumps(report_table(rows, settings), indent=1))
        subprocess.run([sys.executable, "-m", "pipelines.measurements"], cwd=REPO, check=True)
    print(f"\nwrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out} "
          f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
