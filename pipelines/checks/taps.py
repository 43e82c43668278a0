"""Per-layer taps in the validate stage: where two forwards part, not only that they do.

A failing logits check says only that something differs. train_export records every tap (rosetta_common.taps:
each layer's output, in the order the forward computes it) of the validation batch for the initial and the
trained weights (taps.npz); tap_figures compares them with the float64 reference forward's taps and pairwise, and
holds the init taps to tolerances.forward_parity_abs (init_taps_vs_reference); trained taps are figures only, since
trained runs part once they leave lockstep. localize then names, in each failing check the taps explain, the first
tap over its tolerance, or says that the forwards agree, so the difference lies in the ONNX conversion or in
training (where_it_parts). What each check is told: docs/judge.md, 'Per-layer taps: where two forwards part'.

Pure numpy: it needs neither ONNX Runtime nor a framework.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.ledger import Check, Ledger
from rosetta_common.reference import forward_with_taps
from rosetta_common.spec import ModelConfig
from rosetta_common.taps import TapDiff, first_divergent, taps
from rosetta_common.weights import Weights

Taps = dict[str, np.ndarray]
REFERENCE = "reference"


@dataclass(frozen=True)
class Comparison:
    """Two forwards' taps compared at one tolerance: the first tap over it (None: none is) and every tap's
    figures, in tap order."""

    first: str | None
    diffs: dict[str, TapDiff]
    tolerance: float

    @classmethod
    def of(cls, taps_a: Mapping[str, np.ndarray], taps_b: Mapping[str, np.ndarray],
           tolerance: float) -> Comparison:
        first, diffs = first_divergent(taps_a, taps_b, tolerance)
        return cls(first, diffs, tolerance)

    def worst(self) -> tuple[str, float]:
        """The tap with the largest max abs difference (a NaN one counts as the largest) and that figure."""
        name = max(self.diffs, key=lambda n: math.inf if math.isnan(self.diffs[n].max_abs) else self.diffs[n].max_abs)
        return name, self.diffs[name].max_abs

    def says(self) -> str:
        """The first divergent tap, in words, with its figure."""
        if self.first is None:
            return f"every tap within {self.tolerance:.0e}"
        d = self.diffs[self.first]
        return f"first divergent tap {self.first} (max abs {d.max_abs:.3g}, {d.rel:.3g} of its scale)"

    def record(self) -> dict[str, Any]:
        """As reports/validation.json stores it: a non-finite figure is null (the file holds no NaN)."""
        return {"first_divergent": self.first, "tolerance": self.tolerance,
                "taps": [{"tap": name, "max_abs": finite(d.max_abs), "scale": finite(d.scale), "rel": finite(d.rel)}
                         for name, d in self.diffs.items()]}


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def read_taps(path: Any, config: ModelConfig, batch_size: int) -> dict[str, Taps]:
    """taps.npz as train_export wrote it: {"init": taps, "trained": taps}, each with every tap of the
    architecture in its order and shape for the validation batch. ValueError naming what is wrong."""
    expected = taps(config, batch_size)
    with np.load(path, allow_pickle=False) as f:
        arrays = {key: f[key] for key in f.files}
    out = {}
    for kind in paths.TAP_KINDS:
        found = [key.split("/", 1)[1] for key in arrays if key.startswith(f"{kind}/")]
        if found != [tap.name for tap in expected]:
            raise ValueError(f"{path}: {kind} taps {found}, expected {[tap.name for tap in expected]}")
        for tap in expected:
            shape = arrays[f"{kind}/{tap.name}"].shape
            if shape != tap.shape:
                raise ValueError(f"{path}: {kind}/{tap.name} has shape {shape}, expected {tap.shape}")
        out[kind] = {tap.name: arrays[f"{kind}/{tap.name}"] for tap in expected}
    return out


def compare(recorded: Mapping[str, Taps], reference: Mapping[str, Taps], tolerance: float) -> dict[str, Any]:
    """Every framework against its reference and every pair of frameworks, one kind of weights: {"vs_reference":
    {fw: Comparison}, "pairs": {"a|b": Comparison}}. `reference[fw]` is the reference forward on the weights that
    framework's taps came from."""
    return {"vs_reference": {fw: Comparison.of(t, reference[fw], tolerance) for fw, t in recorded.items()},
            "pairs": {f"{a}|{b}": Comparison.of(recorded[a], recorded[b], tolerance)
                      for a, b in itertools.combinations(recorded, 2)}}


