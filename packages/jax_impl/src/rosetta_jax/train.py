"""configure(), make_optimizer(), apply_optimizer() and train(): one optax optimizer, one jax.jit train step,
the TrainPlan's batches in the plan's order.

The step follows Flax's NNX "functional" style (nnx.split once into parameters and BatchNorm statistics,
jax.jit over those pure states, nnx.merge inside): it is the pattern Flax's performance guide recommends for
small models, where nnx.jit's per-call graph traversal would cost more than the step itself. The optimizer
sees the parameters only; the running statistics come out of each step's training-mode forward.
A frozen parameter (rosetta_common.weights.FROZEN) gets a zero update from the optimizer itself (make_optimizer),
so single-process and data-parallel training, which both take make_optimizer's transform, leave it as loaded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from rosetta_common.data import Dataset
from rosetta_common.interface import TrainResult
from rosetta_common.optim import adam_bias_corrections
from rosetta_common.seeding import seed_everything
from rosetta_common.spec import AdamSpec, ModelConfig, SGDSpec
from rosetta_common.training import OptimizerSpec, StepHook, TrainPlan, dropout_masks
from rosetta_common.weights import Weights, canonical_shapes, is_frozen
from rosetta_jax.models import Model, forward_logits, jax_ids, training_view
from rosetta_jax.weights import native_name


def configure(seed: int) -> None:
    """Seed and make deterministic. JAX has no global random state (and build() draws nothing: weights
    come from the canonical init), so only Python's and numpy's generators are seeded. XLA on CPU is
    deterministic already; the GPU flag and full-precision matmuls (no TF32) make a CUDA run so too.
    XLA_FLAGS is read when the first backend starts, so this must run before any JAX computation."""
    seed_everything(seed)
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_gpu_deterministic_ops" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_gpu_deterministic_ops=true".strip()
    jax.config.update("jax_default_matmul_precision", "highest")
    # Lowered programs (jax.export's StableHLO) carry source locations: keep only the innermost frame and only its
    # file name, so an export holds no path of this machine and its bytes do not depend on where the checkout or
    # the environment lives.
    jax.config.update("jax_include_full_tracebacks_in_locations", False)
    jax.config.update("jax_hlo_source_file_canonicalization_regex", r".*/")


class TorchAdamState(NamedTuple):
    count: jax.Array  # steps taken so far (int32)
    mu: optax.Updates
    nu: optax.Updates


def torch_adam(spec: AdamSpec, num_steps: int) -> optax.GradientTransformation:
    """torch.optim.Adam's arithmetic as an optax transform (updates to add to the parameters).

    optax.adam differs from torch in one place that matters at 1e-6: it computes 1 - b2**t in float32
    (~1.3e-5 relative off for small t). Here both bias corrections are computed on the host in float64 as
    torch does (rosetta_common.optim.adam_bias_corrections), rounded once to float32, and looked up by
    step count from a table -- a schedule, precomputed. `num_steps` must cover every step that will be
    taken (train() passes the plan's whole run, TrainPlan.schedule_steps, so that a truncated plan compiles
    the same step as its whole run; steps past it would reuse the last entry).
    Torch: denom = sqrt(v) / sqrt(bc2) + eps; p -= (lr / bc1) * m / denom.
    """
    b1, b2, eps = spec.beta1, spec.beta2, spec.epsilon
    corrections = [adam_bias_corrections(t, b1, b2) for t in range(1, num_steps + 1)]
    step_sizes = np.array([spec.learning_rate / bc1 for bc1, _ in corrections], np.float32)
    bc2_sqrts = np.array([bc2_sqrt for _, bc2_sqrt in corrections], np.float32)

    def init(params: optax.Params) -> TorchAdamState:
        return TorchAdamState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                              jax.tree.map(jnp.zeros_like, params))

    def update(grads: optax.Updates, state: TorchAdamState, params: optax.Params | None = None
               ) -> tuple[optax.Updates, TorchAdamState]:
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
        step_size, bc2_sqrt = jnp.asarray(step_sizes)[state.count], jnp.asarray(bc2_sqrts)[state.count]
        updates = jax.tree.map(lambda m, v: -(step_size * m) / (jnp.sqrt(v) / bc2_sqrt + eps), mu, nu)
        return updates, TorchAdamState(state.count + 1, mu, nu)

    return optax.GradientTransformation(init, update)


def optax_transform(optimizer: OptimizerSpec, num_steps: int) -> optax.GradientTransformation:
    """The optax transform computing rosetta_common.optim's formula for `optimizer` (its learning_rate one
    number, as a TrainPlan holds it) over `num_steps` steps."""
    if isinstance(optimizer, AdamSpec):
        return torch_adam(optimizer, num_steps)
    if isinstance(optimizer, SGDSpec):
        # optax's trace (t = g + m*t, zero-initialised so the first step is t = g) then -lr*t: torch's SGD.
        return optax.sgd(optimizer.learning_rate, momentum=optimizer.momentum)
    raise TypeError(f"optimizer = {optimizer!r}: unknown optimizer spec; allowed: AdamSpec, SGDSpec")


TRAINED, FROZEN = "trained", "frozen"  # make_optimizer's parameter labels (optax.partition's groups)


def frozen_paths(config: ModelConfig) -> frozenset[str]:
    """The NNX paths ("block.attn.key.bias") of the model's frozen parameters (rosetta_common.weights.FROZEN)."""
    return frozenset(native_name(name) for name in canonical_shapes(config) if is_frozen(name))


