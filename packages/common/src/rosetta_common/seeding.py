"""Seeding of the framework-neutral random sources; each framework package seeds its own on top."""

from __future__ import annotations

import hashlib
import random

import numpy as np


def seed_everything(seed: int) -> np.random.Generator:
    random.seed(seed)
    np.random.seed(seed)
    return np.random.default_rng(seed)


def derive_seed(seed: int, *names: str) -> int:
    """A stable sub-seed for a named purpose (e.g. ("init", "mlp")), independent of call order."""
    words = [int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little") for name in names]
    sequence = np.random.SeedSequence([seed, *words])
    return int(sequence.generate_state(1, dtype=np.uint32)[0])