def tap_figures(ledger: Ledger, arch: str, config: ModelConfig, frameworks: list[str], batch: np.ndarray,
                init: Weights, trained: Mapping[str, Weights], tolerance: float) -> dict[str, Any]:
    """Read each framework's taps.npz (a run the caller judged intact), compare them (init: against the reference on
    the shared init and pairwise, at `tolerance`; trained: against the reference on each framework's own trained
    weights and pairwise, as figures), add the init_taps_vs_reference checks, and return the model's comparisons:
    {"init": ..., "trained": ...}."""
    recorded: dict[str, dict[str, Taps]] = {}
    for fw in frameworks:
        try:
            recorded[fw] = read_taps(paths.taps(arch, fw), config, len(batch))
        except (OSError, KeyError, ValueError) as error:
            ledger.add(arch, fw, names.TAPS_READABLE, None, None, False, f"{type(error).__name__}: {error}")
    shared = forward_with_taps(config, init, batch)
    out = {"init": compare({fw: t["init"] for fw, t in recorded.items()}, dict.fromkeys(recorded, shared),
                           tolerance)}
    have = [fw for fw in recorded if fw in trained]  # a run whose trained weights did not read has no reference
    out["trained"] = compare({fw: recorded[fw]["trained"] for fw in have},
                             {fw: forward_with_taps(config, trained[fw], batch) for fw in have}, tolerance)
    for fw, comparison in out["init"]["vs_reference"].items():
        tap, value = comparison.worst()
        ledger.add(arch, fw, names.INIT_TAPS_VS_REFERENCE, finite(value), tolerance,
                   comparison.first is None, f"{comparison.says()}; worst tap {tap}")
    return out


def where_it_parts(check: Check, figures: Mapping[str, Any]) -> str | None:
    """The tap a failing check's difference enters at, in words (None: not a check the taps explain, or no taps
    of its subject were read)."""
    init, trained = figures["init"], figures["trained"]
    if check.name == names.TRAINED_WEIGHTS_VS_NATIVE:
        # The trained taps against the reference run on the trained canonical file: where the file stops being
        # the model the framework trained (the first layer a mapping of its weights got wrong).
        comparison = trained["vs_reference"].get(check.subject)
        if comparison is None:
            return None
        if comparison.first is None:
            return (f"{check.subject}'s native trained taps all agree with the float64 reference on its trained "
                    f"canonical weights (within {comparison.tolerance:.0e})")
        return (f"{check.subject}'s native trained taps leave the float64 reference on its trained canonical "
                f"weights at: {comparison.says()}")
    if check.name in (names.INIT_ONNX_VS_REFERENCE, names.INIT_ONNX_VS_NATIVE, names.ONNX_VS_NATIVE):
        kind = trained if check.name == names.ONNX_VS_NATIVE else init
        comparison = kind["vs_reference"].get(check.subject)
        if comparison is None:
            return None
        which = "trained" if check.name == names.ONNX_VS_NATIVE else "init"
        if comparison.first is None:
            return (f"{check.subject}'s native {which} taps all agree with the float64 reference "
                    f"(within {comparison.tolerance:.0e}), so the difference is in the ONNX conversion")
        return f"{check.subject}'s native {which} taps leave the float64 reference at: {comparison.says()}"
    if check.name in (names.FORWARD_PARITY_INIT_ONNX, names.TRAIN_STEP1_LOSS_REL, names.TRAIN_LOCKSTEP_LOSS_REL,
                      *names.END_OF_TRAINING_PAIR):
        comparison = init["pairs"].get(check.subject)
        if comparison is None:
            return None
        if comparison.first is not None:
            return f"init taps of {check.subject}: {comparison.says()}"
        if check.name == names.FORWARD_PARITY_INIT_ONNX:
            return (f"the native init taps of {check.subject} agree at every tap (within "
                    f"{comparison.tolerance:.0e}), so the difference is in an ONNX conversion")
        in_training = (f"the init forward taps of {check.subject} agree at every tap (inference mode, within "
                       f"{comparison.tolerance:.0e}), so the difference is in training: the training-mode forward, "
                       "the backward pass or the optimizer")
        after = trained["pairs"].get(check.subject)
        if check.name not in names.END_OF_TRAINING_PAIR or after is None:
            return in_training
        # A figure of the trained models: where their own forwards part says which layer's trained state differs
        # (BatchNorm's momentum convention: only the running statistics, first at the first BatchNorm's tap).
        return f"{in_training}; trained taps of {check.subject}: {after.says()}"
    return None


def localize(ledger: Ledger, arch: str, figures: Mapping[str, Any]) -> None:
    """Name, in the detail of every failing check of `arch` that the taps explain, the first tap over its
    tolerance (where_it_parts), and point at the report's figure."""
    for i, check in enumerate(ledger.checks):
        # An end-of-training check judged against the replicates' null stands failed until judge_nulls decides
        # it, after every model: not localized (its runs have parted, so their trained taps part from the first
        # layer on anyway). A lockstep check judged so is: its runs have not parted.
        if check.model != arch or check.passed or (check.null is not None and check.name in names.END_OF_TRAINING_PAIR):
            continue
        said = where_it_parts(check, figures)
        if said is not None:
            detail = f"{check.detail}; {said}" if check.detail else said
            ledger.checks[i] = replace(check, detail=detail)


def taps_record(arch: str, figures: Mapping[str, Any]) -> dict[str, Any]:
    """One model's entry in reports/validation.json's "taps": per kind of weights, each framework against the
    reference and each pair, every tap's max_abs, scale and rel, and the first divergent tap."""
    return {"model": arch,
            **{kind: {side: {who: c.record() for who, c in figures[kind][side].items()}
                      for side in ("vs_reference", "pairs")} for kind in paths.TAP_KINDS}}