def make_optimizer(model: Model, optimizer: OptimizerSpec, num_steps: int) -> optax.GradientTransformation:
    """The contract's optimizer for `model`: optax_transform(optimizer, num_steps) on the parameters, and for a
    model with frozen parameters (the text model's key bias) optax.set_to_zero on those: their update is exactly
    zero, so adding it leaves them bit for bit as loaded (their gradient is rounding noise around a true zero,
    which Adam's normalization would turn into steps of up to the learning rate). Zeroing the update rather than
    the gradient holds for any optimizer formula, and the frozen leaves get no optimizer state at all. A model
    without frozen parameters (the image models) gets optax_transform itself, its state and steps unchanged."""
    transform = optax_transform(optimizer, num_steps)
    frozen = frozen_paths(model.config)
    if not frozen:
        return transform

    def labels(params: nnx.State) -> nnx.State:
        # One label per nnx.Variable, by its path in the parameter State (a prefix of the array leaves, which
        # optax.partition accepts): the step's parameters are nnx.split's State of the training view.
        return jax.tree_util.tree_map_with_path(
            lambda path, _: FROZEN if jax.tree_util.keystr(path, simple=True, separator=".") in frozen else TRAINED,
            params, is_leaf=lambda x: isinstance(x, nnx.Variable))

    return optax.partition({TRAINED: transform, FROZEN: optax.set_to_zero()}, labels)


def apply_optimizer(optimizer: OptimizerSpec, params: Weights, grads: Sequence[Weights]) -> list[Weights]:
    """The transform train() uses (optax_transform, jitted like the train step) run on these gradients from
    these parameters; the parameters after each step as numpy float32."""
    tx = optax_transform(optimizer, len(grads))
    update = jax.jit(tx.update)
    state: optax.Params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    opt_state = tx.init(state)
    trajectory = []
    for grad in grads:
        updates, opt_state = update({k: jnp.asarray(v, jnp.float32) for k, v in grad.items()}, opt_state, state)
        state = optax.apply_updates(state, updates)
        trajectory.append({k: np.array(v, dtype=np.float32) for k, v in state.items()})
    return trajectory


def loss_fn(model: Model, images: jax.Array, labels: jax.Array, dropout_mask: jax.Array | None) -> jax.Array:
    """Mean softmax cross-entropy from logits and integer labels."""
    return optax.softmax_cross_entropy_with_integer_labels(forward_logits(model, images, dropout_mask), labels).mean()


StepOut = tuple[nnx.State, nnx.State, optax.OptState, jax.Array]
StepFn = Callable[[nnx.State, nnx.State, optax.OptState, jax.Array, jax.Array, jax.Array | None], StepOut]


def step_function(graphdef: nnx.GraphDef[Any], tx: optax.GradientTransformation) -> StepFn:
    """One step of the model in training mode (`graphdef` of models.training_view), not yet jitted: the gradient
    of the loss with respect to the parameters only; BatchNorm's running statistics come out of the forward
    itself (Flax updates them as it normalizes with the batch's), not out of the optimizer."""

    def train_step(params: nnx.State, statistics: nnx.State, opt_state: optax.OptState, images: jax.Array,
                   labels: jax.Array, dropout_mask: jax.Array | None) -> StepOut:
        def loss_and_statistics(p: nnx.State) -> tuple[jax.Array, nnx.State]:
            # copy=True: fresh variables at the gradient's trace level, which BatchNorm may update (the
            # statistics were made outside it; NNX refuses to mutate those, "different trace level").
            model = nnx.merge(graphdef, p, statistics, copy=True)
            return loss_fn(model, images, labels, dropout_mask), nnx.state(model, nnx.BatchStat)

        (loss, statistics), grads = jax.value_and_grad(loss_and_statistics, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), statistics, opt_state, loss

    return train_step


