"""Stage `data`: split the configured source deterministically into data/prepared/{train,test}.npz."""

from __future__ import annotations

from pipelines import measurements, paths
from pipelines.stages import IMPORTS_STARTED, stage_main
from rosetta_common.data import prepare, save_prepared
from rosetta_common.spec import load_spec


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("data", IMPORTS_STARTED)
    spec = load_spec(paths.PARAMS)
    data = prepare(spec.data, spec.seed)
    clock.lap("prepare")
    save_prepared(data, paths.PREPARED)
    clock.lap("save")
    measurements.write_stage(clock.record())
    print(
        f"data: {len(data.train_labels)} train / {len(data.test_labels)} test images of {data.image_shape}, "
        f"{data.num_classes} classes -> {paths.PREPARED}"
    )
    return 0


if __name__ == "__main__":
    stage_main(main)
