"""Reading and checking what a model server is sent, and what it sends back.

What a model reads is its ModelConfig's `input` (rosetta_common.inputs): an image model one FP32 input "images"
[n, height, width] in [0, 1] (`Signature`), the token model one INT64 input "tokens" [n, length] with 1 <= length
<= its max_length (`TokenSignature`), refused as `InputSpec.check` refuses it. `Signature.of(config)` gives the
one a config reads, so the servers' code is the same for both. A V1 body (TF Serving's `{"instances": [...]}`) or
a V2 request (REST or gRPC, kserve's InferRequest read by duck typing) becomes the checked numpy array, or a
RequestError: one line naming the field, the value and what is allowed, which the server answers 400 /
INVALID_ARGUMENT. numpy alone, so every check runs and is tested without kserve; the clients encode a batch
with `request_input`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rosetta_common.errors import InputError, RosettaError, one_line
from rosetta_common.inputs import PAD_ID, InputSpec
from rosetta_common.onnx_conventions import INPUT_NAME, OUTPUT_NAME, TOKENS_NAME
from rosetta_common.serving.names import batch_kind
from rosetta_common.spec import ModelConfig

DATATYPE = "FP32"  # the V2 datatype of an image model's input, and of every model's output
TOKENS_DATATYPE = "INT64"  # the V2 datatype of the token model's input
RAW = {DATATYPE: "<f4", TOKENS_DATATYPE: "<i8"}  # raw bytes (gRPC raw_input_contents): little-endian
V2_EXAMPLE = ('{"inputs": [{"name": "images", "shape": [n, height, width], "datatype": "FP32", "data": [...]}]} '
              '(a token model: "tokens", [n, length], "INT64")')


def request_input(batch: np.ndarray) -> tuple[str, str, np.ndarray]:
    """The V2 input a batch is sent as, (name, datatype, values): images as FP32 "images" (float32), token ids as
    INT64 "tokens" (little-endian int64): what every client of ours sends (pipelines/serving/client.py)."""
    if batch_kind(batch) == "images":
        return INPUT_NAME, DATATYPE, np.ascontiguousarray(batch, dtype=RAW[DATATYPE])
    return TOKENS_NAME, TOKENS_DATATYPE, np.ascontiguousarray(batch, dtype=RAW[TOKENS_DATATYPE])


class RequestError(RosettaError, ValueError):
    """A request the protocol refuses: str(error) is one line naming the field, the value and what is allowed."""


@dataclass(frozen=True)
class Signature:
    """An image model's one input and one output, as the ONNX conventions name them: images (n, height, width)
    float32 in [0, 1], logits (n, classes) float32. Every server describes a model with it (or, for a token
    model, with TokenSignature: `Signature.of` picks), so the metadata of a model is the same on all four."""

    height: int
    width: int
    classes: int
    kind: ClassVar[str] = "images"
    name: ClassVar[str] = INPUT_NAME  # the V2 input's name
    datatype: ClassVar[str] = DATATYPE  # the V2 input's datatype

    @classmethod
    def of(cls, config: ModelConfig) -> Signature | TokenSignature:
        """What `config`'s model reads (config.input): this for images, a TokenSignature for token ids."""
        spec = config.input
        if spec.kind == "tokens":
            return TokenSignature(max_length=spec.max_length, vocab_size=int(spec.vocab_size or 0),
                                  classes=config.num_classes)
        return cls(height=spec.shape[0], width=spec.shape[1], classes=config.num_classes)

    def inputs(self) -> list[dict[str, Any]]:
        """V2 metadata tensors; -1 is the protocol's variable-size dimension (the batch)."""
        return [{"name": INPUT_NAME, "datatype": DATATYPE, "shape": [-1, self.height, self.width]}]

    def outputs(self) -> list[dict[str, Any]]:
        return [{"name": OUTPUT_NAME, "datatype": DATATYPE, "shape": [-1, self.classes]}]

    def allowed(self) -> str:
        return (f"one {DATATYPE} input {INPUT_NAME!r} of shape [n, {self.height}, {self.width}] (n >= 1), "
                "images in [0, 1]")

    def from_v1(self, payload: Any) -> np.ndarray:
        return images_from_v1(payload, self)

    def from_v2(self, request: Any) -> np.ndarray:
        return images_from_v2(request, self)


