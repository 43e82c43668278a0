"""Determinism switches and the training loop: a plain PyTorch loop with torch.optim, on the plan's batches.

BatchNorm trains in torch's train() mode on each batch; its running statistics follow the spec's convention
with no step here: models.BatchNorm2d takes the spec's momentum converted and corrects torch's unbiased
running-variance update after every training-mode forward. Dropout uses the step's shared mask
(rosetta_common.training.dropout_masks), never torch's own generator (models.ResNet.forward says why). The
token model trains on int64 ids, checked once (config.input.check) before the first step."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from rosetta_common.data import Dataset
from rosetta_common.interface import TrainResult
from rosetta_common.seeding import seed_everything
from rosetta_common.spec import AdamSpec, SGDSpec
from rosetta_common.training import OptimizerSpec, StepHook, TrainPlan, dropout_masks
from rosetta_common.weights import Weights
from rosetta_torch.models import forward_logits, model_device


def configure(seed: int) -> None:
    """Seed every random source and make every kernel deterministic; call once, before anything else.

    Denormals are not flushed (torch.set_flush_denormal): on digits with params.yaml's settings, 10 and 20
    epochs gave bitwise the same losses and weights with and without it, no denormal appeared in the
    weights or Adam's state, and epoch times did not differ; flushing would only add a way to depart from
    rosetta_common.optim's numpy formulas.
    """
    seed_everything(seed)
    torch.manual_seed(seed)  # seeds CUDA too
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # Full fp32 on GPUs (TF32 would differ from the other frameworks by ~1e-3): matmuls and cuDNN convs.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def make_optimizer(model: nn.Module, optimizer: OptimizerSpec, num_steps: int) -> torch.optim.Optimizer:
    """torch.optim's Adam / SGD with momentum over the model's trainable parameters: these compute
    rosetta_common.optim's formulas as they are. Frozen parameters (the LSTM's bias_hh, held at zero) are
    left out. The learning rate is constant, so torch needs no `num_steps` (the signature is the contract's,
    shared by all three packages).

    Adam is torch's fused kernel (`fused=True`, CPU and CUDA). On the CPU, the default single-tensor Adam takes
    its square root through MKL's vector math, which is not correctly rounded and, for a tensor large enough to
    be split over the two threads, now and then rounded one thread's half differently: 5 of 123 fresh processes
    gave a different mlp after the first step (its 256x64 kernel, one half of it by up to 9e-7), and with it
    different files. With the fused kernel, 63 of 63 fresh processes gave the same bytes."""
    del num_steps
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(optimizer, AdamSpec):
        return torch.optim.Adam(params, lr=optimizer.learning_rate,
                                betas=(optimizer.beta1, optimizer.beta2), eps=optimizer.epsilon, fused=True)
    if isinstance(optimizer, SGDSpec):
        return torch.optim.SGD(params, lr=optimizer.learning_rate, momentum=optimizer.momentum)
    raise TypeError(f"unknown optimizer spec {optimizer!r}")


def apply_optimizer(optimizer: OptimizerSpec, params: Weights, grads: Sequence[Weights]) -> list[Weights]:
    """make_optimizer's torch.optim object stepped on these gradients; the parameters after each step."""
    # A ParameterList is the smallest nn.Module holding arbitrary tensors (canonical names contain dots,
    # which a ParameterDict refuses); its order is params' order.
    names = list(params)
    holder = nn.ParameterList([nn.Parameter(torch.from_numpy(np.array(params[k], np.float32))) for k in names])
    torch_optimizer = make_optimizer(holder, optimizer, len(grads))
    trajectory: list[Weights] = []
    for grad in grads:
        for name, param in zip(names, holder, strict=True):
            param.grad = torch.from_numpy(np.array(grad[name], np.float32))
        torch_optimizer.step()
        trajectory.append({name: param.detach().numpy().copy() for name, param in zip(names, holder, strict=True)})
    return trajectory


