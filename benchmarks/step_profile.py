"""Where a training step's time goes: each framework's own profiler over one epoch of our train(), and the thread
and oneDNN settings timed against the pipeline's.

    .venv/bin/python benchmarks/step_profile.py                      # attention (MNIST-5k) and the text model
    .venv/bin/python benchmarks/step_profile.py --frameworks tf --models attention --samples 2048

The attention and text models are what MNIST-5k's training costs most in every framework. Per framework, one worker
in its environment (benchmarks/step_profile_worker.py) trains each model with our train() and records its second
epoch with the framework's profiler (benchmarks/profilers): the seconds in operators (torch's ATen operators, the
XLA-compiled instructions of TF's and JAX's steps), split into matrix products and convolutions ("matmul": for a
compiled instruction, a dot or a fusion holding one) and the rest, the longest operators named with the layer op
they come from, and the share of the step spent outside them (the loop, the framework's dispatch, waiting). Then
one worker per setting (the pipeline's: ROSETTA_THREADS=2 and TF's oneDNN off; 1 thread; TF with oneDNN on) times
three unrecorded epochs after the first, the settings run in one order and then the reverse. A benchmark, not a
test: reported, never asserted. It writes measurements/step_profile.json. Method and latest figures:
benchmarks/README.md, "step_profile.py".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.workers import run_worker
from rosetta_common.io import write_text

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "measurements" / "step_profile.json"
FRAMEWORKS = ("torch", "tf", "jax")
MODELS = ("attention", "text_transformer")
# The attention model's MNIST-5k epoch is 125 steps of ~0.3 GFLOP per sample: its first 1,024 images (32 steps)
# give a recorded epoch of a few seconds. The text model trains on its whole split (its data has one scale).
DEFAULT_SAMPLES = {"attention": 1024}
PIPELINE = "pipeline's (2 threads, TF oneDNN off)"
# Each setting: (threads, environment the worker sets before importing its framework).
SETTINGS: dict[str, dict[str, tuple[int, dict[str, str]]]] = {
    framework: {PIPELINE: (2, {}), "1 thread": (1, {})} for framework in FRAMEWORKS}
SETTINGS["tf"]["oneDNN on (2 threads)"] = (2, {"TF_ENABLE_ONEDNN_OPTS": "1"})  # the runner sets it to 0
LONGEST = 4  # operators named per model in the printed table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES["attention"],
                        help="the attention model's training images (default %(default)s of MNIST-5k's 4,000)")
    parser.add_argument("--settings", action=argparse.BooleanOptionalAction, default=True,
                        help="also time each thread and oneDNN setting (default: on)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.samples < 32:
        parser.error(f"--samples {args.samples}: must be at least one batch (32)")
    return args


def prepare_data(params: str, root: Path) -> Path:
    """MNIST-5k's split and the text model's, as the data stage prepares them with data.source = mnist5k."""
    from rosetta_common.data import prepare, save_prepared
    from rosetta_common.spec import load_spec
    from rosetta_common.text import prepare_text

    spec = load_spec(REPO / params)
    images = prepare(spec.data.model_copy(update={"source": "mnist5k", "max_pixel": None, "idx_dir": None}), spec.seed)
    text, tokenizer = prepare_text(spec.data.text, spec.data.test_fraction, spec.seed)
    save_prepared(images, root, text, tokenizer.to_str())
    return root


def profile_worker(framework: str, job: dict[str, Any], threads: int, scratch: Path) -> dict[str, Any]:
    tag = f"{framework}-{len(list(scratch.glob('*-job.json')))}"
    return run_worker(framework, "benchmarks.step_profile_worker", {**job, "dump": str(scratch / f"{tag}-hlo")},
                      threads, scratch, tag)


def step_ms(case: dict[str, Any], epochs: slice) -> float:
    return 1e3 * statistics.median(case["epoch_seconds"][epochs]) / case["steps_per_epoch"]


def profile_rows(profiles: list[dict[str, Any]], settings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per framework and model: the recorded epoch's split, beside the unrecorded step time (the pipeline's
    setting's steady figure where the settings ran, else the profiled run's last epoch: TF's epoch after the
    record holds the profiler's stop, which runs between two of fit's calls)."""
    steady = {(row["framework"], row["model"]): row["ms_per_step"] for row in settings if row["setting"] == PIPELINE}
    rows = []
    for result in profiles:
        for case in result["cases"]:
            window, steps = case["window"], case["steps_per_epoch"]
            by_kind = window["seconds_by_kind"]
            in_ops = sum(by_kind.values())
            rows.append({
                "framework": result["framework"], "model": case["model"], "steps": steps,
                "train_samples": case["train_samples"],
                "unrecorded_ms_per_step": steady.get((result["framework"], case["model"]),
                                                     step_ms(case, slice(-1, None))),
                "recorded_ms_per_step": 1e3 * window["seconds"] / steps,
                "ops_ms_per_step": 1e3 * in_ops / steps,
                "matmul_share_of_ops": by_kind.get("matmul", 0.0) / in_ops if in_ops else 0.0,
                "outside_ops_share": max(0.0, 1 - in_ops / window["seconds"]),
                "longest": [{"name": op["name"], "source": op["source"], "kind": op["kind"],
                             "ms_per_step": 1e3 * op["seconds"] / steps, "calls_per_step": op["calls"] / steps}
                            for op in window["ops"]],
            })
    return rows


