"""The TPU bounds, from the device's own arithmetic before any comparison. The method, per model and matrix precision:
- the forward to the loss uses each op a known number of times (OPS_USED: every layer, every time step of a
  recurrent model, each LayerNorm or BatchNorm as a mean, a variance and an rsqrt; the loss as one softmax
  cross-entropy), read off rosetta_common's spec of the architecture;
- each use perturbs the loss by at most the op's relative error over its whole output (`rel_norm`, what a
  following linear layer carries on), carried to the loss with unit gain (first order);
- the uses are independent rounding errors, so they add in quadrature (the probabilistic rounding-error bound of
  Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019), and the CPU run's own error adds linearly:
      step1_loss_rel(TPU) = step1_loss_rel(CPU, float32) + sqrt(sum over uses of rel_norm(op)^2);
- the lockstep window and the checkpoint states keep the CPU bounds' ratio to the step-1 bound (params.yaml:
  ten times): lockstep_loss_rel and lockstep_state_rel scale by step1_loss_rel(TPU) / step1_loss_rel(CPU);
  the first step beyond the TPU's lockstep_loss_rel is where the runs part;
- the TPU's logits against ONNX Runtime's on the CPU, and against the TPU's own reload, add the forward's
  worst-element error to the relative term: sum over the forward's uses (the loss aside) of rel_to_max(op).
A bound is a property of float32, the device and the method: no comparison moves it (docs/tpu.md,
tooling/devices/tpu_ops.py).
"""

from __future__ import annotations

import math
from typing import Any

from rosetta_common.registry import REGISTRY, entry
from rosetta_common.spec import TolerancesSpec

SUBJECT = "jax@tpu"  # the TPU run folders' framework name: artifacts/jax@tpu/<model>/
CLAIMED = "highest"  # the precision whose bounds judge every TPU run: float32 products, what a port claims


def subject_name(precision: str) -> str:
    """The subject as the ledger and artifacts/ name it: jax@tpu at `highest`, jax@tpu-<precision> otherwise."""
    return SUBJECT if precision == CLAIMED else f"{SUBJECT}-{precision}"


# The forward's op uses per model, the loss aside: each architecture's registry entry (rosetta_common.registry).
OPS_USED: dict[str, dict[str, int]] = {name: dict(e.ops) for name, e in REGISTRY.items()}


def loss_op(model: str) -> str:
    """The loss's entry in the op-accuracy file: the softmax cross-entropy over the model's classes (digits: 10,
    the text set: 2)."""
    return "cross_entropy2" if entry(model).reads == "tokens" else "cross_entropy10"


def model_bounds(model: str, ops: dict[str, Any], tol: TolerancesSpec, precision: str) -> dict[str, Any]:
    """One model's bounds at one precision (module docstring), with the terms they came from."""
    uses = OPS_USED[entry(model).name]
    loss = loss_op(model)
    squares = {op: n * ops[op][precision]["rel_norm"] ** 2 for op, n in uses.items()}
    squares[loss] = ops[loss][precision]["rel_norm"] ** 2
    device_term = math.sqrt(sum(squares.values()))
    step1 = tol.step1_loss_rel + device_term
    scale = step1 / tol.step1_loss_rel
    forward = sum(n * ops[op][precision]["rel_to_max"] for op, n in uses.items())
    largest = max(squares, key=lambda op: squares[op])
    return {
        "uses": {**uses, loss: 1},
        "device_term": device_term,
        "largest_term": {"op": largest, "share": squares[largest] / device_term ** 2 if device_term else 0.0},
        "forward_rel_to_max": forward,
        "step1_loss_rel": step1,
        "lockstep_loss_rel": tol.lockstep_loss_rel * scale,
        "lockstep_state_rel": tol.lockstep_state_rel * scale,
        "onnx_vs_native_rel": tol.onnx_vs_native_rel + forward,
        "native_roundtrip_rel": tol.native_roundtrip_rel + forward,
    }


# The method's text is read out of the module docstring, between "The method, per model and matrix precision:" and
# "A bound", and recorded with the bounds (tooling/devices/tpu_results/bounds.json, and each result
# tooling/devices/tpu_judge.py writes): editing that text changes the recorded files, which
# tests/unit/test_tpu_check.py compares.
def derive(op_accuracy: dict[str, Any], tol: TolerancesSpec, models: list[str]) -> dict[str, Any]:
    """Every model's bounds at every precision the op file measured: {"precisions": {p: {model: bounds}}}."""
    ops = op_accuracy["ops"]
    precisions = list(op_accuracy["precisions"])
    return {"method": __doc__.split("The method, per model and matrix precision:\n", 1)[1].split("\nA bound", 1)[0],
            "op_accuracy": {"measured_at": op_accuracy["measured_at"], "device": op_accuracy["device"],
                            "jax": op_accuracy["jax"]},
            "cpu_tolerances": {k: getattr(tol, k) for k in ("step1_loss_rel", "lockstep_loss_rel",
                                                            "lockstep_state_rel", "onnx_vs_native_abs",
                                                            "onnx_vs_native_rel", "native_roundtrip_abs",
                                                            "native_roundtrip_rel")},
            "precisions": {p: {m: model_bounds(m, ops, tol, p) for m in models} for p in precisions}}


# Every other tolerance (end of training, quality, running statistics) stays params.yaml's, judged by the measured
# null after the runs part, as for every pair.
def tolerances_for(tol: TolerancesSpec, bounds: dict[str, Any]) -> TolerancesSpec:
    """params.yaml's tolerances with one model's TPU bounds in place (the rest unchanged)."""
    keys = ("step1_loss_rel", "lockstep_loss_rel", "lockstep_state_rel", "onnx_vs_native_rel",
            "native_roundtrip_rel")
    return tol.model_copy(update={k: bounds[k] for k in keys})