@dataclass(frozen=True)
class TokenSignature:
    """The token model's one input and one output: token ids (n, length) int64 with 1 <= length <= max_length, ids
    in 0..vocab_size-1 where PAD_ID is padding (rosetta_common.inputs), the ONNX conventions' "tokens"; logits
    (n, classes) float32. Both input dimensions are variable (-1 in the metadata); what is allowed within them is
    InputSpec.check's rule, which every request is held to."""

    max_length: int
    vocab_size: int
    classes: int
    kind: ClassVar[str] = "tokens"
    name: ClassVar[str] = TOKENS_NAME
    datatype: ClassVar[str] = TOKENS_DATATYPE

    @property
    def input(self) -> InputSpec:
        """The model's InputSpec (config.input of its ModelConfig): the one rule a request's tokens must meet."""
        return InputSpec("tokens", (self.max_length,), self.vocab_size)

    def inputs(self) -> list[dict[str, Any]]:
        """V2 metadata tensors: the batch and the length both variable (-1)."""
        return [{"name": TOKENS_NAME, "datatype": TOKENS_DATATYPE, "shape": [-1, -1]}]

    def outputs(self) -> list[dict[str, Any]]:
        return [{"name": OUTPUT_NAME, "datatype": DATATYPE, "shape": [-1, self.classes]}]

    def allowed(self) -> str:
        return (f"one {TOKENS_DATATYPE} input {TOKENS_NAME!r} of shape [n, length] (n >= 1, 1 <= length <= "
                f"{self.max_length}), token ids 0..{self.vocab_size - 1} (pad {PAD_ID}), every row at least one "
                "token")

    def from_v1(self, payload: Any) -> np.ndarray:
        return tokens_from_v1(payload, self)

    def from_v2(self, request: Any) -> np.ndarray:
        return tokens_from_v2(request, self)


AnySignature = Signature | TokenSignature


def _kind(array: np.ndarray) -> str:
    return {"b": "booleans", "U": "strings", "S": "bytes", "O": "objects", "c": "complex numbers"}.get(
        array.dtype.kind, str(array.dtype))


def _array(values: Any, field: str, signature: AnySignature) -> np.ndarray:
    try:
        return np.asarray(values)
    except (ValueError, TypeError):  # ragged nested lists (numpy 2 refuses an inhomogeneous shape)
        raise RequestError(f"{field}: nested lists of unequal lengths; allowed: {signature.allowed()}") from None


def numbers(values: Any, field: str, signature: AnySignature) -> np.ndarray:
    """`values` (nested lists of JSON numbers, or an array) as a numpy array of numbers; RequestError naming
    `field` for strings, booleans, nulls, objects or ragged lists. Integers are numbers (JSON writes 0.0 as 0)."""
    array = _array(values, field, signature)
    if array.dtype.kind not in "iuf":
        raise RequestError(f"{field}: holds {_kind(array)}; allowed: numbers, {signature.allowed()}")
    return array


def integers(values: Any, field: str, signature: TokenSignature) -> np.ndarray:
    """`values` (nested lists of JSON integers, or an array) as an int64 array; RequestError naming `field` for
    numbers that are not integers (a JSON 3.0 is not an INT64), booleans, strings, nulls, ragged lists, or an
    integer beyond int64 (an id outside the vocabulary, said as InputSpec.check says it). No values at all give
    an empty array, refused by its shape."""
    array = _array(values, field, signature)
    if array.size == 0:
        return array.astype(np.int64)
    if array.dtype.kind in "fO" and not isinstance(values, np.ndarray):
        # Python ints beyond int64 come out as objects, or as floats beside others (2**63 and 1): still integers.
        flat = np.asarray(values, dtype=object).ravel()
        bad = next((int(v) for v in flat if isinstance(v, int) and not -(2 ** 63) <= v < 2 ** 63), None)
        if bad is not None and all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            raise RequestError(f"{field}: token id {bad} outside the vocabulary 0..{signature.vocab_size - 1}")
    if array.dtype.kind == "f":
        raise RequestError(f"{field}: holds numbers that are not integers ({array.dtype} values); allowed: "
                           f"{signature.allowed()}")
    if array.dtype.kind not in "iu":
        raise RequestError(f"{field}: holds {_kind(array)}; allowed: integers, {signature.allowed()}")
    if array.dtype.kind == "u" and int(array.max()) > np.iinfo(np.int64).max:
        raise RequestError(f"{field}: token id {int(array.max())} outside the vocabulary "
                           f"0..{signature.vocab_size - 1}")
    return array.astype(np.int64, copy=False)


