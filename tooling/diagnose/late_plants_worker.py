"""The framework side of tooling.diagnose.late_plants, run in that framework's environment by the runner:

    python -m pipelines.runner <framework> -- python -m tooling.diagnose.late_plants_worker <framework> <arch> \
        <plant> <size> <replicates> <out.jsonl>

trains a model's run and its replicates 1 to <replicates> exactly as train_export and the replicates stage do
(the shared init and plan; replicates.ulps with the framework's own signs, each batch's rows in its own order:
pipelines.stages.common.replicate_start), from this checkout's prepared data and init weights, and writes each
training's end state as one JSON line: its step losses (for where it parts), test loss, test accuracy and test
predictions. With a <plant> other than "none" each training carries a porting mistake that acts only from epoch
E // 2 + 1 of its E on (cnn: epoch 6 of 10, optimizer step 221 of 440; text_transformer: epoch 2 of 3, step 321 of
960), long after the lockstep window and the runs' parting. JAX only: the change reaches rosetta_jax.train's
optimizer (optax_transform) or its compiled step (compiled_step), through the module's own names.

- lr: every update multiplied by 1 + <size> (a learning-rate schedule off by that factor from then on). Every
  step before it is the unplanted training's, bit for bit.
- wd: <size> x each parameter added to its gradient (an L2 weight decay switched on then). Zero before it, but
  the extra operation changes how XLA rounds Adam's update from the first steps (bit differences from step 3 to
  18 on digits, far inside the lockstep bound): the planted trainings part from the unplanted ones as another
  framework's do.
- ls: the loss against labels smoothed by <size> (optax.smooth_labels: 1 - <size> on the true class plus <size>
  spread over all classes), from then on.
- bn: every BatchNorm's momentum <size> (the weight of the old running statistics; params.yaml's is 0.9) from
  then on: 0.1 is the classic port that passes torch's momentum argument where Keras and Flax take its complement.
ls and bn swap train's compiled step for a second one at that step (the first traced as train traces it), so
every step before it is the unplanted training's, bit for bit.

A failure is one line on stderr and exit status 2."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.stages.common import Job, load_jobs, rebuilt, replicate_start, seeded_backend
from rosetta_common.errors import RosettaError
from rosetta_common.metrics import accuracy, softmax_cross_entropy
from rosetta_common.spec import Spec, load_spec

PLANTS = ("none", "lr", "wd", "ls", "bn")


def late_optimizer(plant: str, size: float, start: int) -> None:
    """lr or wd from optimizer step `start` (0-based) on: rosetta_jax's optimizer wrapped."""
    import jax
    import jax.numpy as jnp
    import optax

    train = importlib.import_module("rosetta_jax.train")  # the module: the package exports its train function
    original = train.optax_transform

    def late_decay(decay: float) -> optax.GradientTransformation:
        def init(params: Any) -> optax.ScaleByScheduleState:
            return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

        def update(updates: Any, state: optax.ScaleByScheduleState, params: Any = None) -> Any:
            on = (state.count >= start).astype(jnp.float32) * jnp.float32(decay)
            updates = jax.tree_util.tree_map(lambda g, p: g + on * p, updates, params)
            return updates, optax.ScaleByScheduleState(count=state.count + 1)

        return optax.GradientTransformation(init, update)

    def planted(optimizer: Any, num_steps: int) -> optax.GradientTransformation:
        transform = original(optimizer, num_steps)
        if plant == "lr":
            factor = np.float32(1.0 + size)
            return optax.chain(transform, optax.scale_by_schedule(
                lambda count: jnp.where(count >= start, factor, np.float32(1.0))))
        return optax.chain(late_decay(size), transform)

    train.optax_transform = planted


