"""Each framework's idiomatic training loop, the yardstick benchmarks/train_throughput.py holds our train() to.

Parity makes our train() do what a framework's users would not (the same batches, every step's loss, torch's Adam
to the last bit), so its speed is judged against the loop such a user writes: on the very model our build()
returns, in the framework's own train mode, with its own dropout and BatchNorm. One module per framework (`torch`,
`tf`, `jax`), each with `train(model, data, batch_size, optimizer, epochs, seed, variant=None) -> LoopRun` and its
named variants: `TRICKS` (speed-ups our train() does not use), `PARITY` (one thing parity requires, added alone)
and `ONLY_FOR` (the models a variant is for); `PEERS` names a framework's further styles (JAX: jax_linen.py). What
each name holds and how the benchmark runs them: benchmarks/README.md, "train_throughput.py". Each module is imported
only inside its framework's environment (through the runner): nothing here imports a framework at package level.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoopRun:
    epoch_seconds: list[float]  # wall time of each epoch, the first one holding tracing/compilation
    samples_per_epoch: int  # samples actually trained on per epoch (a loop that keeps the last partial batch counts it)
    epoch_losses: list[float] = field(default_factory=list)  # mean training loss per epoch: a sanity figure
