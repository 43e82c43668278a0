"""PyTorch's idiomatic loop: a DataLoader over a TensorDataset (shuffle=True), torch.optim, loss.item() per step.

As the PyTorch tutorials write it ("Optimizing Model Parameters"): for each batch the DataLoader yields,
zero_grad, forward, CrossEntropyLoss, backward, step.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.idiomatic import LoopRun
from rosetta_common.data import Dataset
from rosetta_common.spec import AdamSpec, SGDSpec

# torch.optim.Adam on CPU takes the single-tensor for-loop path by default (foreach is the default only for
# CUDA tensors), which is the path rosetta_common.optim's formula is checked against.
TRICKS = {
    "foreach": "torch.optim.Adam(foreach=True): multi-tensor kernels (default only on CUDA)",
    "fused": "torch.optim.Adam(fused=True): one fused kernel per step; different rounding from the checked formula",
}
PARITY: dict[str, str] = {}  # our loop's parity needs (the plan's batch order) cost nothing to mirror here


def make_optimizer(model: nn.Module, optimizer: AdamSpec | SGDSpec, variant: str | None) -> torch.optim.Optimizer:
    extra = {variant: True} if variant in TRICKS else {}
    if isinstance(optimizer, AdamSpec):
        return torch.optim.Adam(model.parameters(), lr=optimizer.learning_rate,
                                betas=(optimizer.beta1, optimizer.beta2), eps=optimizer.epsilon, **extra)
    return torch.optim.SGD(model.parameters(), lr=optimizer.learning_rate, momentum=optimizer.momentum, **extra)


def train(model: nn.Module, data: Dataset, batch_size: int, optimizer: AdamSpec | SGDSpec, epochs: int, seed: int,
          variant: str | None = None) -> LoopRun:
    if variant is not None and variant not in TRICKS:
        raise ValueError(f"variant = {variant!r}: unknown; allowed: {', '.join(TRICKS)}")
    device = next(model.parameters()).device
    dataset = TensorDataset(torch.from_numpy(data.train_images), torch.from_numpy(data.train_labels))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))
    opt = make_optimizer(model, optimizer, variant)
    loss_fn = nn.CrossEntropyLoss()
    epoch_seconds, epoch_losses = [], []
    model.train()
    for _ in range(epochs):
        start = time.perf_counter()
        losses = []
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            opt.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        epoch_seconds.append(time.perf_counter() - start)
        epoch_losses.append(float(np.mean(losses)))
    model.eval()
    return LoopRun(epoch_seconds, len(dataset), epoch_losses)
