"""Stage `validate`: judge every exported model under ONNX Runtime, in an environment with no framework.

Checks, each with an explicit tolerance from params.yaml:
- per framework and model: onnx.checker on model.onnx and init.onnx; ONNX Runtime vs the framework's own
  logits (trained and init); ONNX Runtime's test accuracy equals the native one; native reload round trip;
  minimum test accuracy; inference mode of every export (rosetta_common.metrics.inference_mode_problems): each
  ONNX file run here, each native format from the logits its reload recorded in native_outputs.npz (two runs
  on the validation batch, its first images alone);
- per model: the float64 numpy reference forward vs every init.onnx; every pair of frameworks' init.onnx
  on random inputs at several batch sizes (forward parity);
- per model and pair of frameworks: training parity, strict while the runs are in lockstep (step-1 loss, every
  step of the lockstep window; every weight, running statistic and eval logit at the lockstep checkpoints,
  pipelines/checks/lockstep.py), and at the end of training (test loss, test accuracy, prediction disagreement,
  and for a model with BatchNorm its running mean and variance) within the float32 bound, or once the runs part
  against the measured null of each framework's replicates (pipelines/checks/replicates.py, Holm over
  the run); the step where they part, the first epoch's losses and the final weight difference as figures;
- per model, per-layer taps (pipelines/checks/taps.py): every framework's init taps against the float64
  reference's (init_taps_vs_reference), taps pairwise and after training as figures, and every failing forward,
  ONNX-vs-native and lockstep check naming the first tap over its tolerance;
- with data_parallel.workers > 1: each framework's data-parallel run against its single-process run and the
  data-parallel runs pairwise;
- per model, what the model servers answered (the serve stage's artifacts/served/, pipelines/checks/serving.py):
  every server through V1 REST, V2 REST and V2 gRPC bit for bit against the same export run in process, the ONNX
  server against its framework's server, the metadata identical on every server; across frameworks, figures.
The checks live in pipelines/checks/ (one module per kind); this is the stage's entry point. Writes
reports/validation.json (each check's measured figure under `value`) and exits non-zero naming each failing check.
"""

from __future__ import annotations

import sys
from typing import Any

from pipelines import measurements, paths
from pipelines.checks.data_parallel import data_parallel_parity
from pipelines.checks.exports import check_framework, quality_floor
from pipelines.checks.forward import forward_parity, trained_weights_vs_native
from pipelines.checks.integrity import intact
from pipelines.checks.ledger import ARTIFACTS_READABLE, Ledger
from pipelines.checks.lockstep import lockstep_checkpoints
from pipelines.checks.parity import running_statistics, training_parity
from pipelines.checks.replicates import read_replicates, replicate_figures
from pipelines.checks.serving import read_served, serving_checks
from pipelines.checks.taps import localize, tap_figures, taps_record
from pipelines.stages import IMPORTS_STARTED, stage_main
from rosetta_common.data import Dataset, load_for, load_prepared
from rosetta_common.io import write_json
from rosetta_common.spec import load_spec
from rosetta_common.weights import load_weights


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("validate", IMPORTS_STARTED)
    spec = load_spec(paths.PARAMS)
    cache: dict[str, Dataset] = {}  # each kind of prepared data (images, token ids) read once
    batches = {arch: load_for(arch, paths.PREPARED, cache).validation_batch(spec.export.validation_batch_size)
               for arch in spec.models}
    clock.lap("inputs")
    images = cache["images"] if "images" in cache else load_prepared(paths.PREPARED)  # read once
    image_batch = images.validation_batch(spec.export.validation_batch_size)
    ledger = Ledger()
    parity: list[dict[str, Any]] = []
    statistics: list[dict[str, Any]] = []
    lockstep: list[dict[str, Any]] = []
    tap_records: list[dict[str, Any]] = []
    served = read_served(image_batch)  # the serve stage's folder, checked as a whole once
    serving: list[dict[str, Any]] = []
    measured: list[dict[str, Any]] = []  # test figures this stage computed from each run's artifacts
    judged: set[tuple[str, str]] = set()  # (model, framework) runs whose files are the ones their figures came from
    for arch in spec.models:
        data, batch = load_for(arch, paths.PREPARED, cache), batches[arch]
        config = data.model_config(spec, arch)
        runs = {}
        for fw in spec.frameworks:
            record = intact(ledger, arch, fw)
            if record is None:
                continue  # nothing of this run is judged: its files are not the ones measured
            judged.add((arch, fw))
            try:
                runs[fw] = check_framework(spec, ledger, arch, fw, data, batch, record)
                count = spec.replicates.count if arch in spec.replicates.models else 0
                runs[fw]["replicates"] = read_replicates(ledger, arch, fw, count)
                quality_floor(spec, ledger, arch, fw, runs[fw])
            except (OSError, KeyError, ValueError, TypeError) as error:
                ledger.add(arch, fw, ARTIFACTS_READABLE, None, None, False, f"{type(error).__name__}: {error}")
        measured += [{"model": arch, "framework": fw, "test_accuracy": run["test_accuracy"],
                      "test_loss": run["test_loss"],
                      "replicates": replicate_figures(spec, arch, fw, run, len(data.train_labels))}
                     for fw, run in runs.items()]
        forward_parity(spec, ledger, arch, runs, batch, config)
        figures, trained = training_parity(spec, ledger, arch, runs, data, config)
        lockstep += lockstep_checkpoints(spec, ledger, arch, runs, config, len(batch))
        trained_weights_vs_native(spec, ledger, arch, trained, batch, config)
        parity += figures
        parting = {f["frameworks"]: f["parting_step"] for f in figures}
        statistics += running_statistics(spec, ledger, arch, trained, runs, parting)
        serving.append(serving_checks(spec, ledger, arch, runs, batch, config, served))
        # Last: every check the taps explain is in the ledger, so each failing one can name its first tap.
        taps = tap_figures(ledger, arch, config, list(runs), batch, load_weights(paths.init_weights(arch), config),
                           trained, spec.tolerances.forward_parity_abs)
        localize(ledger, arch, taps)
        tap_records.append(taps_record(arch, taps))
        clock.lap(arch)
    data_parallel = data_parallel_parity(spec, ledger, cache, judged)
    clock.lap("data_parallel")
    ledger.judge_nulls(spec.tolerances.null_alpha)
    failures = ledger.failures()
    report = {
        "passed": not failures,
        "checks": ledger.rows(),
        "training_parity": parity,
        "lockstep": lockstep,
        "running_statistics": statistics,
        "taps": tap_records,
        "runs": measured,
        "data_parallel": data_parallel,
        "serving": serving,
        "summary": {"checks": len(ledger.checks), "failed": len(failures)},
    }
    write_json(paths.VALIDATION, report)
    measurements.write_stage(clock.record(checks=len(ledger.checks), failed=len(failures)))
    for check in failures:
        print(f"FAILED {check.model}/{check.subject} {check.name}: value {check.value} tolerance {check.tolerance} "
              f"{check.detail}".rstrip(), file=sys.stderr)
    print(f"validate: {len(ledger.checks) - len(failures)}/{len(ledger.checks)} checks passed -> "
          "reports/validation.json")
    return 1 if failures else 0


if __name__ == "__main__":
    stage_main(main)
