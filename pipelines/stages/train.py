"""Stage `train@<framework>-<model>`: train from init.safetensors, in that framework's own environment.

Writes the trained weights in canonical layout (so the validate stage can compare frameworks), the
per-step loss log and metrics/<model>/<framework>.json.
"""

from __future__ import annotations

from pipelines import paths
from pipelines.stages import framework_stage_args, stage_main
from pipelines.stages.backend import load_backend
from rosetta_common.data import load_prepared
from rosetta_common.io import write_json
from rosetta_common.metrics import accuracy, softmax_cross_entropy
from rosetta_common.weights import count_parameters, load_weights, save_weights


def main(argv: list[str]) -> int:
    fw, arch, spec = framework_stage_args(argv, __doc__)
    spec = spec.for_model(arch)  # learning rates resolved to this model's
    backend = load_backend(fw, spec.seed)
    data = load_prepared(paths.PREPARED)
    init = load_weights(paths.init_weights(arch))

    model = backend.build(arch, spec, init)
    model, result = backend.train(model, arch, spec, data)
    test_logits = backend.predict(model, data.test_images)
    trained = backend.canonical_weights(model)

    steps = len(result.step_losses)
    save_weights(paths.trained_weights(arch, fw), trained, arch, framework=fw)
    write_json(
        paths.train_log(arch, fw),
        {
            "framework": fw,
            "model": arch,
            "optimizer": spec.train.optimizer,
            "steps_per_epoch": steps // spec.train.epochs,
            "step_losses": result.step_losses,
            "epoch_losses": result.epoch_losses,
        },
    )
    metrics = {
        "test_accuracy": accuracy(test_logits, data.test_labels),
        "test_loss": softmax_cross_entropy(test_logits, data.test_labels),
        "final_train_loss": result.epoch_losses[-1],
        "train_seconds": result.train_seconds,
        "samples_per_second": steps * spec.train.batch_size / result.train_seconds,
        "parameters": count_parameters(trained),
        "epochs": spec.train.epochs,
        "optimizer": spec.train.optimizer,
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
