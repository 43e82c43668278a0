"""The typed model input: images or token ids, one description that every framework, exporter and check reads.

- images: float32 (batch, height, width) in [0, 1], the ONNX input "images";
- tokens: int64 (batch, length) with 1 <= length <= the model's max_length, ids in 0..vocab_size-1 where PAD_ID (0)
  is padding, every row holding at least one real token; the ONNX input "tokens", with a dynamic batch and a dynamic
  length. A padded position is excluded as an attention key and from the pooling, so padding changes nothing (a row
  of padding alone would divide by zero in the pooling and give NaN in torch's attention: refused).

`InputSpec.check` is called wherever a model is: an out-of-vocabulary id, a wrong dtype or a sequence longer than the
maximum is one InputError line naming what was given and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from rosetta_common.errors import InputError

PAD_ID = 0  # the tokenizer's "[PAD]" (rosetta_common.text); the canonical embedding's row 0 starts at zero

InputKind = Literal["images", "tokens"]


@dataclass(frozen=True)
class InputSpec:
    kind: InputKind
    shape: tuple[int, ...]  # per example: (height, width) or (max_length,)
    vocab_size: int | None = None  # tokens only

    @property
    def name(self) -> str:
        """The ONNX input's name (rosetta_common.onnx_conventions)."""
        return self.kind

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.kind == "images" else np.int64)

    @property
    def max_length(self) -> int:
        if self.kind != "tokens":
            raise AttributeError("an image input has no max_length")
        return self.shape[0]

    def check(self, x: object, where: str = "input") -> np.ndarray:
        """`x` as the model takes it, or InputError (one line naming `where`, what it got and what is allowed)."""
        if not isinstance(x, np.ndarray):
            raise InputError(f"{where}: a {type(x).__name__}, expected a numpy array of {self.describe()}")
        if x.dtype != self.dtype:
            raise InputError(f"{where}: dtype {x.dtype}, expected {self.describe()}")
        if self.kind == "images":
            if x.ndim != 3 or tuple(x.shape[1:]) != self.shape:
                raise InputError(f"{where}: shape {x.shape}, expected {self.describe()}")
            return x
        if x.ndim != 2 or x.shape[1] == 0:
            raise InputError(f"{where}: shape {x.shape}, expected {self.describe()}")
        if x.shape[1] > self.max_length:
            raise InputError(f"{where}: sequence length {x.shape[1]}, longer than the model's maximum "
                             f"{self.max_length} (expected {self.describe()})")
        if x.size:
            low, high = int(x.min()), int(x.max())
            if low < 0 or high >= int(self.vocab_size or 0):
                bad = low if low < 0 else high
                raise InputError(f"{where}: token id {bad} outside the vocabulary 0..{self.vocab_size - 1}")
            empty = np.flatnonzero((x != PAD_ID).sum(axis=1) == 0)
            if len(empty):
                raise InputError(f"{where}: row {int(empty[0])} is all padding (id {PAD_ID}); every row needs "
                                 "at least one token")
        return x

    def describe(self) -> str:
        if self.kind == "images":
            return f"float32 (batch, {self.shape[0]}, {self.shape[1]}) images"
        return (f"int64 (batch, length) token ids, 1 <= length <= {self.max_length}, ids 0..{self.vocab_size - 1} "
                f"(pad {PAD_ID})")


def padding_mask(tokens: np.ndarray) -> np.ndarray:
    """True where a position holds a real token, False where it is padding: the "attend" polarity (Keras' and
    Flax's masks; torch's key_padding_mask is its negation)."""
    return np.asarray(tokens) != PAD_ID


def random_tokens(rng: np.random.Generator, batch: int, length: int, vocab_size: int) -> np.ndarray:
    """Random padded token batches: each row a random number 1..length of ids drawn from 1..vocab_size-1, the rest
    PAD_ID (so every row is valid and most are padded)."""
    ids = rng.integers(1, vocab_size, size=(batch, length), dtype=np.int64)
    lengths = rng.integers(1, length + 1, size=batch)
    ids[np.arange(length)[None, :] >= lengths[:, None]] = PAD_ID
    return ids


def random_batch(spec: InputSpec, batch: int, seed: int, length: int | None = None) -> np.ndarray:
    """A random valid input: images uniform in [0, 1), or padded tokens of `length` (default: the maximum)."""
    rng = np.random.default_rng(seed)
    if spec.kind == "images":
        return rng.random((batch, *spec.shape), dtype=np.float32)
    return random_tokens(rng, batch, length or spec.max_length, int(spec.vocab_size))