def setting_rows(timed: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per framework, model and setting: the steady ms per step (median over repeats of epochs 2..N's median) and
    its ratio to the pipeline's setting, repeat by repeat."""
    rows = []
    for framework, results in timed.items():
        per: dict[tuple[str, str], list[float]] = {}
        for result in results:
            for case in result["cases"]:
                per.setdefault((case["model"], result["setting"]), []).append(step_ms(case, slice(1, None)))
        for (model, setting), values in per.items():
            base = per[model, PIPELINE]
            ratios = [value / reference for value, reference in zip(values, base, strict=True)]
            rows.append({"framework": framework, "model": model, "setting": setting,
                         "ms_per_step": statistics.median(values), "per_repeat_ms": values,
                         "ratio_to_pipeline": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]})
    return rows


def table(profiles: list[dict[str, Any]], settings: list[dict[str, Any]]) -> str:
    lines = ["| framework | model | steps | ms/step unrecorded | recorded ms/step | in operators ms/step | "
             "matmul share | outside operators | longest operators (ms/step: the op they come from) |",
             "|" + "---|" * 9]
    for row in profiles:
        longest = "; ".join(f"{op['name']} {op['ms_per_step']:.2f}: {op['source'][-48:]}"
                            for op in row["longest"][:LONGEST])
        lines.append(f"| {row['framework']} | {row['model']} | {row['steps']} | {row['unrecorded_ms_per_step']:.1f} | "
                     f"{row['recorded_ms_per_step']:.1f} | {row['ops_ms_per_step']:.1f} | "
                     f"{row['matmul_share_of_ops']:.0%} | {row['outside_ops_share']:.0%} | {longest} |")
    if settings:
        lines += ["", "| framework | model | setting | ms/step | against the pipeline's | range |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['framework']} | {r['model']} | {r['setting']} | {r['ms_per_step']:.1f} | "
                  f"{r['ratio_to_pipeline']:.2f}x | {r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f} |"
                  for r in settings]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rosetta-step-profile-") as folder:
        scratch = Path(folder)
        data = str(prepare_data(args.params, scratch / "data"))
        cases = [{"model": model, "data": data, "train_samples": args.samples if model == "attention" else None}
                 for model in args.models]
        job = {"params": str(REPO / args.params), "cases": cases}
        profiles, timed = [], {}
        for framework in args.frameworks:
            print(f"[step_profile] {framework}: recording epoch 2 of {', '.join(args.models)}", file=sys.stderr)
            profiles.append(profile_worker(framework, {**job, "record": True, "epochs": 4, "setting": PIPELINE,
                                                   "environment": {}}, 2, scratch))
            if args.settings:
                names = list(SETTINGS[framework])
                timed[framework] = []
                for name in names + names[::-1]:
                    threads, environment = SETTINGS[framework][name]
                    print(f"[step_profile] {framework}: {name}", file=sys.stderr)
                    timed[framework].append(profile_worker(framework, {**job, "record": False, "epochs": 4,
                                                                   "setting": name, "environment": environment},
                                                       threads, scratch))
    settings_table = setting_rows(timed)
    profile_table = profile_rows(profiles, settings_table)
    report = table(profile_table, settings_table)
    print(report)
    write_text(args.out, json.dumps({
        "what": "one recorded epoch of our train() per framework and model, and each setting's steady step time",
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cores": os.cpu_count()},
        "settings": {name: {"threads": t, "environment": e} for fw in args.frameworks
                     for name, (t, e) in SETTINGS[fw].items()},
        "profiles": profile_table, "setting_times": settings_table, "raw": {"profiles": profiles, "timed": timed},
        "table": report, "seconds": time.perf_counter() - started,
    }, indent=1))
    print(f"\nwrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out} "
          f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
