"""Stage `null_plan`: which models need the measured null's end-of-training replicates, decided from the three
frameworks' runs before any replicate trains.

    python -m pipelines.runner validation -- python -m pipelines.stages.null_plan

A replicate trained to the end is a whole training, and it is needed only where two frameworks' runs part and an
end-of-training figure then misses its float32 bound: everywhere else the bound alone judges. So this stage reads
every model's runs (step losses, the framework's own test logits, trained weights: the files and functions the
validate stage judges by, pipelines/checks/parity.py) and writes artifacts/null_plan.json, the models of
`replicates.models` whose pairs need the null, for the replicates@<framework> stages. The file holds names only,
so runs that move without changing the plan leave the replicates cached. Runs in the validation environment.
"""

from __future__ import annotations

from pipelines import measurements, paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Ledger
from pipelines.checks.parity import running_statistics, training_parity
from pipelines.checks.replicates import end_figures
from pipelines.stages import IMPORTS_STARTED, stage_main
from rosetta_common.data import Dataset, load_for
from rosetta_common.io import write_json
from rosetta_common.spec import Spec, load_spec


def beyond_after_parting(spec: Spec, arch: str, data: Dataset) -> list[str]:
    """The model's end-of-training checks that miss their float32 bound after the pair's runs part ("torch|tf
    test_loss_rel 2.1e-03 > 1e-03, part at step 37"): what the null would judge. Empty: the bounds judge alone."""
    config = data.model_config(spec, arch)
    runs = {fw: end_figures(arch, fw, data) for fw in spec.frameworks}
    ledger = Ledger()
    figures, weights = training_parity(spec, ledger, arch, runs, data, config)
    parting = {f["frameworks"]: f["parting_step"] for f in figures}
    running_statistics(spec, ledger, arch, weights, runs, parting)
    return [f"{c.subject} {c.name} {c.value:.3g} > {c.tolerance:g}, part at step {parting[c.subject]}"
            for c in ledger.checks
            if c.name in names.END_OF_TRAINING_PAIR and not c.passed and parting.get(c.subject) is not None]


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("null_plan", IMPORTS_STARTED)
    spec = load_spec(paths.PARAMS)
    cache: dict[str, Dataset] = {}
    needed: dict[str, list[str]] = {}
    for arch in spec.models:
        beyond = beyond_after_parting(spec, arch, load_for(arch, paths.PREPARED, cache))
        if beyond:
            needed[arch] = beyond
        print(f"null_plan: {arch}: " + ("; ".join(beyond) if beyond else "every end-of-training figure within its "
                                        "float32 bound, or in lockstep: no replicates"), flush=True)
        clock.lap(arch)
    planned = [arch for arch in needed if arch in spec.replicates.models]
    unlisted = [arch for arch in needed if arch not in spec.replicates.models]
    write_json(paths.NULL_PLAN, {"replicates": planned, "not_in_replicates_models": unlisted})
    measurements.write_stage(clock.record(models=planned))
    print(f"null_plan: replicates to the end for {', '.join(planned) or 'no model'}"
          + (f"; {', '.join(unlisted)} would need them but replicates.models does not list them" if unlisted else "")
          + f" -> {paths.NULL_PLAN}", flush=True)
    return 0


if __name__ == "__main__":
    stage_main(main)