def check_images(images: np.ndarray, field: str, signature: Signature) -> np.ndarray:
    """The images a model is run on: float32 (n, height, width), n >= 1, finite, in [0, 1]."""
    expected = (signature.height, signature.width)
    if images.ndim != 3 or tuple(images.shape[1:]) != expected or images.shape[0] < 1:
        raise RequestError(f"{field}: shape {list(images.shape)} is not allowed; allowed: {signature.allowed()}")
    images = images.astype(np.float32, copy=False)  # exact for values that came from float32 (JSON keeps them)
    if not np.isfinite(images).all():
        raise RequestError(f"{field}: holds NaN or infinity; allowed: images in [0, 1]")
    low, high = float(images.min()), float(images.max())
    if low < 0.0 or high > 1.0:
        raise RequestError(f"{field}: values from {low:g} to {high:g} are not allowed; allowed: images in [0, 1]")
    return images


def check_tokens(tokens: np.ndarray, field: str, signature: TokenSignature) -> np.ndarray:
    """The token ids a model is run on: int64 (n, length), n >= 1, and what InputSpec.check allows (1 <= length
    <= max_length, every id in the vocabulary, every row at least one token), its one line as the refusal."""
    if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise RequestError(f"{field}: shape {list(tokens.shape)} is not allowed; allowed: {signature.allowed()}")
    try:
        return signature.input.check(np.ascontiguousarray(tokens, dtype=np.int64), field)
    except InputError as error:
        raise RequestError(one_line(str(error))) from None


