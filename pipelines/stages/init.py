"""Stage `init@<model>`: the canonical initial weights every framework starts from."""

from __future__ import annotations

import argparse

from pipelines import paths
from pipelines.stages import check_model, stage_main
from rosetta_common.data import load_prepared
from rosetta_common.spec import ModelConfig, load_spec
from rosetta_common.weights import count_parameters, init_weights, save_weights


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    args = parser.parse_args(argv)
    spec = load_spec(paths.PARAMS)  # validates params.yaml (models included) before anything is written
    check_model(spec, args.model)
    data = load_prepared(paths.PREPARED)
    config = ModelConfig.of(spec, args.model, data.image_shape, data.num_classes)
    weights = init_weights(config, spec.seed)
    save_weights(paths.init_weights(args.model), weights, args.model, seed=str(spec.seed))
    print(f"init: {args.model} with {count_parameters(weights):,} parameters -> {paths.init_weights(args.model)}")
    return 0


if __name__ == "__main__":
    stage_main(main)
