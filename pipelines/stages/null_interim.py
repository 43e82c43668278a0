"""Stage `null_interim`: the measured null's interim look, which decides from the first replicates which models
train more.

    python -m pipelines.runner validation -- python -m pipelines.stages.null_interim

A group-sequential test: for every model artifacts/null_plan.json names, the pooled test of each end-of-training
figure beyond its float32 bound runs on each framework's run and its first parted replicates (the replicates
stage's, `replicates.first` a framework), with the validate stage's own functions (pipelines/checks/parity.py).
A model whose every test gives p above `replicates.futility` is accepted there; any other goes on to
`replicates.parted` (the replicates_more stages). Stopping only to accept can only remove rejections, so the
error rate stays at `tolerances.null_alpha`; what it costs in power: docs/judge.md, 'The power of the null'.
Writes artifacts/null_interim.json: names only, so runs that move without changing it leave the replicates after
it cached. Runs in the validation environment.
"""

from __future__ import annotations

from typing import Any

from pipelines import measurements, paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Ledger
from pipelines.checks.parity import running_statistics, training_parity
from pipelines.checks.replicates import end_figures, read_plan, read_replicates
from pipelines.stages import IMPORTS_STARTED, stage_main
from rosetta_common.data import Dataset, load_for
from rosetta_common.errors import ArtifactError
from rosetta_common.io import read_json, write_json
from rosetta_common.spec import Spec, load_spec


def interim_tests(spec: Spec, arch: str, data: Dataset) -> dict[str, dict[str, Any]]:
    """The model's end-of-training tests on the first replicates, by test: each one's null record (its p-value,
    smallest possible p, groups), as validate would record it."""
    config = data.model_config(spec, arch)
    ledger = Ledger()
    runs = {}
    for fw in spec.frameworks:
        runs[fw] = end_figures(arch, fw, data)
        runs[fw]["replicates"] = read_replicates(ledger, arch, fw, paths.replicates_run(arch, fw),
                                                 read_json(paths.train_log(arch, fw))["step_losses"])
    unreadable = [c.detail for c in ledger.checks if c.name == names.REPLICATES_READABLE]
    if unreadable:
        raise ArtifactError(f"null_interim: {arch}: {unreadable[0]}")
    figures, weights = training_parity(spec, ledger, arch, runs, data, config)
    running_statistics(spec, ledger, arch, weights, runs, {f["frameworks"]: f["parting_step"] for f in figures})
    return {c.null["test"]: c.null for c in ledger.checks
            if c.null is not None and c.name in names.END_OF_TRAINING_PAIR}


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("null_interim", IMPORTS_STARTED)
    spec = load_spec(paths.PARAMS)
    futility = spec.replicates.futility
    cache: dict[str, Dataset] = {}
    more, accepted = [], []
    planned = [m for m in spec.models if m in read_plan()]
    if spec.replicates.first >= spec.replicates.parted:  # the first replicates are all of them: no look
        print(f"null_interim: replicates.first = replicates.parted = {spec.replicates.parted}: no interim look",
              flush=True)
        planned = []
    for arch in planned:
        tests = interim_tests(spec, arch, load_for(arch, paths.PREPARED, cache))
        (more if any(t["p_value"] <= futility for t in tests.values()) else accepted).append(arch)
        print(f"null_interim: {arch}: " + ", ".join(f"{key.split(' ')[1]} p {t['p_value']:.3g}"
                                                   for key, t in tests.items())
              + (" -> more replicates" if arch in more else f": every p above {futility}, accepted"), flush=True)
        clock.lap(arch)
    write_json(paths.NULL_INTERIM, {"more": more, "accepted": accepted})
    measurements.write_stage(clock.record(models=more))
    print(f"null_interim: more replicates for {', '.join(more) or 'no model'} -> {paths.NULL_INTERIM}", flush=True)
    return 0


if __name__ == "__main__":
    stage_main(main)
