"""Inference mode: an export must give the same logits in two runs and for an image alone or in its batch
(rosetta_common.metrics.inference_mode_problems decides). ONNX files run here; a native format, which the
validator cannot load, is judged from the logits its reload recorded at export (replayed)."""

from __future__ import annotations

import numpy as np

from pipelines.checks.ledger import CheckError, Ledger
from rosetta_common.interface import Predict
from rosetta_common.metrics import inference_mode_problems, max_abs_diff
from rosetta_common.spec import TolerancesSpec


class Spread:
    """A predict function that remembers the first logits it gave each image (by its bytes) and the largest change
    of an image's logits in any later call: the figure behind inference_mode_problems' verdict (two runs on the
    same images, an image alone vs in its batch)."""

    def __init__(self, predict: Predict) -> None:
        self.predict = predict
        self.first: dict[bytes, np.ndarray] = {}
        self.value = 0.0

    def __call__(self, images: np.ndarray) -> np.ndarray:
        out = self.predict(images)
        new: dict[bytes, np.ndarray] = {}
        for image, logits in zip(images, out, strict=True):
            key = image.tobytes()
            if key in self.first:
                self.value = max(self.value, max_abs_diff(logits, self.first[key]))
            else:
                new.setdefault(key, logits)  # a duplicate within one call is no second run
        self.first.update(new)
        return out


def replay(runs: np.ndarray, alone: np.ndarray, batch: np.ndarray, where: str) -> Predict:
    """The logits a native export recorded, played back as a predict function: the validation batch gets its
    recorded runs in order, one of its first images alone gets its alone logits; anything else is a CheckError
    (the record lacks what the check asks for)."""
    calls = iter(runs)

    def predict(images: np.ndarray) -> np.ndarray:
        if images.shape == batch.shape and np.array_equal(images, batch):
            found = next(calls, None)
            if found is not None:
                return found
            raise CheckError(f"{where}: records {len(runs)} runs on the validation batch, the check needs more")
        if len(images) == 1:
            for i in range(len(alone)):
                if np.array_equal(images[0], batch[i]):
                    return alone[i : i + 1]
        raise CheckError(f"{where}: records no logits for {len(images)} such images (shape {images.shape})")

    return predict


def inference_mode(ledger: Ledger, tol: TolerancesSpec, arch: str, fw: str, check: str, predict: Predict,
                   batch: np.ndarray) -> None:
    """One export's inference-mode check: the row's value is the largest change it saw (Spread), judged against
    tolerances.inference_mode_abs."""
    spread = Spread(predict)
    try:
        problems = inference_mode_problems(spread, batch, tol.inference_mode_abs)
    except CheckError as error:
        ledger.add(arch, fw, check, None, tol.inference_mode_abs, False, str(error))
        return
    ledger.add(arch, fw, check, spread.value, tol.inference_mode_abs, not problems,
               "; ".join(problems) or "within tolerance: no dropout, no batch statistics seen")
