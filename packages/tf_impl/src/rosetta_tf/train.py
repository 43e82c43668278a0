"""Seeding/determinism, the optimizers, and training with Keras' own compile + fit on a TrainPlan's batches.

Parity with the other frameworks needs three things Keras does not give by default:
- torch's Adam formula (Keras' Adam adds epsilon before the bias correction): TorchAdam below;
- exactly the common batches in exactly the common order: a tf.data pipeline over the plan's index
  batches (TrainPlan.all_batches), consumed by fit with steps_per_epoch;
- for a model with dropout, the same dropped units as the other frameworks: each step's mask from
  rosetta_common.training.dropout_masks rides in the same tf.data stream, as the second input of the
  model's training twin (models.training_view), so fit's one compiled step applies it;
- BatchNorm in training mode: fit runs the model with training=True, so each step normalizes with its
  batch's statistics and moves the running statistics by the spec's convention (models.batchnorm);
- the exact float32 loss of every step: Keras' logs["loss"] is a running mean over the epoch, so the
  StepLoss metric keeps each batch's loss, computed with the very loss object fit differentiates.
On a CPU the step is compiled by XLA (`xla_step`), as JAX's is. fit runs a whole epoch per call of its compiled loop
(steps_per_execution): StepLoss writes each step's loss into a row of its own, read once a call, so training does not
return to Python between steps; a StepHook's steps end one fit call each (`segments`).
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import ops
from tqdm.auto import tqdm

from rosetta_common.data import Dataset
from rosetta_common.errors import TrainingError
from rosetta_common.interface import TrainResult
from rosetta_common.onnx_conventions import INPUT_NAME
from rosetta_common.seeding import seed_everything
from rosetta_common.spec import AdamSpec, ModelConfig, SGDSpec
from rosetta_common.training import OptimizerSpec, StepHook, TrainPlan, dropout_masks
from rosetta_common.weights import Weights
from rosetta_tf.models import MASK_INPUT, PACKAGE, model_config, training_view


def configure(seed: int) -> None:
    """Seed Python, numpy, TF and Keras, and make every TF op deterministic (or raise if it cannot be)."""
    seed_everything(seed)
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    # Full fp32 matmuls and convolutions on GPUs: TF32 would differ from the other frameworks by ~1e-3.
    tf.config.experimental.enable_tensor_float_32_execution(False)


def dense(gradient: Any) -> Any:
    """A gradient as one dense tensor. An Embedding's gradient is tf.IndexedSlices (the rows its batch gathered);
    torch's nn.Embedding (sparse=False) and JAX give a dense one, zero in the rows not gathered, so their Adam and
    SGD decay every row's momentum each step: densified, Keras' update is the same formula on every row, not only on
    the gathered ones. Dense gradients (every image model's) pass unchanged."""
    return tf.convert_to_tensor(gradient) if isinstance(gradient, tf.IndexedSlices) else gradient


@keras.saving.register_keras_serializable(package=PACKAGE)
class TorchAdam(keras.optimizers.Optimizer):
    """Adam exactly as torch.optim.Adam (single-tensor path) and rosetta_common.optim.adam_step compute it.

    Differences from keras.optimizers.Adam: epsilon is added after the bias correction, and the bias
    corrections and step size are computed in float64 (as torch does in Python) before rounding to
    float32. The learning rate is kept as a Python float for the same reason (Keras' own learning-rate
    variable is float32), so schedules are not supported.
    """

    def __init__(self, learning_rate: float = 1e-3, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-8, name: str = "torch_adam", **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.lr64, self.beta_1, self.beta_2, self.epsilon = float(learning_rate), beta_1, beta_2, epsilon

    def build(self, var_list: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(var_list, ["momentum", "velocity"])

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        dtype = variable.dtype
        step = ops.cast(self.iterations + 1, "float64")  # iterations is incremented after the update
        bc1 = 1.0 - ops.power(ops.convert_to_tensor(self.beta_1, "float64"), step)
        bc2 = 1.0 - ops.power(ops.convert_to_tensor(self.beta_2, "float64"), step)
        step_size = ops.cast(self.lr64 / bc1, dtype)
        bc2_sqrt = ops.cast(ops.sqrt(bc2), dtype)
        g = ops.cast(dense(gradient), dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        # torch: m.lerp_(g, 1 - b1), which for a weight < 0.5 is m + w * (g - m).
        self.assign(m, m + np.float32(1.0 - self.beta_1) * (g - m))
        # torch: v.mul_(b2).addcmul_(g, g, value=1 - b2), i.e. v*b2 + ((1-b2)*g)*g.
        self.assign(v, v * np.float32(self.beta_2) + np.float32(1.0 - self.beta_2) * g * g)
        denom = ops.sqrt(v) / bc2_sqrt + np.float32(self.epsilon)
        # torch: p.addcdiv_(m, denom, value=-step_size), i.e. p - (step_size*m)/denom.
        self.assign_sub(variable, step_size * m / denom)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "learning_rate": self.lr64, "beta_1": self.beta_1,
                "beta_2": self.beta_2, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package=PACKAGE)
class DenseSGD(keras.optimizers.SGD):
    """Keras' SGD on dense gradients (`dense`): a token model's, whose Embedding gradient is IndexedSlices. The image
    models keep keras.optimizers.SGD itself (their gradients are dense already; their trained exports unchanged)."""

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        super().update_step(dense(gradient), variable, learning_rate)


def make_optimizer(model: keras.Model | None, optimizer: OptimizerSpec, num_steps: int) -> keras.optimizers.Optimizer:
    """The Keras optimizer computing rosetta_common.optim's formula for `optimizer` (one learning rate, as
    TrainPlan resolves it). `num_steps` is part of the shared signature; Keras optimizers create their slots
    on first use and the rate is constant, so it is not needed here. `model` (None: an image model's) picks
    DenseSGD for a token model."""
    if not isinstance(optimizer, AdamSpec | SGDSpec):
        raise TypeError(f"optimizer {type(optimizer).__name__}: unknown; allowed: AdamSpec, SGDSpec")
    if isinstance(optimizer.learning_rate, dict):
        raise TypeError(f"learning_rate = {optimizer.learning_rate!r}: one number expected "
                        "(rosetta_common.training.plan resolves per-model rates)")
    if isinstance(optimizer, AdamSpec):
        return TorchAdam(optimizer.learning_rate, optimizer.beta1, optimizer.beta2, optimizer.epsilon)
    # SGD: Keras' v = m*v - lr*g; p += v is torch's b = m*b + g; p -= lr*b for a constant learning rate
    # (the conformance suite checks it against rosetta_common.optim.sgd_step).
    tokens = model is not None and model_config(model).input.kind == "tokens"
    sgd = DenseSGD if tokens else keras.optimizers.SGD
    return sgd(learning_rate=optimizer.learning_rate, momentum=optimizer.momentum)


def run_optimizer(optimizer: keras.optimizers.Optimizer, params: Weights, grads: Sequence[Weights]) -> list[Weights]:
    """Run a Keras optimizer on keras Variables holding `params`, one apply_gradients per gradient dict;
    the parameters after each step, as float32 numpy dicts."""
    variables = {name: keras.Variable(np.asarray(value, np.float32)) for name, value in params.items()}
    trajectory = []
    for grad in grads:
        optimizer.apply_gradients([(tf.constant(grad[name], tf.float32), var) for name, var in variables.items()])
        trajectory.append({name: np.array(var.numpy(), dtype=np.float32) for name, var in variables.items()})
    return trajectory


def apply_optimizer(optimizer: OptimizerSpec, params: Weights, grads: Sequence[Weights]) -> list[Weights]:
    """The optimizer make_optimizer builds for `optimizer`, run on these parameters and gradients."""
    return run_optimizer(make_optimizer(None, optimizer, len(grads)), params, grads)


def make_loss() -> keras.losses.Loss:
    """Mean softmax cross-entropy over the batch, from logits and integer labels."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@keras.saving.register_keras_serializable(package=PACKAGE)
class StepLoss(keras.metrics.Metric):
    """Every step's loss (not a running mean) of one call of fit's compiled loop, which runs up to `steps` steps
    (steps_per_execution): the call's i-th step writes row i, with the same loss object as compile's loss. Rows
    count from the last reset (fit resets metrics at each epoch's start), so each call starts at row 0."""

    def __init__(self, steps: int = 1, name: str = "step_loss", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.steps = int(steps)
        self.loss_fn = make_loss()
        self.values = self.add_variable(shape=(self.steps,), initializer="zeros", name="values")
        self.seen = self.add_variable(shape=(), initializer="zeros", dtype="int32", name="seen")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        row = ops.reshape(self.seen % self.steps, (1, 1))
        loss = ops.reshape(self.loss_fn(y_true, y_pred), (1,))
        self.values.assign(ops.scatter_update(self.values, row, loss))
        self.seen.assign(self.seen + 1)

    def result(self) -> Any:
        return ops.convert_to_tensor(self.values)

    def reset_state(self) -> None:
        self.values.assign(np.zeros(self.steps, np.float32))
        self.seen.assign(0)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "steps": self.steps}


class _Record(keras.callbacks.Callback):
    """Collects every step's loss, a call of fit's loop at a time (StepLoss's rows), and the wall time at the end of
    each call; drives one tqdm bar over all of train()'s fit calls."""

    def __init__(self, total_steps: int, desc: str) -> None:
        super().__init__()
        self.step_losses: list[float] = []
        self.clock: dict[int, float] = {0: time.perf_counter()}  # steps done -> when
        self.fit_steps = self.fit_done = 0
        self.bar = tqdm(total=total_steps, desc=desc, unit="step", leave=False)

    def start(self, steps: int) -> None:
        """The next fit call runs `steps` steps."""
        self.fit_steps, self.fit_done = steps, 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # `batch`: the last step fit's call was given, counted from the fit's first; the fit's last call may run fewer.
        done = min(batch + 1, self.fit_steps)
        rows = np.asarray((logs or {})["step_loss"], np.float32)[:done - self.fit_done]
        self.step_losses += [float(v) for v in rows]
        self.fit_done = done
        self.clock[len(self.step_losses)] = time.perf_counter()
        self.bar.update(len(rows))
        self.bar.set_postfix(loss=f"{self.step_losses[-1]:.4f}")

    def epoch_seconds(self, steps_per_epoch: int, epochs: int) -> list[float]:
        """Each epoch's wall time: every epoch ends a call of fit's loop (`segments`)."""
        ends = [self.clock[e * steps_per_epoch] for e in range(epochs + 1)]
        return [b - a for a, b in itertools.pairwise(ends)]


def segments(plan: TrainPlan, hook_steps: Collection[int]) -> list[int]:
    """The step at which each of train()'s fit calls ends: each hook step (the variables then hold that step's
    state) and each epoch's end through the first at or after the last hook step; from there one call runs to the
    end, its compiled loop an epoch a call. Every epoch's end is then a call's end, where time is read."""
    spe, n = plan.steps_per_epoch, plan.num_steps
    hooked = [s for s in hook_steps if 1 <= s <= n]
    through = min(-(-max(hooked, default=0) // spe) * spe, n)
    return sorted({*hooked, *range(spe, through + 1, spe), n})


def check_inputs(config: ModelConfig, data: Dataset) -> None:
    """The training inputs are what the model reads (one InputError line otherwise): images for an image model,
    int64 token ids for a token model. Fed the wrong kind, Keras would cast it silently (images to int64 ids)."""
    config.input.check(data.train_inputs, f"the {config.arch} model's train_inputs")


def plan_batches(plan: TrainPlan, data: Dataset, masks: np.ndarray | None = None,
                 rows: slice = slice(None), steps: slice = slice(None)) -> tf.data.Dataset:
    """All epochs' batches, in the plan's order, as one tf.data stream; with `masks` (num_steps, batch,
    features), step s also carries masks[s], and the inputs are the training model's dict. `rows`: only
    these rows of every batch and of its mask (a data-parallel worker's share; default all). `steps`: only
    these steps (0-based; default all).

    The gather runs inside tf.data so fit never goes back to Python for data.
    """
    if plan.num_samples != len(data.train_labels):
        raise ValueError(f"the plan is for {plan.num_samples} training samples, the data has {len(data.train_labels)}")
    # Images float32, token ids int64 (rosetta_common.data); the gathered batches are what the model's input takes.
    dtype = tf.int64 if np.asarray(data.train_inputs).dtype.kind in "iu" else tf.float32
    images, labels = tf.constant(data.train_inputs, dtype), tf.constant(data.train_labels, tf.int64)
    batches = plan.all_batches()[steps, rows]
    if masks is None:
        ds = tf.data.Dataset.from_tensor_slices(batches)
        return ds.map(lambda idx: (tf.gather(images, idx), tf.gather(labels, idx))).prefetch(2)
    ds = tf.data.Dataset.from_tensor_slices((batches, masks[steps, rows]))
    return ds.map(lambda idx, mask: ({INPUT_NAME: tf.gather(images, idx), MASK_INPUT: mask},
                                     tf.gather(labels, idx))).prefetch(2)


# Trainer -> the optimizer spec and steps per execution it was compiled with. Tracing fit's step costs seconds a
# model (more than training most of them on digits), and a new compile traces again: a model trained again (a
# replicate, its weights put back by from_canonical) keeps its compiled step, its optimizer restarted instead of
# rebuilt.
_COMPILED: weakref.WeakKeyDictionary[keras.Model, tuple[OptimizerSpec, int]] = weakref.WeakKeyDictionary()


def restart(optimizer: keras.optimizers.Optimizer) -> None:
    """The optimizer as a fresh one of its kind starts: no step taken, every slot (momentum, velocity) zero. Its
    learning rate (a variable too) stays."""
    rate = optimizer.learning_rate  # a constant rate: Keras' variable itself
    for variable in optimizer.variables:
        if variable is not rate:
            variable.assign(np.zeros(variable.shape, variable.dtype))


# Layers whose training step stays on TF's kernels: tf2xla refuses MaxPool's gradient under op determinism ("no
# deterministic XLA implementation"), and XLA would re-fuse the channel sums whose order models.BatchNormalization
# fixes (docs/conventions.md, "BatchNorm sums (TF)").
NOT_XLA = (keras.layers.MaxPooling2D, keras.layers.BatchNormalization)


def _layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    """Every layer of a functional model (Model.layers), those of the models nested in it included."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def xla_step(trainer: keras.Model) -> bool:
    """Whether fit's training step is compiled by XLA: on a CPU, for a model without a NOT_XLA layer. XLA's CPU code
    is deterministic from one process to the next (JAX's is the same compiler) and about halves the text model's
    step on 2 cores; on a GPU some XLA kernels are not deterministic. Keras refuses it under op determinism:
    compile_step sets it."""
    excluded = any(isinstance(layer, NOT_XLA) for layer in _layers(trainer))
    return not excluded and not tf.config.list_physical_devices("GPU")


def compile_step(trainer: keras.Model) -> None:
    """Compile fit's training step with XLA where xla_step says, on a model compiled with jit_compile=False.

    Keras refuses XLA under op determinism (model_supports_jit: compile(jit_compile=True) and the public
    jit_compile setter both warn and keep it off, since upstream keras-team/keras#20315, which answered
    tensorflow/tensorflow#69417's GPU MaxPool gradient); Keras has no public way to opt back in. So the
    private attribute behind the jit_compile property is set. Without it the trained bytes change (the losses and
    weights of mlp, attention, lstm, gru and text_transformer all differ) and the text model's epochs take 2.7 s
    instead of 1.5 s (params.yaml's model, 4,000 snippets an epoch, 2 threads). Guarded: if a Keras release moves
    the attribute, the property no longer reads it and training stops with a TrainingError rather than train other
    bytes; test_train's test of this internal fails first."""
    xla = xla_step(trainer)
    trainer._jit_compile = xla
    if trainer.jit_compile is not xla:
        raise TrainingError(f"Keras {keras.__version__}: Model.jit_compile no longer reads Model._jit_compile, so "
                            f"fit's step cannot be XLA's and would train other bytes (rosetta_tf.train.compile_step)")


def build_for_fit(trainer: keras.Model, batch: tuple[Any, Any]) -> None:
    """Create every variable fit's step uses (the optimizer's slots, the compiled loss's and metrics' states) before
    fit traces the step, from one batch, in inference mode (BatchNorm's statistics untouched; fit resets the states
    it filled). Keras defers this to the trace when no distribution strategy is set, and a tf.function that creates
    variables while traced is traced again: two traces of the step instead of one (the attention model's first fit
    call takes 4.1 s with this, 7.2 s without, on a 2-core AMD EPYC)."""
    x, y = batch
    y_pred = trainer(x, training=False)
    trainer.compute_loss(x, y, y_pred, training=False)
    trainer.compute_metrics(x, y, y_pred)
    trainer.optimizer.build(trainer.trainable_variables)


def train(model: keras.Model, plan: TrainPlan, data: Dataset, hook: StepHook | None = None) -> TrainResult:
    """Train `model` in place with compile + fit on the plan's batches; every step's loss and each epoch's time.

    A model with dropout trains through its training twin (models.training_view: the same layers and
    variables, plus the step's dropout mask as an input); the others train as they are. The model stays in
    inference mode afterwards: Keras keeps no mode, and predict() calls it with training=False. fit runs an epoch
    per call of its compiled loop; `hook` runs between fit calls, one ending at each of its steps (`segments`), so the
    variables hold that step's state. A model trained before with the same optimizer spec trains on its compiled
    step again (`_COMPILED`), as a fresh build would.
    """
    config = model_config(model)
    if plan.arch != config.arch:
        raise ValueError(f"plan.arch = {plan.arch!r}: the model is a {config.arch} model; allowed: {config.arch!r}")
    check_inputs(config, data)
    masks = dropout_masks(plan, config)  # None for a model without dropout
    trainer = training_view(model)
    epoch = plan.num_samples // plan.batch_size  # a whole epoch's steps, truncated plan or not: one compile a model
    if _COMPILED.get(trainer) == (plan.optimizer, epoch):
        restart(trainer.optimizer)  # trained before with this optimizer: fit reuses its traced step
    else:
        # An epoch per call of fit's compiled loop; XLA where xla_step says (compile_step: Keras' own check would
        # refuse it under op determinism).
        trainer.compile(optimizer=make_optimizer(model, plan.optimizer, plan.num_steps), loss=make_loss(),
                        metrics=[StepLoss(epoch)], jit_compile=False, steps_per_execution=epoch)
        compile_step(trainer)
        build_for_fit(trainer, next(iter(plan_batches(plan, data, masks, steps=slice(0, 1)))))
        _COMPILED[trainer] = (plan.optimizer, epoch)
    record = _Record(plan.num_steps, desc=f"tf {plan.arch}")
    done = 0
    for end in segments(plan, () if hook is None else hook.steps):
        record.start(end - done)
        trainer.fit(plan_batches(plan, data, masks, steps=slice(done, end)), epochs=1, steps_per_epoch=end - done,
                    shuffle=False, verbose=0, callbacks=[record])
        if len(record.step_losses) != end:
            raise TrainingError(f"tf {plan.arch}: fit ran {len(record.step_losses)} steps, {end} expected")
        if hook is not None:
            hook(end, model)
        done = end
    record.bar.close()
    seconds = record.clock[plan.num_steps] - record.clock[0]
    return train_result(plan, record.step_losses, seconds, record.epoch_seconds(plan.steps_per_epoch, plan.epochs))


def train_result(plan: TrainPlan, losses: list[float], seconds: float, epoch_seconds: list[float],
                 workers: int = 1, engine: str = "") -> TrainResult:
    """The TrainResult of a finished run (single-process or data-parallel): each epoch's mean step loss, and a
    TrainingError naming the first step whose loss is not finite."""
    steps = plan.steps_per_epoch
    if not np.isfinite(losses).all():
        raise TrainingError(f"tf {plan.arch}: the training loss became non-finite at step "
                            f"{int(np.argmin(np.isfinite(losses))) + 1} of {len(losses)}")
    epoch_losses = [float(np.mean(losses[e * steps:(e + 1) * steps], dtype=np.float64)) for e in range(plan.epochs)]
    return TrainResult(step_losses=losses, epoch_losses=epoch_losses, train_seconds=seconds,
                       epoch_seconds=epoch_seconds, workers=workers, engine=engine)