def train(model: nn.Module, plan: TrainPlan, data: Dataset, hook: StepHook | None = None) -> TrainResult:
    """Train `model` in place with the plan's optimizer on the plan's batches, in train() mode (BatchNorm on
    batch statistics, running statistics by the spec's convention), multiplying by step s's shared dropout mask
    for a model with dropout; it ends in eval mode. `hook` sees the model in eval mode after its steps."""
    return train_module(model, model, plan, data, desc=f"torch {plan.arch}", hook=hook)


def _same(losses: torch.Tensor) -> torch.Tensor:
    return losses


def train_module(model: nn.Module, module: nn.Module, plan: TrainPlan, data: Dataset, *, desc: str,
                 rows: slice | np.ndarray = slice(None),
                 epoch_losses_of: Callable[[torch.Tensor], torch.Tensor] = _same, show: bool = True, workers: int = 1,
                 engine: str = "", hook: StepHook | None = None) -> TrainResult:
    """The one training loop, for train() and distributed.train_data_parallel alike: `module` (the model, or its
    DDP wrapper) on its `rows` of each of the plan's batches and of each step's dropout mask, the optimizer over
    `model`'s own parameters. `epoch_losses_of` turns an epoch's stacked losses into the global batch's (for
    data-parallel training, an all-reduce); `show` the progress bar (rank 0 only). `model` ends in eval mode."""
    if plan.num_samples != len(data.train_labels):  # the plan's batches index this data set
        raise ValueError(f"plan for {plan.num_samples} training samples, data has {len(data.train_labels)}")
    device = model_device(model)
    spec = model.config.input  # images float32; token ids int64, checked (one InputError line) as predict does
    inputs = data.train_inputs if spec.kind == "images" else spec.check(data.train_inputs, "train_inputs")
    inputs = torch.from_numpy(np.ascontiguousarray(inputs, spec.dtype)).to(device)
    labels = torch.from_numpy(np.ascontiguousarray(data.train_labels, np.int64)).to(device)
    masks = dropout_masks(plan, model.config)  # (num_steps, batch, features), or None: no dropout
    masks_t = None if masks is None else torch.from_numpy(np.ascontiguousarray(masks[:, rows])).to(device)
    # The first optimizer imports torch._dynamo (~3 s): made before the clock starts.
    optimizer = make_optimizer(model, plan.optimizer, plan.num_steps)

    step_losses: list[float] = []
    epoch_losses: list[float] = []
    epoch_seconds: list[float] = []
    module.train()
    start = time.perf_counter()
    with tqdm(total=plan.num_steps, desc=desc, unit="step", mininterval=1.0, disable=not show) as bar:
        for epoch in range(plan.epochs):
            epoch_start = time.perf_counter()
            losses = []  # kept on the device: no host sync per step
            for i, idx in enumerate(plan.batches(epoch)):
                idx_t = torch.from_numpy(idx[rows]).to(device)
                mask = None if masks_t is None else masks_t[epoch * plan.steps_per_epoch + i]
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(forward_logits(module, inputs[idx_t], mask), labels[idx_t])
                loss.backward()  # under DDP, the gradients are all-reduced (sum / world) as they are ready
                optimizer.step()
                losses.append(loss.detach())
                bar.update()
                if hook is not None and (step := epoch * plan.steps_per_epoch + i + 1) in hook.steps:
                    module.eval()  # the hook reads the model as predict does; training goes on in train mode
                    hook(step, model)
                    module.train()
            values = epoch_losses_of(torch.stack(losses)).tolist()  # the epoch's one sync, inside its timing
            epoch_seconds.append(time.perf_counter() - epoch_start)
            step_losses += values
            epoch_losses.append(float(np.mean(values)))
            bar.set_postfix(epoch=epoch + 1, loss=f"{epoch_losses[-1]:.4f}")
    seconds = time.perf_counter() - start
    model.eval()
    return TrainResult(step_losses, epoch_losses, seconds, epoch_seconds, workers=workers, engine=engine)