def late_step(plant: str, size: float, start: int) -> None:
    """From optimizer step `start` on, train's steps run a second jitted step: the loss with labels smoothed by
    `size` (ls), or every BatchNorm at momentum `size` (bn). Before it, train's own compiled step."""
    import jax
    import optax
    from flax import nnx

    train = importlib.import_module("rosetta_jax.train")
    models = importlib.import_module("rosetta_jax.models")
    original_step, original_loss = train.compiled_step, train.loss_fn
    smoothing = {"on": False}  # read when a step is traced: only the late step is traced with it on

    def loss_fn(model: Any, images: Any, labels: Any, dropout_mask: Any) -> Any:
        if not smoothing["on"]:
            return original_loss(model, images, labels, dropout_mask)
        logits = models.forward_logits(model, images, dropout_mask)
        targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), size)
        return optax.softmax_cross_entropy(logits, targets).mean()

    def late_graphdef(model: Any) -> Any:
        view = models.training_view(model)  # a new node: setting its BatchNorms' momentum leaves the model's
        if plant == "bn":
            norms = [m for _, m in nnx.iter_graph(view) if isinstance(m, nnx.BatchNorm)]
            if not norms:
                raise RosettaError(f"plant: 'bn': the {model.config.arch} model has no BatchNorm; allowed: a model "
                                   "with one")
            for norm in norms:
                norm.momentum = size
        return nnx.split(view, nnx.Param, nnx.BatchStat)[0]

    late: dict[Any, Any] = {}

    def compiled_step(model: Any, graphdef: Any, plan: Any, params: Any, statistics: Any) -> Any:
        tx, step, leaves, treedef = original_step(model, graphdef, plan, params, statistics)
        key = (model.config.model_dump_json(), treedef)
        if key not in late:
            late[key] = train.make_flat_train_step(late_graphdef(model), tx, treedef)
        taken = [0]

        def planted(*args: Any) -> Any:
            taken[0] += 1
            if taken[0] <= start:
                return step(*args)
            smoothing["on"] = plant == "ls"
            try:
                return late[key](*args)
            finally:
                smoothing["on"] = False

        return tx, planted, leaves, treedef

    train.loss_fn, train.compiled_step = loss_fn, compiled_step


def main(argv: list[str]) -> int:
    framework, arch, plant, size, count, out = argv
    if plant not in PLANTS:
        raise RosettaError(f"plant: {plant!r}: must be one of {', '.join(PLANTS)}")
    if plant != "none" and framework != "jax":
        raise RosettaError(f"plant: {plant!r} in {framework!r}: a late plant is planted in jax only")
    spec = load_spec(paths.PARAMS)
    job = load_jobs(spec, [arch])[0]
    start = job.plan.epochs // 2 * job.plan.steps_per_epoch  # optimizer steps before the plant acts
    if plant in ("lr", "wd"):
        late_optimizer(plant, float(size), start)
    elif plant != "none":
        late_step(plant, float(size), start)
    backend = seeded_backend(framework, spec.seed)
    partial = Path(f"{out}.partial")  # renamed to `out` once every training is written: no half a pool
    try:
        write_pool(backend, job, spec, framework, plant, float(size), start, int(count), partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(out)
    return 0


def write_pool(backend: ModuleType, job: Job, spec: Spec, framework: str, plant: str, size: float, start: int,
               count: int, partial: Path) -> None:
    """The run and replicates 1 to `count`, one JSON line each, into `partial`."""
    model = None
    arch = job.config.arch
    with open(partial, "w") as f:
        for i in range(count + 1):
            backend.configure(spec.seed)
            init, plan = (job.init, job.plan) if i == 0 else replicate_start(job, i, spec.replicates.ulps,
                                                                             framework)[:2]
            model = rebuilt(backend, job, model, init)
            result = backend.train(model, plan, job.data)
            logits = backend.predict(model, job.data.test_inputs)
            f.write(json.dumps({
                "framework": framework, "model": arch, "seed": spec.seed, "plant": plant, "size": size,
                "start": start, "index": i, "step_losses": [float(x) for x in result.step_losses],
                "test_loss": softmax_cross_entropy(logits, job.data.test_labels),
                "test_accuracy": accuracy(logits, job.data.test_labels),
                "test_predictions": np.argmax(logits, axis=1).astype(int).tolist()}) + "\n")
            f.flush()
            print(f"late_plants_worker {framework} {arch} {plant} {size:g}: training {i} of {count}", flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (RosettaError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
