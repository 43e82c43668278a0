"""The accuracy of every float32 op the models use, on the device JAX runs on, against float64: the input of the
TPU bounds (tooling/devices/tpu_bounds.py derives the step-1 loss and lockstep bounds from it).

    python -m tooling.devices.tpu_ops --json OUT.json [--size N] [--repeats R]

Each op runs jitted on the default device in float32, at each matrix precision of PRECISIONS (JAX's
`jax_default_matmul_precision`: `highest`, float32 products; None, the device's default, on a TPU bfloat16 passes),
on float32 inputs drawn from a seeded standard normal (shaped as the models use the op); its reference is the same
op in float64 (numpy, scipy) on the same float32 inputs, so only the op's own error is measured. Per op and
precision, the worst over `repeats` draws of:
- rel_norm: ||y - ref|| / ||ref|| over the whole output (what a following linear layer carries on);
- rel_max: max |y - ref| / max(|ref|, 1e-3) per element (the 1e-3 floor keeps values near zero from dominating);
- rel_to_max: max |y - ref| / max |ref| (a product's or a reduction's error against its largest entry);
- ulp_max: max |y - ref| in float32 ulps of ref.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PRECISIONS: dict[str, str | None] = {"highest": "highest", "default": None}
FLOOR = 1e-3


@dataclass(frozen=True)
class Op:
    """One op: its float32 JAX function, its float64 reference, and its inputs from a generator."""

    name: str
    what: str
    inputs: Callable[[np.random.Generator, int], tuple[np.ndarray, ...]]
    jax_fn: Callable[..., Any]
    reference: Callable[..., np.ndarray]


def _normal(*shape: int) -> Callable[[np.random.Generator, int], tuple[np.ndarray, ...]]:
    return lambda rng, _size: (rng.standard_normal(shape).astype(np.float32),)


def _elementwise(rng: np.random.Generator, size: int) -> tuple[np.ndarray, ...]:
    return (rng.standard_normal(size).astype(np.float32),)


def _ops() -> list[Op]:
    import jax
    import jax.numpy as jnp
    from scipy import special

    def logsumexp64(x: np.ndarray) -> np.ndarray:
        top = x.max(axis=-1, keepdims=True)
        return (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))[..., 0]

    def softmax64(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def cross_entropy(classes: int) -> Op:
        def inputs(rng: np.random.Generator, size: int) -> tuple[np.ndarray, ...]:
            rows = max(size // classes, 1)
            return ((3 * rng.standard_normal((rows, classes))).astype(np.float32),
                    rng.integers(0, classes, rows).astype(np.int32))

        def jax_ce(z: jax.Array, y: jax.Array) -> jax.Array:
            return jax.nn.logsumexp(z, axis=-1) - jnp.take_along_axis(z, y[:, None], axis=-1)[:, 0]

        return Op(f"cross_entropy{classes}", f"softmax cross-entropy per sample over {classes} classes (the loss)",
                  inputs, jax_ce, lambda z, y: logsumexp64(z) - np.take_along_axis(z, y[:, None], axis=-1)[:, 0])

    def conv64(x: np.ndarray, k: np.ndarray) -> np.ndarray:
        padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        h, w = x.shape[1:3]
        out = np.zeros((x.shape[0], h, w, k.shape[-1]))
        for i in range(3):
            for j in range(3):
                out += np.einsum("bhwc,co->bhwo", padded[:, i:i + h, j:j + w, :], k[i, j])
        return out

    def conv(x: jax.Array, k: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def variance64(x: np.ndarray) -> np.ndarray:
        return ((x - x.mean(axis=-1, keepdims=True)) ** 2).mean(axis=-1)

    def variance(x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.square(x - jnp.mean(x, axis=-1, keepdims=True)), axis=-1)

    return [
        Op("matmul", "dense layer (32, 256) x (256, 256)", lambda rng, _s: (
            rng.standard_normal((32, 256)).astype(np.float32), rng.standard_normal((256, 256)).astype(np.float32)),
           jnp.matmul, np.matmul),
        Op("matmul512", "512 x 512 x 512 product", lambda rng, _s: (
            rng.standard_normal((512, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)),
           jnp.matmul, np.matmul),
        Op("conv", "3x3 SAME convolution, (32, 8, 8, 32) -> 64 channels", lambda rng, _s: (
            rng.standard_normal((32, 8, 8, 32)).astype(np.float32),
            rng.standard_normal((3, 3, 32, 64)).astype(np.float32)), conv, conv64),
        Op("einsum", "attention scores bqhd,bkhd->bhqk, (32, 16, 8, 64)", lambda rng, _s: (
            rng.standard_normal((32, 16, 8, 64)).astype(np.float32),
            rng.standard_normal((32, 16, 8, 64)).astype(np.float32)),
           lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k), lambda q, k: np.einsum("bqhd,bkhd->bhqk", q, k)),
        Op("exp", "exp", _elementwise, jnp.exp, np.exp),
        Op("log", "log of |x| + 1e-3", lambda rng, s: (np.abs(rng.standard_normal(s)).astype(np.float32) + 1e-3,),
           jnp.log, np.log),
        Op("tanh", "tanh", _elementwise, jnp.tanh, np.tanh),
        Op("sigmoid", "logistic sigmoid", _elementwise, jax.nn.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
        Op("erf", "erf", _elementwise, jax.scipy.special.erf, special.erf),
        Op("gelu", "exact (erf) GELU", _elementwise, lambda x: jax.nn.gelu(x, approximate=False),
           lambda x: 0.5 * x * (1 + special.erf(x / np.sqrt(2)))),
        Op("rsqrt", "rsqrt of x^2 + 1e-5 (a normalization's 1 / std)",
           lambda rng, s: ((rng.standard_normal(s) ** 2 + 1e-5).astype(np.float32),), jax.lax.rsqrt,
           lambda x: 1 / np.sqrt(x)),
        Op("sqrt", "sqrt of |x| (Adam's denominator)", lambda rng, s: (np.abs(rng.standard_normal(s)).astype(
            np.float32),), jnp.sqrt, np.sqrt),
        Op("divide", "x / (|y| + 0.1)", lambda rng, s: (rng.standard_normal(s).astype(np.float32),
                                                      (np.abs(rng.standard_normal(s)) + 0.1).astype(np.float32)),
           jnp.divide, np.divide),
        Op("softmax", "softmax over 48 keys", lambda rng, s: ((3 * rng.standard_normal((max(s // 48, 1), 48))
                                                               ).astype(np.float32),),
           lambda x: jax.nn.softmax(x, axis=-1), softmax64),
        cross_entropy(10),
        cross_entropy(2),
        Op("mean", "mean over 512 features", lambda rng, s: (rng.standard_normal((max(s // 512, 1), 512)).astype(
            np.float32),), lambda x: jnp.mean(x, axis=-1), lambda x: x.mean(axis=-1)),
        Op("variance", "two-pass variance over 512 features", lambda rng, s: (
            rng.standard_normal((max(s // 512, 1), 512)).astype(np.float32),), variance, variance64),
        Op("sum", "sum of the whole input", _elementwise, jnp.sum, np.sum),
    ]


def errors(y: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """The four error figures of one output against its float64 reference (module docstring)."""
    y64, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    diff = np.abs(y64 - ref)
    norm = float(np.linalg.norm(ref))
    top = float(np.abs(ref).max(initial=0.0))
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    return {"rel_norm": float(np.linalg.norm(y64 - ref)) / norm if norm > 0 else 0.0,
            "rel_max": float((diff / np.maximum(np.abs(ref), FLOOR)).max(initial=0.0)),
            "rel_to_max": float(diff.max(initial=0.0)) / top if top > 0 else 0.0,
            "ulp_max": float((diff / ulp).max(initial=0.0))}


def measure(size: int = 1 << 20, repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """Every op at every precision: {"device", "jax", "ops": {op: {"what", precision: figures}}}."""
    import jax

    device = jax.devices()[0]
    ops = _ops()
    found: dict[str, Any] = {op.name: {"what": op.what} for op in ops}
    for label, precision in PRECISIONS.items():
        jax.config.update("jax_default_matmul_precision", precision)
        for op in ops:
            fn = jax.jit(op.jax_fn)
            worst: dict[str, float] = {}
            for repeat in range(repeats):
                args = op.inputs(np.random.default_rng([seed, repeat]), size)
                y = np.asarray(fn(*args))
                ref = op.reference(*(a.astype(np.float64) if a.dtype == np.float32 else a for a in args))
                for key, value in errors(y, ref).items():
                    worst[key] = max(worst.get(key, 0.0), value)
            found[op.name][label] = worst
    jax.config.update("jax_default_matmul_precision", None)
    return {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "device": {"platform": device.platform, "kind": device.device_kind, "host": platform.machine()},
            "jax": jax.__version__, "size": size, "repeats": repeats, "seed": seed,
            "precisions": {k: v or "None (the device's default)" for k, v in PRECISIONS.items()},
            "ops": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    result = measure(args.size, args.repeats)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    for name, op in result["ops"].items():
        print(f"{name:16s} highest rel_norm {op['highest']['rel_norm']:.2e} rel_max {op['highest']['rel_max']:.2e}"
              f" | default rel_norm {op['default']['rel_norm']:.2e} rel_max {op['default']['rel_max']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
