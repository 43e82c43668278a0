"""train.py of the contract: the real optimizer computes the reference formula, the plan's learning rate is
the one used, every step is reported, and two processes train bit for bit alike."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from rosetta_common.conformance.selected import skip_unless_tested
from rosetta_common.conformance.train_worker import HOOK_STEPS
from rosetta_common.optim import adam_step, sgd_step
from rosetta_common.spec import ARCHITECTURES, parse_spec
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan
from rosetta_common.weights import FROZEN, Weights, trainable_names

STEPS = 6


def _gradients(seed: int) -> tuple[Weights, list[Weights]]:
    rng = np.random.default_rng(seed)
    shapes = {"layer.kernel": (5, 3), "layer.bias": (3,)}
    params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    # Gradients of mixed scale, some tiny: Adam's epsilon and bias corrections both matter.
    grads = [{k: (rng.normal(size=s) * 10.0 ** rng.integers(-6, 1)).astype(np.float32) for k, s in shapes.items()}
             for _ in range(STEPS)]
    return params, grads


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_real_optimizer_computes_the_reference_formula(backend: ModuleType, name: str) -> None:
    optimizer = plan(small_spec(optimizer=name), "mlp", 64).optimizer
    params, grads = _gradients(1)
    trajectory = backend.apply_optimizer(optimizer, params, grads)
    assert len(trajectory) == STEPS
    expected = {k: v.copy() for k, v in params.items()}
    state = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    for step, (grad, got) in enumerate(zip(grads, trajectory, strict=True), start=1):
        for k in params:
            m, v = state[k]
            if name == "adam":
                expected[k], m, v = adam_step(expected[k], grad[k], m, v, step, optimizer)
            else:
                expected[k], m = sgd_step(expected[k], grad[k], m, optimizer)
            state[k] = (m, v)
            np.testing.assert_allclose(got[k], expected[k], rtol=1e-6, atol=1e-7, err_msg=f"step {step} {k}")


def test_the_plans_per_model_learning_rate_is_the_one_used(backend: ModuleType, arch: str) -> None:
    """One SGD step without momentum moves every weight by -lr * gradient: doubling this model's rate in a
    per-model map (the others' rates unchanged) must double every weight's move."""
    config = small_config(arch)
    data = learnable_data(n_train=16, n_test=4, tokens=config.input.kind == "tokens")
    start = asymmetric_weights(config, 30)
    moves = []
    for rate in (0.1, 0.2):
        rates = {a: (rate if a == arch else 0.5) for a in ARCHITECTURES}
        spec = parse_spec({**small_spec().model_dump(mode="json"),
                           "train": {"epochs": 1, "batch_size": 16, "optimizer": "sgd"},
                           "optimizers": {"sgd": {"learning_rate": rates, "momentum": 0.0}}})
        train_plan = plan(spec, arch, 16)
        assert train_plan.learning_rate == rate and train_plan.num_steps == 1
        model = backend.build(config, start)
        backend.train(model, train_plan, data)
        after = backend.to_canonical(model)
        moves.append(np.concatenate([(after[k].astype(np.float64) - start[k]).ravel()
                                     for k in trainable_names(config)]))  # running statistics move on their own
    small, large = moves
    # Only moves far above float32 rounding of the weight itself (~1e-7 here) can show the ratio to 5e-3.
    moved = np.abs(small) > 1e-4
    assert moved.sum() >= 10
    np.testing.assert_allclose(large[moved] / small[moved], 2.0, rtol=5e-3)


def test_two_processes_train_bitwise_identically(two_runs: list[dict[str, np.ndarray]], arch: str) -> None:
    first, second = two_runs  # the first with a hook: it changed nothing
    keys = [k for k in first if k.startswith(f"{arch}/") and not k.endswith("epoch_seconds") and "/hook/" not in k]
    assert any("/weights/" in k for k in keys)
    for key in keys:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)


def test_a_step_hook_sees_the_state_the_run_stopped_there_ends_in(two_runs: list[dict[str, np.ndarray]],
                                                                  arch: str) -> None:
    """The hook, called after steps 2, 5 and 16 (the last, in the second epoch), saw the model in inference mode
    holding exactly the state of the same training stopped there (another process), weights and logits."""
    hooked, stopped = two_runs
    for step in HOOK_STEPS:
        seen = {k.split(f"/hook/{step}/", 1)[1]: v for k, v in hooked.items() if k.startswith(f"{arch}/hook/{step}/")}
        assert "logits" in seen and any(k.startswith("weights/") for k in seen), (arch, step)
        prefix = f"{arch}/" if step == HOOK_STEPS[-1] else f"{arch}/truncated/{step}/"  # the last: the run's end
        for name, value in seen.items():
            np.testing.assert_array_equal(value, stopped[prefix + name], err_msg=f"{arch} step {step} {name}")


def test_training_reports_every_step_and_learns(two_runs: list[dict[str, np.ndarray]], arch: str) -> None:
    run = two_runs[0]
    spec = small_spec()
    steps, epoch_losses = run[f"{arch}/step_losses"], run[f"{arch}/epoch_losses"]
    assert steps.shape == (int(run[f"{arch}/num_steps"]),) and np.isfinite(steps).all()
    assert len(epoch_losses) == len(run[f"{arch}/epoch_seconds"]) == spec.train.epochs
    per_epoch = len(steps) // spec.train.epochs
    np.testing.assert_allclose(epoch_losses, steps.reshape(spec.train.epochs, per_epoch).mean(axis=1), rtol=1e-6)
    # it learned something from the learnable data (epoch means: one lucky first batch cannot decide it)
    assert epoch_losses[-1] < epoch_losses[0]


def test_a_frozen_weight_stays_as_loaded(backend: ModuleType, two_runs: list[dict[str, np.ndarray]]) -> None:
    """text_transformer's key bias (rosetta_common.weights.FROZEN): no step moves it, not even by rounding."""
    skip_unless_tested("text_transformer")
    start = asymmetric_weights(small_config("text_transformer"), 11)
    for name in FROZEN:
        np.testing.assert_array_equal(two_runs[0][f"text_transformer/weights/{name}"], start[name], err_msg=name)


def test_train_worker_output_matches_weights_layout(two_runs: list[dict[str, np.ndarray]], arch: str) -> None:
    config = small_config(arch)
    names = {k.split("/weights/", 1)[1] for k in two_runs[0] if k.startswith(f"{arch}/weights/")}
    assert names == set(asymmetric_weights(config, 0))
