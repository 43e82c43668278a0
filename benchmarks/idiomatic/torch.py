"""PyTorch's idiomatic loop: a DataLoader over a TensorDataset (shuffle=True), torch.optim, loss.item() per step.

As the PyTorch tutorials write it ("Optimizing Model Parameters"): model.train(), then for each batch the
DataLoader yields, zero_grad, forward, CrossEntropyLoss, backward, step; model.eval() at the end. The model is
the very module our build() returns, trained as a torch user would train that class:
- dropout (resnet): its own nn.Dropout, active in train() mode, drawing from torch's generator (no mask given);
- BatchNorm (resnet): torch's own nn.BatchNorm2d forward (momentum as build() converted it), i.e. without
  rosetta_torch's running-variance correction (see PARITY): the layers are switched to torch's class for the
  loop and back after it (the same state: the subclass adds only a forward);
- LSTM: every parameter trains, bias_hh_l0 included (a torch user's nn.LSTM trains both biases; build()
  freezes it, see PARITY), unfrozen for the loop and frozen again after it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.idiomatic import LoopRun
from rosetta_common.data import Dataset
from rosetta_common.spec import AdamSpec, SGDSpec
from rosetta_common.training import TrainPlan, dropout_masks
from rosetta_torch.models import BatchNorm2d as SpecBatchNorm2d

# torch.optim.Adam on CPU takes the single-tensor for-loop path by default (foreach is the default only for
# CUDA tensors): the loop a user writes. rosetta_torch trains with fused=True (see its make_optimizer: the
# single-tensor path's square root was not reproducible from one process to the next).
TRICKS = {
    "foreach": "torch.optim.Adam(foreach=True): multi-tensor kernels (default only on CUDA)",
    "fused": "torch.optim.Adam(fused=True): one fused kernel per step (what rosetta_torch uses)",
}
# What parity makes our train() do that the loop above does not (the plan's batch order costs nothing to mirror:
# indexing a preloaded tensor is no slower than a DataLoader).
PARITY = {
    "shared_masks": "resnet: the step's dropout mask drawn in common (rosetta_common.training.dropout_masks, "
                    "preloaded, indexed per step and multiplied into the pooled features) instead of nn.Dropout "
                    "drawing from torch's generator",
    "running_var_correction": "resnet: rosetta_torch's BatchNorm2d instead of torch's: after every training "
                              "forward, torch's running-variance update (the unbiased batch variance) turned into "
                              "the spec's (the biased one): a clone and three elementwise ops per BatchNorm layer",
    "frozen_bias_hh": "lstm: bias_hh_l0 held at zero and frozen (the canonical LSTM has one bias, torch's two): "
                      "one gradient and one Adam update fewer per step, so less work, not more",
}
ONLY_FOR = {"shared_masks": ("resnet",), "running_var_correction": ("resnet",), "frozen_bias_hh": ("lstm",)}


def make_optimizer(model: nn.Module, optimizer: AdamSpec | SGDSpec, variant: str | None) -> torch.optim.Optimizer:
    extra = {variant: True} if variant in TRICKS else {}
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(optimizer, AdamSpec):
        return torch.optim.Adam(params, lr=optimizer.learning_rate,
                                betas=(optimizer.beta1, optimizer.beta2), eps=optimizer.epsilon, **extra)
    return torch.optim.SGD(params, lr=optimizer.learning_rate, momentum=optimizer.momentum, **extra)


@contextmanager
def as_torch_has_it(model: nn.Module, variant: str | None) -> Iterator[None]:
    """For the loop's duration: torch's own BatchNorm2d forward and every parameter trainable, unless `variant`
    is the parity requirement that keeps rosetta_torch's (running_var_correction, frozen_bias_hh)."""
    switched = [] if variant == "running_var_correction" else [
        m for m in model.modules() if isinstance(m, SpecBatchNorm2d)]
    frozen = [] if variant == "frozen_bias_hh" else [p for p in model.parameters() if not p.requires_grad]
    for module in switched:
        module.__class__ = nn.BatchNorm2d
    for param in frozen:
        param.requires_grad_(True)
    try:
        yield
    finally:
        for module in switched:
            module.__class__ = SpecBatchNorm2d
        for param in frozen:
            param.requires_grad_(False)


def train(model: nn.Module, data: Dataset, batch_size: int, optimizer: AdamSpec | SGDSpec, epochs: int, seed: int,
          variant: str | None = None) -> LoopRun:
    if variant is not None and variant not in {**TRICKS, **PARITY}:
        raise ValueError(f"variant = {variant!r}: unknown; allowed: {', '.join({**TRICKS, **PARITY})}")
    device = next(model.parameters()).device
    dataset = TensorDataset(torch.from_numpy(data.train_inputs), torch.from_numpy(data.train_labels))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))
    masks = None
    if variant == "shared_masks":  # as our train() does: every step's mask drawn up front, on the device
        steps = math.ceil(len(dataset) / batch_size)  # the DataLoader keeps the last partial batch
        mask_plan = TrainPlan(model.config.arch, optimizer, epochs, batch_size, seed, steps * batch_size)
        masks = torch.from_numpy(dropout_masks(mask_plan, model.config)).to(device)
    loss_fn = nn.CrossEntropyLoss()
    epoch_seconds, epoch_losses = [], []
    with as_torch_has_it(model, variant):
        opt = make_optimizer(model, optimizer, variant)
        model.train()
        step = 0
        for _ in range(epochs):
            start = time.perf_counter()
            losses = []
            for images, labels in loader:
                images, labels = images.to(device), labels.to(device)
                opt.zero_grad()
                mask = None if masks is None else masks[step, : len(images)]
                loss = loss_fn(model(images) if mask is None else model(images, dropout_mask=mask), labels)
                loss.backward()
                opt.step()
                losses.append(loss.item())
                step += 1
            epoch_seconds.append(time.perf_counter() - start)
            epoch_losses.append(float(np.mean(losses)))
        model.eval()
    return LoopRun(epoch_seconds, len(dataset), epoch_losses)
