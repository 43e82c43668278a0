"""Each framework's idiomatic training loop, the yardstick benchmarks/train_throughput.py holds our train() to.

One module per framework (`torch`, `tf`, `jax`), each with the same four names:

- `train(model, data, batch_size, optimizer, epochs, seed, variant=None) -> LoopRun`: train `model` (the very
  model our `build()` returns) in place the way that framework's own tutorials do, timing each epoch: the
  framework's own train mode, its own dropout drawing from its own generator, its own BatchNorm;
- `TRICKS`: {name: what it does}: speed-ups our train() does not use, most because they change the numbers
  the frameworks must agree on or hide per-step losses (each says which); `variant=name` adds one to the loop;
- `PARITY`: {name: what it does}: the idiomatic loop made to do one thing parity requires of our train()
  (e.g. torch's Adam formula, the shared dropout masks); `variant=name` measures what that one requirement costs;
- `ONLY_FOR`: {variant name: models}: the variants that apply to some models only (the shared dropout masks to the
  resnet, ...); a variant not named applies to all;
- optionally `PEERS`: {loop name: module}: more idiomatic styles of that framework (JAX: `idiomatic_linen`,
  benchmarks/idiomatic/jax_linen.py, flax.linen + TrainState beside the NNX loop), each module with the four names
  above and `MODELS` (the architectures it has). Each runs as one more loop (its TRICKS and PARITY as
  `<loop name>:<name>`), and our train() is held to the fastest idiomatic loop of each case.

Imported only inside that framework's environment (through the runner): nothing here imports a framework at
package level.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoopRun:
    epoch_seconds: list[float]  # wall time of each epoch, the first one holding tracing/compilation
    samples_per_epoch: int  # samples actually trained on per epoch (a loop that keeps the last partial batch counts it)
    epoch_losses: list[float] = field(default_factory=list)  # mean training loss per epoch: a sanity figure
