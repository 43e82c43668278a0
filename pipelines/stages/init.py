"""Stage `init`: the canonical initial weights every framework starts from, one file per model in
artifacts/init/ (the stage's one output folder).

    python -m pipelines.stages.init [<model> ...]   (no model: every model in params.yaml)

Run whole (no model named), it publishes the folder at once, so a dropped model's file does not linger; a
named model's file is replaced alone (each file written atomically)."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path

from pipelines import measurements, paths
from pipelines.stages import IMPORTS_STARTED, check_model, stage_main
from rosetta_common.data import load_for
from rosetta_common.io import staged_outputs
from rosetta_common.spec import load_spec
from rosetta_common.weights import count_parameters, init_weights, save_weights


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("init", IMPORTS_STARTED)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="model", help="default: every model in params.yaml")
    args = parser.parse_args(argv)
    spec = load_spec(paths.PARAMS)  # validates params.yaml (models included) before anything is written
    for model in args.models:
        check_model(spec, model)
    models = list(dict.fromkeys(args.models)) or list(spec.models)
    cache: dict = {}  # each kind of prepared data (images, token ids) read once
    configs = {m: load_for(m, paths.PREPARED, cache).model_config(spec, m) for m in models}
    clock.lap("inputs")
    # The whole folder in one step when every model is made; a single named model's file is itself atomic.
    whole = staged_outputs(paths.INIT) if not args.models else nullcontext(paths.INIT)
    with whole as folder:
        for model, config in configs.items():
            weights = init_weights(config, spec.seed)
            save_weights(Path(folder) / paths.init_weights(model).name, weights, model, seed=str(spec.seed))
            print(f"init: {model} with {count_parameters(weights):,} parameters -> {paths.init_weights(model)}")
    clock.lap("weights")
    measurements.write_stage(clock.record(models=models))
    return 0


if __name__ == "__main__":
    stage_main(main)