def _json(body: bytes | bytearray | str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise RequestError(f"body: not JSON ({one_line(str(error))}); allowed: a JSON object") from None


def _v1_instances(payload: Any, one: str, each: str) -> Any:
    """The `instances` of a V1 predict request (TF Serving's row format): a list of `one`, each `each`. `payload`
    is the decoded JSON, or the raw body (KServe hands a body sent with a content type other than JSON over
    undecoded)."""
    if isinstance(payload, bytes | bytearray | str):
        payload = _json(payload)
    if not isinstance(payload, dict):
        raise RequestError(f"body: a JSON {type(payload).__name__}; allowed: an object {{\"instances\": [...]}}")
    if "instances" not in payload:
        raise RequestError(f"instances: missing (the body has {sorted(payload)}); allowed: "
                           f"{{\"instances\": [{one}, ...]}}, each {one} {each}")
    instances = payload["instances"]
    if not isinstance(instances, list):
        raise RequestError(f"instances: a JSON {type(instances).__name__}; allowed: a list of {one}s")
    return instances


def images_from_v1(payload: Any, signature: Signature) -> np.ndarray:
    """The images of a V1 predict request: {"instances": [image, ...]}, each image a height x width nested list of
    numbers."""
    instances = _v1_instances(payload, "image", f"{signature.height} x {signature.width} numbers in [0, 1]")
    return check_images(numbers(instances, "instances", signature), "instances", signature)


def tokens_from_v1(payload: Any, signature: TokenSignature) -> np.ndarray:
    """The token ids of a V1 predict request: {"instances": [row, ...]}, each row a list of integer ids, every row
    of one length (a shorter text padded with PAD_ID)."""
    instances = _v1_instances(payload, "row", f"a list of 1 to {signature.max_length} integer token ids, every row "
                                              f"of one length (pad {PAD_ID})")
    return check_tokens(integers(instances, "instances", signature), "instances", signature)


def _tensor_values(tensor: Any, field: str, datatype: str) -> Any:
    """A V2 input's values, duck-typed on kserve's InferInput: its `data` (REST JSON, gRPC typed contents), else
    its raw bytes (gRPC raw_input_contents, REST's binary extension) as little-endian `datatype` values. KServe
    keeps raw bytes in `_raw_data`; its one public reader, as_numpy, reshapes them and so cannot say how many
    values came."""
    if isinstance(tensor.data, list) and tensor.data:
        return tensor.data
    raw = getattr(tensor, "_raw_data", None)
    if not raw:
        return []
    size = np.dtype(RAW[datatype]).itemsize
    if len(raw) % size:
        raise RequestError(f"{field}: {len(raw)} raw bytes; allowed: {size} bytes per {datatype} value")
    return np.frombuffer(raw, RAW[datatype])


def _v2_tensor(request: Any, signature: AnySignature) -> tuple[Any, list[int], str]:
    """The one input of a V2 inference request (REST or gRPC; kserve's InferRequest, duck-typed), named and typed
    as `signature` says, with any requested output "logits": (tensor, shape, field)."""
    names = [tensor.name for tensor in request.inputs]
    if signature.name not in names:
        raise RequestError(f"inputs: no input named {signature.name!r} (got {names}); allowed: "
                           f"{signature.allowed()}")
    if len(names) != 1:
        raise RequestError(f"inputs: {names}: {len(names)} inputs; allowed: {signature.allowed()}")
    tensor, field = request.inputs[0], "inputs[0]"
    if tensor.datatype != signature.datatype:
        raise RequestError(f"{field}.datatype: {tensor.datatype!r} is not allowed; allowed: {signature.datatype!r}")
    return tensor, [int(n) for n in tensor.shape], field


def _requested_outputs(request: Any) -> None:
    for i, output in enumerate(request.request_outputs or []):
        if output.name != OUTPUT_NAME:
            raise RequestError(f"outputs[{i}].name: {output.name!r} is not allowed; allowed: {OUTPUT_NAME!r}")


def _fill(values: np.ndarray, shape: list[int], field: str, what: str) -> np.ndarray:
    if values.size != math.prod(shape):
        raise RequestError(f"{field}.data: {values.size} values do not fill shape {shape}; allowed: exactly "
                           f"{math.prod(shape)} {what}, row-major")
    return values.reshape(shape)


def images_from_v2(request: Any, signature: Signature) -> np.ndarray:
    """The images of a V2 inference request: exactly one input, named "images", datatype FP32, shape
    [n, height, width], its data filling that shape; any requested output must be "logits"."""
    tensor, shape, field = _v2_tensor(request, signature)
    if len(shape) != 3 or shape[1:] != [signature.height, signature.width] or shape[0] < 1:
        raise RequestError(f"{field}.shape: {shape} is not allowed; allowed: {signature.allowed()}")
    values = numbers(_tensor_values(tensor, f"{field}.data", DATATYPE), f"{field}.data", signature)
    images = _fill(values, shape, field, "numbers")
    _requested_outputs(request)
    return check_images(images, f"{field}.data", signature)


def tokens_from_v2(request: Any, signature: TokenSignature) -> np.ndarray:
    """The token ids of a V2 inference request: exactly one input, named "tokens", datatype INT64, shape
    [n, length] (n >= 1, length >= 1; longer than max_length is refused by InputSpec.check, with its line), its
    data (JSON integers, gRPC int64_contents, or raw little-endian int64) filling that shape; any requested output
    must be "logits"."""
    tensor, shape, field = _v2_tensor(request, signature)
    if len(shape) != 2 or min(shape) < 1:
        raise RequestError(f"{field}.shape: {shape} is not allowed; allowed: {signature.allowed()}")
    values = integers(_tensor_values(tensor, f"{field}.data", TOKENS_DATATYPE), f"{field}.data", signature)
    tokens = _fill(values, shape, field, "integers")
    _requested_outputs(request)
    return check_tokens(tokens, f"{field}.data", signature)


def check_logits(logits: Any, inputs: np.ndarray, signature: AnySignature, name: str) -> np.ndarray:
    """The model's answer, checked before it is sent: float32 (n, classes). A mismatch is a bug of ours (500)."""
    logits = np.asarray(logits)
    expected = (len(inputs), signature.classes)
    if logits.dtype != np.float32 or logits.shape != expected:
        raise RuntimeError(f"model {name!r} returned {logits.dtype} {list(logits.shape)}, expected float32 "
                           f"{list(expected)}")
    return logits
