"""Stage `null_interim`: the measured null's interim look, which decides from the first replicates which models
train more.

    python -m pipelines.runner validation -- python -m pipelines.stages.null_interim

A group-sequential test: for every model artifacts/null_plan.json names, the pooled test of each end-of-training
figure beyond its float32 bound runs on each framework's run and its first parted replicates (the replicates
stage's, `replicates.first` a framework), with the validate stage's own functions (pipelines/checks/). A model goes
on to `replicates.parted` (the replicates_more stages) where any test gives p at or below `replicates.futility`, or
where a test's floor (the smallest p its groups allow) is above alpha over the Holm family validate will judge, so
that accepting it would be a pass by construction: the family is counted here as validate makes it, every planned
model's end-of-training tests and every model's lockstep tests. A data-parallel run's tests (train_dp, which this
stage does not wait for) pool a model's single-process replicates too, in a family this stage cannot count: with
`data_parallel.workers` above 1, a planned model of `data_parallel.models` goes on. Validate fails any test still
unable to reject, naming it. Any other model is accepted. Stopping only to accept can only remove rejections, so the
error rate stays at `tolerances.null_alpha`; what it costs in power: docs/judge.md, 'The power of the null'. Writes
artifacts/null_interim.json: names only, so runs that move without changing it leave the replicates after it cached.
Runs in the validation environment.
"""

from __future__ import annotations

from typing import Any

from pipelines import measurements, paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Ledger
from pipelines.checks.lockstep import lockstep_checkpoints
from pipelines.checks.parity import running_statistics, training_parity
from pipelines.checks.replicates import end_figures, read_plan, read_replicates
from pipelines.stages import IMPORTS_STARTED, stage_main
from rosetta_common.data import Dataset, load_for
from rosetta_common.errors import ArtifactError
from rosetta_common.io import read_json, write_json
from rosetta_common.spec import Spec, load_spec


def null_tests(spec: Spec, arch: str, data: Dataset, planned: bool) -> dict[str, dict[str, Any]]:
    """Every test of the model that validate will judge against a null, by test, each one's null record (its
    p-value, floor, groups) as validate would record it, with `end` saying whether it is an end-of-training test
    (on the first replicates: a planned model's) or a lockstep one (on the window replicates: every model's)."""
    config = data.model_config(spec, arch)
    ledger = Ledger()
    runs = {}
    for fw in spec.frameworks:
        runs[fw] = end_figures(arch, fw, data)
        if planned:
            runs[fw]["replicates"] = read_replicates(ledger, arch, fw, paths.replicates_run(arch, fw),
                                                     read_json(paths.train_log(arch, fw))["step_losses"])
    unreadable = [c.detail for c in ledger.checks if c.name == names.REPLICATES_READABLE]
    if unreadable:
        raise ArtifactError(f"null_interim: {arch}: {unreadable[0]}")
    figures, weights = training_parity(spec, ledger, arch, runs, data, config)
    running_statistics(spec, ledger, arch, weights, runs, {f["frameworks"]: f["parting_step"] for f in figures})
    lockstep_checkpoints(spec, ledger, arch, runs, config, spec.export.validation_batch_size)
    return {c.null["test"]: {**c.null, "end": c.name in names.END_OF_TRAINING_PAIR} for c in ledger.checks
            if c.null is not None}


def go_on(end: dict[str, dict[str, Any]], futility: float, alpha: float, family: int,
          data_parallel: bool = False) -> list[str]:
    """Why a planned model trains more replicates, from its end-of-training tests at the look (none: accepted): a
    p at or below `futility`, or a floor above alpha over the `family` validate will judge (Holm's first
    threshold, which a floor must meet to be rejectable whatever the other tests' p-values), or, with
    `data_parallel` (the model trains data-parallel too), its data-parallel tests: they pool each framework's run
    and these replicates against the data-parallel run's, in a family this stage cannot count (train_dp runs
    beside it), so the single-process groups go on to `replicates.parted` as the data-parallel ones do."""
    reasons = [f"{key.split(' ')[1]} p {t['p_value']:.3g} at most {futility}" for key, t in end.items()
               if t["p_value"] <= futility]
    reasons += [f"{key.split(' ')[1]} floor {t['floor']:.3g} above alpha / {family} = {alpha / family:.3g}"
                for key, t in end.items() if t["floor"] > alpha / family]
    if data_parallel:
        reasons.append("it trains data-parallel too (data_parallel.models), whose tests pool these replicates")
    return reasons


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
    tests = {arch: null_tests(spec, arch, load_for(arch, paths.PREPARED, cache), arch in planned)
             for arch in (spec.models if planned else [])}
    family = sum(len(model) for model in tests.values())  # validate's Holm family but for data-parallel tests
    alpha = spec.tolerances.null_alpha
    for arch in planned:
        end = {key: t for key, t in tests[arch].items() if t["end"]}
        reasons = go_on(end, futility, alpha, family, spec.data_parallel.workers > 1
                        and arch in spec.data_parallel.models)
        (more if reasons else accepted).append(arch)
        print(f"null_interim: {arch}: " + ", ".join(f"{key.split(' ')[1]} p {t['p_value']:.3g}"
                                                   for key, t in end.items())
              + (f" -> more replicates: {'; '.join(reasons)}" if reasons else f": every p above {futility}, accepted"),
              flush=True)
        clock.lap(arch)
    write_json(paths.NULL_INTERIM, {"more": more, "accepted": accepted})
    measurements.write_stage(clock.record(models=more))
    print(f"null_interim: more replicates for {', '.join(more) or 'no model'} (Holm's family at validate: {family} "
          f"tests, data-parallel runs' aside) -> {paths.NULL_INTERIM}", flush=True)
    return 0


if __name__ == "__main__":
    stage_main(main)
