"""torch's own training details: the determinism switches, and train() stepping torch.optim on autograd's
gradients of the mean cross-entropy, mapped back through the state-dict layout (CNN head included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rosetta_torch
from rosetta_common.data import iterate_batches
from rosetta_common.testing import asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import plan
from rosetta_common.weights import Weights
from rosetta_torch.models import make_module

STEPS = 3
TRAIN_VS_STEPPED_REL = 1e-6  # same float32 ops in the same order; a margin for torch's fused kernels


def test_configure_switches_on_determinism() -> None:
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.benchmark
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


def _canonical_gradients(model: torch.nn.Module) -> Weights:
    """autograd's gradients in canonical names and layout: a twin module holding them as its weights."""
    twin = make_module(rosetta_torch.model_config(model))
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
