"""Stage `validate`: judge every exported model under ONNX Runtime, in an environment with no framework.

The judge stands outside every framework: it imports none, runs each ONNX file itself, and trusts no figure it
did not check, reading a run's files only once they match the hashes its export.json recorded. Per model it runs
the checks of pipelines/checks/ (one module per kind: the exports and their reloads, forward parity against the
float64 reference, training parity in lockstep and after, per-layer taps, the served answers), then the
data-parallel runs, then decides together every check judged against the replicates' measured null
(Ledger.judge_nulls). It writes reports/validation.json (each check's measured figure under `value`, its
tolerance from params.yaml) and exits non-zero naming each failing check. Every check, its tolerance and why:
docs/judge.md.
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
from pipelines.checks.replicates import all_replicates, parting_record, read_interim, read_plan, replicate_figures
from pipelines.checks.serving import read_served, serving_checks
from pipelines.checks.taps import localize, tap_figures, taps_record
from pipelines.stages import IMPORTS_STARTED, stage_main
from rosetta_common.data import Dataset, load_for, load_prepared
from rosetta_common.io import read_json, write_json
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
    planned, more = read_plan(), read_interim()
    parity: list[dict[str, Any]] = []
    statistics: list[dict[str, Any]] = []
    lockstep: list[dict[str, Any]] = []
    tap_records: list[dict[str, Any]] = []
    served = read_served(image_batch)  # the serve stage's folder, checked as a whole once
    serving: list[dict[str, Any]] = []
    measured: list[dict[str, Any]] = []  # test figures this stage computed from each run's artifacts
    parting_steps: list[dict[str, Any]] = []  # where each pair of a null-judged model's trainings parts
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
                runs[fw]["replicates"] = (all_replicates(ledger, arch, fw,
                                                         read_json(paths.train_log(arch, fw))["step_losses"],
                                                         arch in more, spec.replicates.at_most)
                                          if arch in planned else None)
                runs[fw]["interim"] = (arch in planned and arch not in more
                                       and spec.replicates.first < spec.replicates.parted)  # judged at the look
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
        if (where := parting_record(arch, runs, parting, spec.tolerances.lockstep_loss_rel)) is not None:
            parting_steps.append(where)
        statistics += running_statistics(spec, ledger, arch, trained, runs, parting)
        serving.append(serving_checks(spec, ledger, arch, runs, batch, config, served))
        # Last: every check the taps explain is in the ledger, so each failing one can name its first tap.
        taps = tap_figures(ledger, arch, config, list(runs), batch, load_weights(paths.init_weights(arch), config),
                           trained, spec.tolerances.forward_parity_abs)
        localize(ledger, arch, taps)
        tap_records.append(taps_record(arch, taps))
        clock.lap(arch)
    data_parallel = data_parallel_parity(spec, ledger, cache, judged, planned, more)
    clock.lap("data_parallel")
    ledger.judge_nulls(spec.tolerances.null_alpha, spec.replicates.futility)
    failures = ledger.failures()
    report = {
        "passed": not failures,
        "checks": ledger.rows(),
        "training_parity": parity,
        "lockstep": lockstep,
        "running_statistics": statistics,
        "taps": tap_records,
        "runs": measured,
        "parting": parting_steps,
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
