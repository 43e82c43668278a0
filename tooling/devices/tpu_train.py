"""The JAX stage on a TPU host: `train_export@jax` as the pipeline runs it (every model, its lockstep checkpoints
and replicates as params.yaml says, native and ONNX exports), then the measured null's end-of-training replicates
of every model in `replicates.models`, at one matrix precision, packed as its own subject.

    python -m tooling.devices.tpu_train --precision highest|default --pack OUT.tar.gz

rosetta_jax.configure() sets `jax_default_matmul_precision` to `highest` (float32 products); `--precision default`
sets it back to None after every configure(), so the run multiplies as a JAX user's script that never sets it
(on a TPU: bfloat16 passes). The end-of-training replicates follow the replicates stage's rule (until
`replicates.parted` have parted from the run, at most `replicates.at_most`), but for every model the params list:
a TPU host has no CPU runs, so no null plan. They go beside the run, replicates.json and replicates.npz in its
folder, tied to it by its step losses' digest. The run folders (artifacts/jax/<model>/) go into the archive as
`jax@tpu/<model>/`, beside `jax@tpu/tpu.json` (device, precision, the versions that ran) and `measurements/` (the
stage's timings, the replicates' among them). --slim keeps what the validator reads and what fits the way back:
init.onnx, native/ and taps.npz stay on the host, and checkpoints.npz keeps the run's own states and the lockstep
replicates' step losses (their states are 210 MB for the attention model); replicates.json and replicates.npz
stay whole. tpu.json records the sha256 export.json gave each file that stayed or was rewritten.
Runs from this checkout's root with data/prepared and artifacts/init present, the stage in a scratch folder of its
own (the checkout's artifacts/jax/ and measurements/ stay as they are); JAX must see a TPU (JAX_PLATFORMS
unset or naming tpu), unless --allow-cpu (tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

PRECISIONS: dict[str, str | None] = {"highest": "highest", "default": None}
SUBJECT = "jax@tpu"
VERSIONED = ("jax", "jaxlib", "libtpu", "flax", "optax", "jax2onnx", "onnx", "numpy")


def versions() -> dict[str, str]:
    """The installed version of each distribution that decides the run (what ran, beside the lock's pins)."""
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


LEFT_ON_HOST = ("init.onnx", "taps.npz")


def slim(run: Path) -> dict[str, Any]:
    """Keep what the validator reads of one run folder (module docstring); what moved, with its export sha256.
    Only files export.json hashed move or change: the end-of-training replicates, written after it, stay whole."""
    import numpy as np

    from rosetta_common.io import sha256

    recorded = json.loads((run / "export.json").read_text())["sha256"]
    left = {name: recorded[name] for name in recorded
            if name in LEFT_ON_HOST or name.startswith("native/")}
    for name in left:
        (run / name).unlink()
    shutil.rmtree(run / "native", ignore_errors=True)
    path = run / "checkpoints.npz"
    with np.load(path, allow_pickle=False) as f:
        kept = {key: f[key] for key in f.files
                if not key.startswith("replicate") or key.endswith("/step_losses")}
    with open(path, "wb") as out:
        np.savez(out, **kept)
    return {"left_on_host": left,
            "rewritten": {"checkpoints.npz": {"export_sha256": recorded["checkpoints.npz"], "sha256": sha256(path),
                                              "kept": "the run's states; the lockstep replicates' step losses"}}}


def pin_precision(precision: str | None) -> None:
    """Make every rosetta_jax.configure() of the stage end with `precision` as JAX's default matmul precision."""
    import jax

    import rosetta_jax

    configure = rosetta_jax.configure

    def configured(seed: int) -> None:
        configure(seed)
        jax.config.update("jax_default_matmul_precision", precision)

    rosetta_jax.configure = configured


def train_replicates(backend: Any, spec: Any, job: Any, clock: Any) -> float:
    """One model's end-of-training replicates (pipelines.stages.common.replicates, each fitted as the replicates
    stage fits it) into its published run folder; returns their seconds."""
    from pipelines import paths
    from pipelines.stages.common import rebuilt, replicates
    from rosetta_common.io import read_json

    where = f"tpu_train {job.arch}"
    own = read_json(paths.train_log(job.arch, "jax"))["step_losses"]  # as the judge digests them
    model = None

    def fit(replicate: int, init: Any, plan: Any) -> Any:
        nonlocal model
        model = rebuilt(backend, job, model, init)
        return model, backend.train(model, plan, job.data)

    started = time.time()
    with clock.phase(f"{job.arch}.replicates"):
        # every one at once (the judge of a TPU run has no interim look), signs of the TPU group's own
        replicates(backend, spec, job, job.data, paths.run_dir(job.arch, "jax"), where, fit, own,
                   spec.replicates.parted, group="jax-tpu")
    seconds = time.time() - started
    print(f"{where}: replicates done in {seconds:.1f}s", flush=True)
    return seconds


def stage(train_export: Any, models: list[str]) -> None:
    """train_export.main's steps, then the end-of-training replicates of every model in `replicates.models` (each
    model's seconds in its measurements, a `<model>.replicates` phase in the stage's); the latency measurement
    (native against ONNX Runtime) only where onnxruntime is installed (a TPU host's own index may lack it): the
    training, exports, checkpoints and replicates are whole."""
    import importlib.util

    from pipelines import measurements
    from pipelines.stages import IMPORTS_STARTED, framework_stage_args

    clock = measurements.StageClock("train_export@jax", IMPORTS_STARTED)
    fw, models, spec = framework_stage_args(["jax", *models], train_export.__doc__, "train_export")
    jobs = train_export.load_jobs(spec, models)
    clock.lap("inputs")
    backend = train_export.seeded_backend(fw, spec.seed)
    clock.lap("framework_import")
    runs = [train_export.run_model(backend, spec, job, job.data, clock) for job in jobs]
    for run in runs:
        train_export.record_taps(backend, run, run.job.data.validation_batch(spec.export.validation_batch_size),
                                 clock)
    for run in runs:
        if run.job.arch in spec.replicates.models:
            run.seconds += train_replicates(backend, spec, run.job, clock)
    if importlib.util.find_spec("onnxruntime") is not None:
        for run in runs:
            train_export.measure_model(backend, run, run.job.data, clock)
        measurements.write_stage(clock.record(models=models))
        return
    for run in runs:
        measurements.write(run.job.arch, fw, {
            "framework": fw, "model": run.job.arch, "stage": "train_export@jax",
            "train": {"train_seconds": run.result.train_seconds, "epoch_seconds": run.result.epoch_seconds,
                      "steady_samples_per_second": train_export.steady_samples_per_second(run.result, run.job)},
            "export": run.exported, "latency": {"results": [], "not_measured": "onnxruntime is not installed"},
            "model_seconds": run.seconds})
    measurements.write_stage(clock.record(models=models, latency="not measured: onnxruntime is not installed"))


def lay_out(scratch: Path, checkout: Path) -> Path:
    """A working folder for the stage beside the checkout's own: its params.yaml, its prepared data and init
    (linked), so the stage's artifacts/jax/ and measurements/ never touch the checkout's (the CPU run judged)."""
    shutil.copy2(checkout / "params.yaml", scratch / "params.yaml")
    for rel in ("data/prepared", "artifacts/init"):
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / rel).symlink_to((checkout / rel).resolve(), target_is_directory=True)
    return scratch


