"""The exception types every package raises for the same failures, so that a stage can turn each into one line.

A `RosettaError`'s message is already the whole line for the user: it names the file or field, what was
found and what is allowed. Anything else escaping a stage is a bug of ours and keeps its traceback.
"""

from __future__ import annotations


class RosettaError(Exception):
    """A failure the user can act on; str(error) is one line naming the file or field."""


class WeightsError(RosettaError, ValueError):
    """Canonical weights that do not fit: a missing or unexpected name, a wrong shape or dtype, a wrong layout
    tag, a non-finite value."""


class DataError(RosettaError, ValueError):
    """Data that is not what the pipeline trains on: a damaged IDX or npz file, images outside [0, 1], labels
    that do not pair up or skip classes."""


class ArtifactError(RosettaError):
    """A stored artifact (a native export, an ONNX file) that is missing, damaged, or refused (for example one
    that would unpickle on load)."""


class ExportError(RosettaError):
    """A converter failed, or wrote a model that breaks the ONNX conventions (rosetta_common.onnx_conventions)."""


class TrainingError(RosettaError):
    """Training could not produce a usable model, for example a loss that became NaN or infinite."""


def one_line(text: str) -> str:
    """Collapse a library's multi-line message into one line (the first non-empty one carries the cause)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


class DistributedError(RosettaError):
    """Data-parallel training could not run: a cluster description that does not add up, a coordinator that
    cannot be reached, a port already in use, a worker that died."""


class InputError(RosettaError, ValueError):
    """A model called with input it does not take: a wrong dtype or rank, token ids outside the vocabulary, a
    sequence longer than the model's maximum, a row with no token, images of another shape."""
