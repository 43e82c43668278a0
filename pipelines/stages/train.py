"""Stage `train@<framework>-<model>`: train from init.safetensors, in that framework's own environment.

Writes the trained weights in canonical layout (so the validate stage can compare frameworks), the
per-step loss log and metrics/<model>/<framework>.json.
"""

from __future__ import annotations

from pipelines import paths
from pipelines.stages import framework_stage_args, stage_main
from pipelines.stages.backend import load_backend, model_config
from rosetta_common.data import load_prepared
from rosetta_common.io import write_json
from rosetta_common.metrics import accuracy, softmax_cross_entropy
from rosetta_common.training import plan
from rosetta_common.weights import count_parameters, load_weights, save_weights


def main(argv: list[str]) -> int:
    fw, arch, spec = framework_stage_args(argv, __doc__)
    backend = load_backend(fw, spec.seed)
    data = load_prepared(paths.PREPARED)
    config = model_config(spec, arch, data)
    train_plan = plan(spec, arch, len(data.train_labels))  # the learning rate resolved for this model, once

    model = backend.build(config, load_weights(paths.init_weights(arch), config))
    result = backend.train(model, train_plan, data)
    test_logits = backend.predict(model, data.test_images)
    trained = backend.to_canonical(model)

    save_weights(paths.trained_weights(arch, fw), trained, arch, framework=fw)
    write_json(
        paths.train_log(arch, fw),
        {
            "framework": fw,
            "model": arch,
            "optimizer": train_plan.optimizer_name,
            "steps_per_epoch": train_plan.steps_per_epoch,
            "step_losses": result.step_losses,
            "epoch_losses": result.epoch_losses,
        },
    )
    metrics = {
        "test_accuracy": accuracy(test_logits, data.test_labels),
        "test_loss": softmax_cross_entropy(test_logits, data.test_labels),
        "final_train_loss": result.epoch_losses[-1],
        "train_seconds": result.train_seconds,
        "samples_per_second": train_plan.num_steps * train_plan.batch_size / result.train_seconds,
        "parameters": count_parameters(trained),
        "epochs": train_plan.epochs,
        "optimizer": train_plan.optimizer_name,
        "epoch_losses": result.epoch_losses,
    }
    write_json(paths.metrics(arch, fw), metrics)
    print(
        f"train: {fw}/{arch} test_accuracy={metrics['test_accuracy']:.4f} "
        f"test_loss={metrics['test_loss']:.5f} in {result.train_seconds:.1f}s"
    )
    return 0


if __name__ == "__main__":
    stage_main(main)
