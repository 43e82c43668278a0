"""The names a model is served under, and what identifies a served batch.

A model is served under its served name: the run folder's name with "_" as "-", because KServe's
InferenceService and TrainedModel names, and so the names a server is asked for, are DNS-1123 labels
(`text_transformer` is served as `text-transformer`; the image models' names are labels already). Beside each
model every server serves `<name>-init`, the model of the shared canonical init weights. Every server, the
launcher, the serve stage's client, the validator and the manifests take the names from here, and the validator
takes SERVED_FORMAT (the native format each framework's server runs) and the batch hashes the serve stage
records. numpy alone: the orchestrator and the validator import it without kserve.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

INIT_SUFFIX = "-init"  # <name>-init: the model of the canonical init weights, beside <name>
# KServe's InferenceService and TrainedModel names: RFC 1123 labels, at most 63 characters.
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# The native format each framework's server runs: the key of its package's load_native that serves its export, and
# so the record of native_outputs.npz (inference_<format>_batch_runs) its answers must equal. Beside the served
# names rather than in each server module: the validator reads it too and cannot import those (they import the
# frameworks).
SERVED_FORMAT = {"torch": "torch_export", "tf": "saved_model", "jax": "jax_export"}


def served_name(model: str) -> str:
    """The name `model` (a run folder: an architecture of params.yaml) is served under: a DNS-1123 label, as KServe's
    InferenceService and TrainedModel names must be, so "_" becomes "-" (text_transformer -> text-transformer); a
    name that is a label already (every image model's) is served as it is. ValueError for a name no label can
    carry (the init twin's, 5 characters longer, must fit too)."""
    name = model.replace("_", "-")
    if not DNS_1123_LABEL.fullmatch(name) or len(name) + len(INIT_SUFFIX) > 63:
        raise ValueError(f"model {model!r}: cannot be served under a DNS-1123 label (served name {name!r}); allowed: "
                         f"a-z, 0-9, '-' or '_' inside, at most {63 - len(INIT_SUFFIX)} characters")
    return name


def init_name(model: str) -> str:
    """The served name of `model`'s canonical-init twin: its served name, then INIT_SUFFIX."""
    return f"{served_name(model)}{INIT_SUFFIX}"


def served_models(models: Sequence[str]) -> list[str]:
    """Every name a server serves for these run folders, in order: each model's served name, then its init twin's.
    The one list of served names: the servers, the launcher's readiness wait, the serve stage's client, the
    validator and the manifests all take it from here."""
    return [name for model in models for name in (served_name(model), init_name(model))]


def batch_kind(batch: np.ndarray) -> str:
    """What a batch is (rosetta_common.inputs' kinds): "tokens" for integer token ids, "images" for floats."""
    kind = np.asarray(batch).dtype.kind
    if kind not in "fiu":
        raise TypeError(f"a batch of {np.asarray(batch).dtype}: neither images (float) nor token ids (integers)")
    return "images" if kind == "f" else "tokens"


def batch_sha256(batch: np.ndarray) -> str:
    """The sha256 of a batch's values as its model reads them, C order, little-endian: images as float32 (the bytes
    rosetta_common.data.batch_sha256 hashes, so an image batch's hash is what it always was), token ids as int64
    (their own bytes, not a float32 cast of them). How the serve stage records which batch it sent each model,
    and the validate stage checks it against its own."""
    dtype = "<f4" if batch_kind(batch) == "images" else "<i8"
    return hashlib.sha256(np.ascontiguousarray(batch, dtype=dtype).tobytes()).hexdigest()