def make_train_step(graphdef: nnx.GraphDef[Any], tx: optax.GradientTransformation) -> StepFn:
    """step_function's step, jitted over the States (distributed.train_data_parallel's, which shards them)."""
    return jax.jit(step_function(graphdef, tx))


Leaves = list[jax.Array]  # jax.tree.leaves of a TrainState: its arrays in pytree order
FlatStepFn = Callable[[Leaves, jax.Array, jax.Array, jax.Array | None], tuple[Leaves, jax.Array]]


def make_flat_train_step(graphdef: nnx.GraphDef[Any], tx: optax.GradientTransformation,
                         treedef: jax.tree_util.PyTreeDef) -> FlatStepFn:
    """step_function's step jitted over the state's leaves (a flat list of arrays, `treedef` its TrainState),
    train()'s. The same program as make_train_step's (jit flattens its arguments to these very leaves, in this
    order), so the same bits; but jit's dispatch flattens a list of arrays in C++, where nnx.State's and the
    optimizer state's pytree nodes are flattened and rebuilt in Python on every call: about 60 us a step, more
    than the digits mlp's whole step (measured, benchmarks/README.md)."""
    step = step_function(graphdef, tx)

    @jax.jit
    def flat_train_step(leaves: Leaves, images: jax.Array, labels: jax.Array,
                        dropout_mask: jax.Array | None) -> tuple[Leaves, jax.Array]:
        *state, loss = step(*jax.tree.unflatten(treedef, leaves), images, labels, dropout_mask)
        return jax.tree.leaves(state), loss

    return flat_train_step


def training_inputs(config: ModelConfig, data: Dataset) -> np.ndarray:
    """The training inputs as the steps take them, checked first (one InputError line before any step): images
    as they are, int64 token ids as JAX's int32 (models.jax_ids), converted once for the whole set."""
    inputs = config.input.check(data.train_inputs, "train inputs")
    return jax_ids(inputs) if config.input.kind == "tokens" else inputs


TrainState = tuple[nnx.State, nnx.State, optax.OptState]  # parameters, BatchNorm statistics, optimizer state
S = TypeVar("S")  # run_epochs' state: a TrainState (distributed) or its leaves (train)

# train()'s optimizer and jitted step per (model config, optimizer, whole run's steps, state structure): a jax.jit
# of a new closure compiles again, and the one-ulp replicates and the lockstep checkpoints train the same model from
# other weights up to a dozen times per stage (a compile of a second or more each, measured: the text model's stage
# spent 44 s there). The steps are the whole run's (schedule_steps), so the lockstep window's truncated replicates
# take the run's own compiled step instead of one of their own.
_OPTIMIZERS: dict[tuple[str, str, int], optax.GradientTransformation] = {}
_STEPS: dict[tuple[str, str, int, jax.tree_util.PyTreeDef], FlatStepFn] = {}


def compiled_step(model: Model, graphdef: nnx.GraphDef[Any], plan: TrainPlan, params: nnx.State,
                  statistics: nnx.State) -> tuple[optax.GradientTransformation, FlatStepFn, Leaves,
                                                  jax.tree_util.PyTreeDef]:
    """make_optimizer's transform and make_flat_train_step's step for this model and plan, made once per process
    for each model config, optimizer, number of steps (and state structure, which those fix): the same program,
    so the same bits, for every model of that config (nnx.merge puts each one's states into the same graph); and
    the initial state (params, statistics, the transform's init) as that step takes it, leaves and treedef."""
    key = (model.config.model_dump_json(), plan.optimizer.model_dump_json(), plan.schedule_steps)
    if key not in _OPTIMIZERS:
        _OPTIMIZERS[key] = make_optimizer(model, plan.optimizer, plan.schedule_steps)
    tx = _OPTIMIZERS[key]
    leaves, treedef = jax.tree.flatten((params, statistics, tx.init(params)))
    if (*key, treedef) not in _STEPS:
        _STEPS[(*key, treedef)] = make_flat_train_step(graphdef, tx, treedef)
    return tx, _STEPS[(*key, treedef)], leaves, treedef


