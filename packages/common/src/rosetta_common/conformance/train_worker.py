"""Train every architecture once on the conformance suite's tiny problem and save losses and weights.

    python -m rosetta_common.conformance.train_worker <framework> <out.npz> hook|truncated

What each of test_training.py's two fresh processes does after its exports (process_worker.py): the two must
agree bit for bit. With `hook`, the run carries a StepHook at HOOK_STEPS that records the model's state there;
with `truncated`, the same training is also run stopped after each first-epoch step of HOOK_STEPS
(plan.truncated): the state the hook must have seen.
The `truncated` process trains one model every time, its weights put back by from_canonical before the next: a
model trained again must train exactly as a fresh build (the pipeline's replicates reuse theirs), so its last,
full run must equal the `hook` process's, which trains a fresh build.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from rosetta_common.data import Dataset
from rosetta_common.interface import load_backend
from rosetta_common.testing import ARCHS, asymmetric_weights, learnable_data, small_config, small_spec
from rosetta_common.training import StepHook, plan

# Two steps inside the first epoch and the last of the run (small_spec: 2 epochs of 8 steps). Not step 1: when a
# truncated plan sized JAX's Adam table (rosetta_jax.train.torch_adam) by its own steps, a one-step plan's table had
# one entry, which XLA folded into the step as a constant, and the run stopped there was one ulp off the longer run
# in a few weights (measured: 19 of 2,048 of the mlp's kernel). A truncated plan now takes its whole run's table
# (TrainPlan.schedule_steps), and with it the whole run's compiled step: one JAX compile per architecture here, not
# one per stop.
HOOK_STEPS = (2, 5, 16)


def state(backend: Any, model: Any, prefix: str, inputs: np.ndarray) -> dict[str, np.ndarray]:
    return {f"{prefix}logits": backend.predict(model, inputs),
            **{f"{prefix}weights/{name}": value for name, value in backend.to_canonical(model).items()}}


def main(framework: str, out: str, mode: str) -> None:
    backend = load_backend(framework)
    backend.configure(0)
    spec = small_spec()
    arrays: dict[str, np.ndarray] = {}
    for arch in ARCHS:
        config = small_config(arch)
        data = learnable_data(tokens=config.input.kind == "tokens")
        train_plan = plan(spec, arch, len(data.train_labels))
        assert train_plan.num_steps == HOOK_STEPS[-1], train_plan
        model = backend.build(config, asymmetric_weights(config, 11))
        if mode == "truncated":  # one model, trained again and again, its weights put back each time
            for step in HOOK_STEPS[:-1]:
                backend.train(model, train_plan.truncated(step), data)
                arrays |= state(backend, model, f"{arch}/truncated/{step}/", data.test_inputs)
                backend.from_canonical(model, asymmetric_weights(config, 11))

        def seen(step: int, model: Any, arch: str = arch, data: Dataset = data,
                 out: dict[str, np.ndarray] = arrays) -> None:
            out.update(state(backend, model, f"{arch}/hook/{step}/", data.test_inputs))

        hook = StepHook(HOOK_STEPS, seen) if mode == "hook" else None
        result = backend.train(model, train_plan, data, hook)
        arrays[f"{arch}/step_losses"] = np.asarray(result.step_losses, np.float64)
        arrays[f"{arch}/epoch_losses"] = np.asarray(result.epoch_losses, np.float64)
        arrays[f"{arch}/epoch_seconds"] = np.asarray(result.epoch_seconds, np.float64)
        arrays[f"{arch}/num_steps"] = np.asarray(train_plan.num_steps)
        arrays[f"{arch}/logits"] = backend.predict(model, data.test_inputs)
        for name, value in backend.to_canonical(model).items():
            arrays[f"{arch}/weights/{name}"] = value
    with open(out, "wb") as f:
        np.savez(f, **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:4])
