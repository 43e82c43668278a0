"""Forward parity of the untrained models: every framework's init.onnx (all built from the same canonical init)
against the float64 numpy reference forward, and every pair of them on random inputs at several batch sizes.
And of the trained ones within each framework: its trained canonical file, run by the reference, against the
logits its own native model gave."""

from __future__ import annotations

import itertools

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.exports import onnx_tolerance
from pipelines.checks.ledger import Ledger
from pipelines.checks.sessions import run_onnx
from rosetta_common.inputs import random_tokens
from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward
from rosetta_common.seeding import derive_seed
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.weights import Weights, load_weights


def forward_parity(spec: Spec, ledger: Ledger, arch: str, runs: dict[str, dict], batch: np.ndarray,
                   config: ModelConfig) -> None:
    """Every init.onnx against the float64 reference forward, and every pair of them on random inputs at several
    batch sizes (a token model: random ids of random lengths, padded, at each of PARITY_LENGTHS' lengths too)."""
    tol = spec.tolerances.forward_parity_abs
    init = load_weights(paths.init_weights(arch), config)
    reference = forward(config, init, batch)
    inits = {fw: s["sessions"]["init"] for fw, s in runs.items() if "init" in s["sessions"]}
    for fw, session in inits.items():
        ledger.add(arch, fw, names.INIT_ONNX_VS_REFERENCE, max_abs_diff(run_onnx(session, batch), reference), tol)
    rng = np.random.default_rng(derive_seed(spec.seed, "parity", arch))
    if config.input.kind == "tokens":
        lengths = parity_lengths(config.input.max_length)
        inputs = [random_tokens(rng, n, length, int(config.input.vocab_size))
                  for n in spec.export.parity_batch_sizes for length in lengths]
        shown = f"batch sizes {[len(batch), *spec.export.parity_batch_sizes]} at lengths {lengths}"
    else:
        inputs = [rng.random((n, *batch.shape[1:]), dtype=np.float32) for n in spec.export.parity_batch_sizes]
        shown = f"batch sizes {[len(x) for x in [batch, *inputs]]}"
    for a, b in itertools.combinations(inits, 2):
        worst = max(max_abs_diff(run_onnx(inits[a], x), run_onnx(inits[b], x)) for x in [batch, *inputs])
        ledger.add(arch, f"{a}|{b}", names.FORWARD_PARITY_INIT_ONNX, worst, tol, detail=shown)


def parity_lengths(max_length: int) -> list[int]:
    """The sequence lengths a token model's init.onnx files are compared at: one token, a quarter, half and the
    whole maximum (each batch's rows padded to it from random lengths, so a dynamic length axis is exercised)."""
    return sorted({1, max(1, max_length // 4), max(1, max_length // 2), max_length})


def trained_weights_vs_native(spec: Spec, ledger: Ledger, arch: str, trained: dict[str, Weights],
                              batch: np.ndarray, config: ModelConfig) -> None:
    """Each framework's trained canonical file, run by the float64 reference, against the logits its own trained
    native model gave on the validation batch (native_outputs.npz): the file that the training checks, the taps
    and a user migrating the model read is the model the framework trained. A weights.py mapping that is wrong
    only on the way out changes nothing else: a GRU's input and recurrent biases exchanged load as zeros at
    init, and the framework trains its own layout correctly. The bound is ONNX Runtime's against native (abs +
    rel * max|logit|): the same claim, one trained model computed twice, once in float32."""
    for fw, weights in trained.items():
        with np.load(paths.native_outputs(arch, fw), allow_pickle=False) as f:
            native = f["validation_logits"]
        ledger.add(arch, fw, names.TRAINED_WEIGHTS_VS_NATIVE, max_abs_diff(forward(config, weights, batch), native),
                   onnx_tolerance(spec.tolerances, native), detail=f"max |logit| {np.abs(native).max():.3g}")