def train(model: Model, plan: TrainPlan, data: Dataset, hook: StepHook | None = None) -> TrainResult:
    """Train in place with the plan's optimizer on the plan's batches, BatchNorm on batch statistics and each
    step's shared dropout mask (rosetta_common.training.dropout_masks); every step's loss, each epoch's time.
    The model itself stays in inference mode: a training view of it shares its variables. `hook` sees the model
    holding the step's state after its steps (the loop's state copied into it; the loop goes on from its own)."""
    config = model.config
    if plan.arch != config.arch:
        raise ValueError(f"train: plan for {plan.arch!r} but the model is {config.arch!r}")
    graphdef, params, statistics = nnx.split(training_view(model), nnx.Param, nnx.BatchStat)
    _, train_step, leaves, treedef = compiled_step(model, graphdef, plan, params, statistics)
    masks = dropout_masks(plan, config)  # None for a model without dropout; else row s is step s's mask
    inputs = training_inputs(config, data)
    epoch: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # the current epoch's batches, gathered at its first step

    def step(state: Leaves, idx: np.ndarray, s: int) -> tuple[Leaves, jax.Array]:
        # The epoch's batches gathered once, in the plan's order (run_epochs steps through plan.batches(e), idx
        # is row i of it), each step a contiguous numpy view: one gather an epoch instead of two a step (about
        # 10 us a step on the digits mlp, measured). The numpy arrays, as the mask's row: the jitted call moves
        # them. Indexing a device array here would be an eager op of its own every step (about 0.1 ms, measured).
        e, i = divmod(s, plan.steps_per_epoch)
        if e not in epoch:
            order = np.stack(plan.batches(e))
            epoch.clear()
            epoch[e] = inputs[order], data.train_labels[order]
        images, labels = epoch[e]
        mask = None if masks is None else masks[s]
        return train_step(state, images[i], labels[i], mask)

    def read(losses: list[jax.Array]) -> list[float]:
        return [float(v) for v in jax.device_get(losses)]  # waits for the epoch's last step

    def update(state: Leaves) -> None:
        params, statistics, _ = jax.tree.unflatten(treedef, state)
        nnx.update(model, params, statistics)

    def seen(s: int, state: Leaves) -> None:
        update(state)
        hook.call(s, model)

    state, result = run_epochs(plan, leaves, step, read, desc=f"jax {plan.arch}",
                               hook=None if hook is None else StepHook(hook.steps, seen))
    update(state)
    return result


def run_epochs(plan: TrainPlan, state: S, step: Callable[[S, np.ndarray, int], tuple[S, jax.Array]],
               read: Callable[[list[jax.Array]], list[float]], *, desc: str, show: bool = True, workers: int = 1,
               engine: str = "", hook: StepHook | None = None) -> tuple[S, TrainResult]:
    """The one epoch loop, for train() and distributed.train_data_parallel alike: `step` takes the state, the
    plan's batch indices and the step number and returns the new state and the step's loss (a device array);
    `read` turns an epoch's losses into floats, once per epoch (reading each at once would stall JAX's async
    dispatch); `show` the progress bar (rank 0 only); `hook` is called with the state after its steps."""
    step_losses: list[float] = []
    epoch_losses: list[float] = []
    epoch_seconds: list[float] = []
    s = 0
    start = time.perf_counter()
    with tqdm(range(plan.epochs), desc=desc, unit="epoch", leave=False, disable=not show) as bar:
        for epoch in bar:
            epoch_start = time.perf_counter()
            losses = []
            for idx in plan.batches(epoch):
                state, loss = step(state, idx, s)
                losses.append(loss)
                s += 1
                if hook is not None:
                    hook(s, state)
            epoch_step_losses = read(losses)
            epoch_seconds.append(time.perf_counter() - epoch_start)
            step_losses += epoch_step_losses
            epoch_losses.append(float(np.mean(epoch_step_losses)))
            bar.set_postfix(loss=f"{epoch_losses[-1]:.4f}")
    train_seconds = time.perf_counter() - start
    return state, TrainResult(step_losses, epoch_losses, train_seconds, epoch_seconds, workers=workers,
                              engine=engine)