def train(args: argparse.Namespace, device: Any, pack: Path) -> None:
    """The stage in the current folder (lay_out's), then tpu.json and the archive at `pack`."""
    import jax

    from pipelines.stages import train_export

    started = time.time()
    stage(train_export, args.models)
    record: dict[str, Any] = {
        "subject": SUBJECT, "precision": args.precision,
        "jax_default_matmul_precision": PRECISIONS[args.precision],
        "device": {"platform": device.platform, "kind": device.device_kind, "count": jax.device_count()},
        "versions": versions(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1)}
    if args.slim:
        record["slimmed"] = {run.name: slim(run) for run in sorted(Path("artifacts/jax").iterdir()) if run.is_dir()}
    Path("artifacts/jax/tpu.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    pack.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(pack, "w:gz") as tar:
        tar.add("artifacts/jax", arcname=SUBJECT)
        tar.add("measurements", arcname=f"{SUBJECT}/measurements")
    print(f"tpu_train: {args.precision}: {record['seconds']} s -> {pack}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=list(PRECISIONS), required=True)
    parser.add_argument("--pack", type=Path, required=True)
    parser.add_argument("--allow-cpu", action="store_true")
    parser.add_argument("--slim", action="store_true")
    parser.add_argument("models", nargs="*")
    args = parser.parse_args(argv)
    import jax

    device = jax.devices()[0]
    if device.platform != "tpu" and not args.allow_cpu:
        print(f"error: JAX sees no TPU (its first device is {device.platform})", file=sys.stderr)
        return 2
    pin_precision(PRECISIONS[args.precision])
    pack = args.pack.resolve()
    here = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="rosetta-tpu-") as scratch:
        os.chdir(lay_out(Path(scratch), here))
        try:
            train(args, device, pack)
        finally:
            os.chdir(here)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
