"""torch's own training details: the determinism switches, train() stepping torch.optim on autograd's
gradients of the mean cross-entropy, mapped back through the state-dict layout (CNN head included), the
ResNet's steps in training mode with each step's shared dropout mask and the spec's running statistics, and
the LSTM's frozen second bias."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rosetta_torch
from rosetta_common.data import iterate_batches
from rosetta_common.metrics import softmax_cross_entropy
from rosetta_common.reference import forward_train
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import dropout_masks, plan
from rosetta_common.weights import Weights, is_statistic
from rosetta_torch.models import create

STEPS = 3
TRAIN_VS_STEPPED_REL = 1e-6  # same float32 ops in the same order; a margin for torch's fused kernels


def test_configure_switches_on_determinism() -> None:
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.benchmark
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


def _canonical_gradients(model: torch.nn.Module) -> Weights:
    """autograd's gradients in canonical names and layout: a twin module holding them as its weights."""
    twin = create(rosetta_torch.model_config(model))
    twin.load_state_dict({name: p.grad for name, p in model.named_parameters()}, strict=True)
    return rosetta_torch.to_canonical(twin)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_train_steps_the_optimizer_on_autograd_gradients(optimizer: str) -> None:
    """train() for 3 one-batch epochs vs apply_optimizer fed, step by step, with torch's gradients of the
    same batches at the same parameters: a wrong gradient mapping, loss reduction or batch fails it."""
    config = small_config("cnn", (6, 10))
    spec = small_spec(optimizer=optimizer, epochs=STEPS, batch_size=32)
    data = learnable_data(n_train=32, image_shape=(6, 10))  # one batch per epoch
    train_plan = plan(spec, "cnn", len(data.train_labels))
    start = asymmetric_weights(config, 12)
    model = rosetta_torch.build(config, start)
    result = rosetta_torch.train(model, train_plan, data)
    assert not model.training and len(result.epoch_seconds) == STEPS

    params, grads = start, []
    for epoch in range(STEPS):
        (images, labels), = iterate_batches(data, train_plan.batch_size, train_plan.seed, epoch)
        at = rosetta_torch.build(config, params)
        device = next(at.parameters()).device
        loss = F.cross_entropy(at(torch.from_numpy(images).to(device)), torch.from_numpy(labels).to(device))
        loss.backward()
        assert result.step_losses[epoch] == pytest.approx(loss.item(), rel=TRAIN_VS_STEPPED_REL)
        grads.append(_canonical_gradients(at))
        # the real optimizer replayed from the start: its state (moments) must see every earlier gradient
        params = rosetta_torch.apply_optimizer(train_plan.optimizer, start, grads)[-1]
    trained = rosetta_torch.to_canonical(model)
    for name, value in params.items():
        np.testing.assert_allclose(trained[name], value, rtol=TRAIN_VS_STEPPED_REL,
                                   atol=TRAIN_VS_STEPPED_REL * float(np.abs(value).max()), err_msg=name)


def test_a_plan_for_other_data_is_refused() -> None:
    config = small_config("mlp")
    data = learnable_data(n_train=32)
    with pytest.raises(ValueError, match="64 training samples"):
        rosetta_torch.train(rosetta_torch.build(config, asymmetric_weights(config, 0)),
                            plan(small_spec(), "mlp", 64), data)


STATISTICS_RTOL = 1e-5  # float32 running statistics vs the float64 reference (as the conformance suite)


def test_resnet_steps_use_each_steps_mask_and_the_spec_statistics() -> None:
    """A two-step ResNet run: each step's loss is the reference's training-mode loss on that step's batch with
    that step's shared mask (masks[0], then masks[1]), from the weights and running statistics the step
    before left; the running statistics after a step are the reference's (momentum converted, biased
    variance). SGD, so that the one-step run's weights are exactly the two-step run's after step 1."""
    config = small_config("resnet", (6, 10))
    data = learnable_data(n_train=32, image_shape=(6, 10))
    start = asymmetric_weights(config, 13)
    runs = {}
    for epochs in (1, 2):
        train_plan = plan(small_spec(optimizer="sgd", epochs=epochs, batch_size=32), "resnet", 32)
        model = rosetta_torch.build(config, start)
        runs[epochs] = (rosetta_torch.train(model, train_plan, data), rosetta_torch.to_canonical(model), train_plan)
    (_, after_one, _), (result, _, two_step_plan) = runs[1], runs[2]
    masks = dropout_masks(two_step_plan, config)
    for step, weights in enumerate((start, after_one)):
        (images, labels), = iterate_batches(data, 32, two_step_plan.seed, step)
        logits, statistics = forward_train(config, weights, images, masks[step])
        assert result.step_losses[step] == pytest.approx(softmax_cross_entropy(logits, labels), rel=1e-5), step
        if step == 0:
            for name, value in statistics.items():
                np.testing.assert_allclose(after_one[name], value, rtol=STATISTICS_RTOL, atol=1e-7, err_msg=name)
    assert {name for name in start if is_statistic(name)} == set(statistics)


def test_lstm_trains_one_bias() -> None:
    """bias_hh_l0 is frozen at zero and outside the optimizer: the canonical bias (bias_ih) moves alone, as the
    one bias of Keras and Flax does."""
    config = small_config("lstm")
    data = learnable_data(n_train=32)
    start = asymmetric_weights(config, 14)
    model = rosetta_torch.build(config, start)
    optimizer = rosetta_torch.make_optimizer(model, plan(small_spec(), "lstm", 32).optimizer, 1)
    assert all(p is not model.lstm.bias_hh_l0 for group in optimizer.param_groups for p in group["params"])
    rosetta_torch.train(model, plan(small_spec(epochs=1, batch_size=32), "lstm", 32), data)
    assert not model.lstm.bias_hh_l0.detach().any()
    assert not np.array_equal(rosetta_torch.to_canonical(model)["lstm.bias"], start["lstm.bias"])
