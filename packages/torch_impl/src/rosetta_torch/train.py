"""Determinism switches and the training loop: a plain PyTorch loop with torch.optim, on common's batches."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from rosetta_common.data import Dataset, epoch_batches
from rosetta_common.interface import TrainResult
from rosetta_common.seeding import seed_everything
from rosetta_common.spec import AdamSpec, Spec
from rosetta_torch.models import model_device


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


def make_optimizer(params, spec: Spec) -> torch.optim.Optimizer:
    """torch.optim's Adam / SGD with momentum: these compute rosetta_common.optim's formulas.
    `spec` is one model's (Spec.for_model), its learning rate one number."""
    opt = spec.optimizer
    if isinstance(opt, AdamSpec):
        return torch.optim.Adam(params, lr=opt.learning_rate, betas=(opt.beta1, opt.beta2), eps=opt.epsilon)
    return torch.optim.SGD(params, lr=opt.learning_rate, momentum=opt.momentum)


def train(model: nn.Module, arch: str, spec: Spec, data: Dataset) -> tuple[nn.Module, TrainResult]:
    """Train `model` in place with the spec's optimizer on epoch_batches; returns it (in eval mode) and the losses."""
    spec = spec.for_model(arch)  # a learning rate may be given per model
    device = model_device(model)
    images = torch.from_numpy(np.ascontiguousarray(data.train_images, np.float32)).to(device)
    labels = torch.from_numpy(np.ascontiguousarray(data.train_labels, np.int64)).to(device)
    batch_size, epochs = spec.train.batch_size, spec.train.epochs
    steps = len(labels) // batch_size
    optimizer = make_optimizer(model.parameters(), spec)  # the first one imports torch._dynamo (~3 s), untimed

    step_losses: list[float] = []
    epoch_losses: list[float] = []
    model.train()
    start = time.perf_counter()
    with tqdm(total=epochs * steps, desc=f"torch {arch}", unit="step", mininterval=1.0) as bar:
        for epoch in range(epochs):
            losses = []  # kept on the device: no host sync per step
            for idx in epoch_batches(len(labels), batch_size, spec.seed, epoch):
                idx_t = torch.from_numpy(idx).to(device)
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(images[idx_t]), labels[idx_t])
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
                bar.update()
            values = torch.stack(losses).tolist()
            step_losses += values
            epoch_losses.append(float(np.mean(values)))
            bar.set_postfix(epoch=epoch + 1, loss=f"{epoch_losses[-1]:.4f}")
    seconds = time.perf_counter() - start
    model.eval()
    extra = {"device": str(device), "torch_version": torch.__version__, "threads": torch.get_num_threads()}
    return model, TrainResult(step_losses, epoch_losses, seconds, extra)
