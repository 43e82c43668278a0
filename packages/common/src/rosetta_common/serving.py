"""Serving Rosetta's models: what the four model servers share, written once.

Four servers serve the same models over the same protocols, each in its own environment: rosetta_torch.serve (the
torch.export program), rosetta_tf.serve (the SavedModel's serving signature), rosetta_jax.serve (the jax.export
artifact) and pipelines.serve_onnx (every model.onnx under ONNX Runtime). Each is KServe's `ModelServer`: V1 (TF
Serving's REST shape, `POST /v1/models/<m>:predict`) and V2 (the Open Inference Protocol) over REST, V2 over gRPC,
on 127.0.0.1 only (`--host 0.0.0.0` in a container: the addresses of the network its stage made). A framework
module adds only how its export is loaded and run (a `ServedModel` that is also a
`kserve.Model`); everything else is here: reading and checking a request, the model metadata, the responses, the
loopback ModelServer with its body size limit, and the command line all four take.

Why here and why kserve is imported lazily: the framework packages may import rosetta_common but never `pipelines`
(tests/test_imports.py), and the ONNX server runs in the validation environment, which has rosetta_common and the
repository root and no framework package; rosetta_common is the one package all four can import.

A model is served under its served name (`served_name`): the run folder's name with "_" as "-", because KServe's
InferenceService and TrainedModel names, and so the names a server is asked for, are DNS-1123 labels
(`text_transformer` is served as `text-transformer`; the image models' names are already labels and stay as they
are). Every server, the launcher, the serve stage's client, the validator and the manifests take the names from here.

Every server serves two models per run folder: `<name>`, the export the framework itself would ship (trained), and
`<name>-init` (init_name), the model of the shared canonical init weights (`--init`,
artifacts/init/<arch>.safetensors, the file every framework's train_export starts from): the framework's own model
built from that file by its
package's models.build, as train_export builds it, run by models.predict (the ONNX server: the run folder's
init.onnx, that model exported). Its weights are the same bits in every framework, so its logits must agree across
servers within the forward-parity tolerance, which the trained models' (three models, trained apart) need not.

What a model reads is its ModelConfig's `input` (rosetta_common.inputs): an image model one FP32 input "images"
[n, height, width] (`Signature`), the token model one INT64 input "tokens" [n, length] with 1 <= length <= its
max_length (`TokenSignature`; V1 instances are lists of ints, V2 data ints, gRPC int64_contents or raw little-endian
int64), refused as `InputSpec.check` refuses it (an id outside the vocabulary, a wrong datatype, a sequence too long,
a row of padding alone). `Signature.of(config)` gives the one a config reads, so the framework servers' code is the
same for both.

rosetta_common is also the numpy-level package every environment has, the orchestrator's included, which has no
kserve: so this module imports kserve only inside the functions that build kserve objects. Importing it costs numpy
alone, and the request checks (`images_from_v1`, `images_from_v2`, `check_images`, `tokens_from_v1`,
`tokens_from_v2`, `check_tokens`) run and are tested without kserve.

Every bad request is a one-line error naming the field, the value and what is allowed: HTTP 400 (V1, V2 REST) or
INVALID_ARGUMENT (gRPC) for a wrong shape, datatype, value or missing input; 404 / NOT_FOUND for a model not served;
413 for a REST body above the size limit (gRPC: RESOURCE_EXHAUSTED, gRPC's own limit set to the same size). The
server keeps serving after each.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import ipaddress
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from rosetta_common.errors import ArtifactError, InputError, RosettaError, one_line
from rosetta_common.inputs import PAD_ID, InputSpec
from rosetta_common.interface import Predict
from rosetta_common.onnx_conventions import INPUT_NAME, OUTPUT_NAME, TOKENS_NAME
from rosetta_common.spec import ModelConfig

HOST = "127.0.0.1"  # loopback: nothing here is meant to be reached from another machine (a container: its network)
DATATYPE = "FP32"  # the V2 datatype of an image model's input, and of every model's output
TOKENS_DATATYPE = "INT64"  # the V2 datatype of the token model's input
RAW = {DATATYPE: "<f4", TOKENS_DATATYPE: "<i8"}  # raw bytes (gRPC raw_input_contents): little-endian
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # a REST body or gRPC message; 1024 MNIST images as V2 JSON are ~9 MB
GRACE_SECONDS = 5  # how long a stopping server lets requests in flight finish
GRPC_WORKERS = 4
INIT_SUFFIX = "-init"  # <name>-init: the model of the canonical init weights, beside <name>
# KServe's InferenceService and TrainedModel names: RFC 1123 labels, at most 63 characters.
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# The native format each framework's server runs: the key of its package's load_native that serves its export, and
# so the record of native_outputs.npz (inference_<format>_batch_runs) its answers must equal. Here, beside the
# servers, rather than in each server module: the validator reads it too and cannot import those (they import the
# frameworks); it can import this module, which imports kserve only inside functions.
SERVED_FORMAT = {"torch": "torch_export", "tf": "saved_model", "jax": "jax_export"}
V2_EXAMPLE = ('{"inputs": [{"name": "images", "shape": [n, height, width], "datatype": "FP32", "data": [...]}]} '
              '(a token model: "tokens", [n, length], "INT64")')


def import_kserve() -> ModuleType:
    """kserve, imported with this process's command line hidden from it. kserve.model_server parses sys.argv when
    it is first imported (argparse's parse_known_args, which ignores flags it does not know but still exits on an
    abbreviation of its own: `--grpc` of pipelines.serving_client's command line matched three of its flags), so
    every module of ours that uses kserve imports it through here, first."""
    if "kserve.model_server" not in sys.modules:
        argv, sys.argv = sys.argv, sys.argv[:1]
        try:
            import kserve.model_server
        finally:
            sys.argv = argv
    import kserve

    return kserve


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


def request_input(batch: np.ndarray) -> tuple[str, str, np.ndarray]:
    """The V2 input a batch is sent as, (name, datatype, values): images as FP32 "images" (float32), token ids as
    INT64 "tokens" (little-endian int64): what every client of ours sends (pipelines/serving_client.py)."""
    if batch_kind(batch) == "images":
        return INPUT_NAME, DATATYPE, np.ascontiguousarray(batch, dtype=RAW[DATATYPE])
    return TOKENS_NAME, TOKENS_DATATYPE, np.ascontiguousarray(batch, dtype=RAW[TOKENS_DATATYPE])


def init_file(init_dir: Path, model: str) -> Path:
    """The canonical init weights of `model` in the init stage's folder."""
    return init_dir / f"{model}.safetensors"


def load_init(path: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    """The canonical init weights at `path`, checked against `config` (names, shapes, dtype, architecture, all
    finite): what train_export's jobs load (rosetta_common.weights.load_weights). Imported here, not at the top:
    safetensors is a dependency of the servers that build models, not of every importer of this module."""
    from rosetta_common.weights import load_weights

    try:
        return load_weights(path, config)
    except RosettaError:
        raise
    except Exception as error:  # a file that is not safetensors at all
        raise ArtifactError(f"{path}: not readable canonical weights ({one_line(str(error))})") from None


def init_forward(build: Callable[[ModelConfig, Any], Any], predict: Callable[[Any, np.ndarray], np.ndarray],
                 config: ModelConfig, path: Path) -> Predict:
    """The framework's model of the canonical init weights at `path`: `build(config, weights)` (the contract's
    models.build: the native model holding those weights, in inference mode, as train_export builds it from the
    same file) run by `predict` (models.predict, as train_export records init_validation_logits)."""
    model = build(config, load_init(path, config))
    return lambda inputs: predict(model, inputs)


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


class ServedModel:
    """The serving half of a served model, mixed into a `kserve.Model` by each server:

        class NativeModel(ServedModel, kserve.Model): ...

    The subclass's `load` sets `signature` (Signature.of its config: images or tokens) and `forward` (the
    export's predict: the checked inputs in, logits out) and `ready`; this class answers V1 and V2 requests (REST
    and gRPC alike) with them, and the metadata. Its `name` is the served name serving.main gives it."""

    name: str
    signature: AnySignature
    forward: Predict

    def validate(self, payload: Any) -> Any:
        """kserve.Model checks `instances` and `inputs` with messages that name no value; predict checks all."""
        return payload

    def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        """Run the model on a V1 payload (-> {"predictions": ...}) or a V2 InferRequest (-> InferResponse)."""
        import_kserve()
        from kserve.errors import InvalidInput
        from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
        from kserve.utils.utils import generate_uuid

        v2 = isinstance(payload, InferRequest)
        try:
            inputs = self.signature.from_v2(payload) if v2 else self.signature.from_v1(payload)
            # The model checks its input too (models.predict: config.input.check); what it refuses is the
            # client's, said in the same one line, though the request checks above refuse all of it first.
            found = self.forward(inputs)
        except (RequestError, InputError) as error:
            raise InvalidInput(one_line(str(error))) from None
        logits = check_logits(found, inputs, self.signature, self.name)
        if not v2:
            # Python floats of float32 values: JSON writes each exactly (shortest round trip), so no bit is lost.
            return {"predictions": logits.tolist()}
        output = InferOutput(name=OUTPUT_NAME, shape=list(logits.shape), datatype=DATATYPE)
        output.set_data_from_numpy(logits, binary_data=False)
        # The request's id, else a new one, as KServe's own servers answer (the protocol's response needs one).
        return InferResponse(response_id=payload.id or generate_uuid(), model_name=self.name, infer_outputs=[output])

    def get_input_types(self) -> list[dict[str, Any]]:
        return self.signature.inputs()

    def get_output_types(self) -> list[dict[str, Any]]:
        return self.signature.outputs()


# --- the ModelServer: KServe's, on loopback, with a body size limit -------------------------------------------


class BodyLimit:
    """ASGI middleware: a request body above `limit` bytes is answered 413 with one line before the app sees any
    of it (uvicorn has no limit of its own). The body is read to its end, so the client, which sends it whole
    before it reads the answer, gets the answer rather than a reset connection; a body within the limit is handed
    on as it came."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length", b"")
        chunks: list[bytes] = []
        size, more, over = 0, True, declared.isdigit() and int(declared) > self.limit
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            over = over or size > self.limit
            if not over:
                chunks.append(message.get("body", b""))
        if over:
            await self._refuse(send, size)
            return
        body, replayed = b"".join(chunks), False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send: Callable[..., Any], size: int) -> None:
        text = f"body: {size} bytes is above the limit; allowed: at most {self.limit} bytes (--max-body-bytes)"
        content = json.dumps({"error": text}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})


class _ClientErrorsInOneLine(logging.Filter):
    """KServe logs every refused request with its traceback; a request the protocol refuses is the client's
    mistake, not ours, so its log record keeps the one line the client got. Errors of ours keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from kserve.errors import InvalidInput, ModelNotFound

        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, InvalidInput | ModelNotFound):
            record.msg, record.args, record.exc_info = f"refused: {error}", (), None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


@functools.cache
def _server_class() -> type:
    """KServe's ModelServer with its own REST and gRPC servers, V1 and V2 handlers, error types and status codes,
    changed only where Rosetta asks for more: REST and gRPC bind 127.0.0.1 (KServe binds every interface); a
    REST body or a gRPC message above the size limit is refused; a request that is not what its protocol takes is
    400 and one line naming the field (FastAPI's default for a V2 body is 422 with a list of errors, KServe's for
    a V1 body that is not JSON names no field); an unknown model's 404 / NOT_FOUND names the models served. Built
    on first use: kserve is imported here, not when this module is."""
    kserve = import_kserve()
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from grpc import aio
    from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER
    from kserve.errors import InvalidInput, ModelNotFound
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
    from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor, LoggingInterceptor
    from kserve.protocol.grpc.server import GRPCServer
    from kserve.protocol.grpc.servicer import InferenceServicer
    from kserve.protocol.rest.server import RESTServer
    from orjson import JSONDecodeError

    class RosettaDataPlane(DataPlane):
        def _served(self, name: str) -> None:
            if self.model_registry.get_model(name) is None:
                error = ModelNotFound(name)
                served = ", ".join(self.model_registry.get_models()) or "none"
                error.reason = f"model {name!r}: not served here; allowed: {served}"
                raise error

        def get_model_from_registry(self, name: str) -> Any:
            self._served(name)
            return super().get_model_from_registry(name)

        async def get_model(self, name: str) -> Any:
            self._served(name)
            return await super().get_model(name)

        async def model_ready(self, model_name: str, disable_predictor_health_check: bool = False) -> bool:
            self._served(model_name)
            return await super().model_ready(model_name, disable_predictor_health_check)

        def decode_inference_request(self, body: Any, headers: dict[str, str], model_name: str) -> Any:
            if isinstance(body, bytes) and INFERENCE_CONTENT_LENGTH_HEADER not in headers:
                # FastAPI hands a V2 body over as bytes when its content type is not JSON (curl -d sends a form).
                kind = headers.get("content-type", "no content type")
                raise InvalidInput(f"body: {len(body)} bytes sent as {kind!r}, without the binary extension's "
                                   f"{INFERENCE_CONTENT_LENGTH_HEADER} header; allowed: Content-Type: "
                                   f"application/json and {V2_EXAMPLE}")
            return super().decode_inference_request(body, headers, model_name)

        def decode(self, body: Any, headers: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().decode(body, headers, *args, **kwargs)
            except InvalidInput as error:  # a V1 body sent as JSON that is not JSON: name the field
                if isinstance(error.__context__, JSONDecodeError):
                    raise InvalidInput(f"body: not JSON ({one_line(str(error.__context__))}); allowed: a JSON "
                                       "object {\"instances\": [...]}") from None
                raise

    async def invalid_request(_: Any, error: RequestValidationError) -> JSONResponse:
        """FastAPI's check of a V2 body against KServe's InferenceRequest model, as one line: the first problem,
        its place in the body (body.inputs[0].datatype), what is allowed."""
        first = (error.errors() or [{}])[0]
        if first.get("type") == "json_invalid":
            text = f"body: not JSON ({first.get('ctx', {}).get('error', 'invalid')})"
        else:
            where = "body"
            for part in first.get("loc", ())[1:]:  # ("body", "InferenceRequest", "inputs", 0, "datatype")
                if isinstance(part, int):
                    where += f"[{part}]"
                elif part != "InferenceRequest":  # the body's declared type, Union[InferenceRequest, bytes]
                    where += f".{part}"
            text = f"{where}: {first.get('msg', 'invalid')}"
        return JSONResponse(status_code=400, content={"error": one_line(f"{text}; allowed: {V2_EXAMPLE}")})

    class LoopbackRESTServer(RESTServer):
        def __init__(self, *args: Any, max_body_bytes: int, host: str, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.config.host = host  # the uvicorn.Config its server holds: bound at start
            self.max_body_bytes = max_body_bytes

        @property
        def started(self) -> bool:
            return bool(self._server.started)

        def create_application(self) -> None:
            super().create_application()
            from kserve.model_server import app

            app.add_exception_handler(RequestValidationError, invalid_request)
            app.add_middleware(BodyLimit, limit=self.max_body_bytes)  # added last: outermost, sees bodies first

    class LoopbackGRPCServer(GRPCServer):
        """GRPCServer.start as KServe writes it, bound to `host` (HOST unless told) instead of every interface
        ([::])."""

        started = False
        host = HOST

        async def start(self, max_workers: int) -> None:
            from concurrent import futures

            servicer = InferenceServicer(self._data_plane, self._model_repository_extension)
            self._server = aio.server(
                futures.ThreadPoolExecutor(max_workers=max_workers),
                interceptors=(LoggingInterceptor(), ExceptionToStatusInterceptor()),
                options=[("grpc.max_send_message_length", self._kwargs["grpc_max_send_message_length"]),
                         ("grpc.max_receive_message_length", self._kwargs["grpc_max_receive_message_length"])],
            )
            grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, self._server)
            if self._server.add_insecure_port(f"{self.host}:{self._port}") == 0:
                raise OSError(f"gRPC could not bind {self.host}:{self._port} (in use?)")
            await self._server.start()
            self.started = True
            await self._server.wait_for_termination()

    class LoopbackModelServer(kserve.ModelServer):
        def __init__(self, http_port: int, grpc_port: int, max_body_bytes: int, ready_line: str,
                     host: str = HOST) -> None:
            super().__init__(http_port=http_port, grpc_port=grpc_port, workers=1, max_threads=GRPC_WORKERS,
                             enable_grpc=True, enable_docs_url=False, enable_latency_logging=False,
                             grace_period=GRACE_SECONDS)
            self.dataplane = RosettaDataPlane(model_registry=self.registered_models)
            self.max_body_bytes, self.ready_line, self.host = max_body_bytes, ready_line, host

        def start(self, models: list[Any]) -> None:
            """ModelServer.start for one REST process and a gRPC server, both on loopback, then one line on
            stdout once both accept connections."""
            self._register_and_check_atleast_one_model_is_ready(models)
            self._rest_server = LoopbackRESTServer(
                "kserve.model_server:app", self.dataplane, self.model_repository_extension, self.http_port,
                workers=1, grace_period=self.grace_period, event_loop=self.event_loop,
                timeout_keep_alive=self.timeout_keep_alive, max_body_bytes=self.max_body_bytes, host=self.host)
            limit = self.max_body_bytes
            self._grpc_server = LoopbackGRPCServer(
                self.grpc_port, self.dataplane, self.model_repository_extension, grace_period=self.grace_period,
                kwargs={"grpc_max_send_message_length": limit, "grpc_max_receive_message_length": limit})
            self._grpc_server.host = self.host
            self.servers += [self._rest_server.start(), self._grpc_server.start(self.max_threads), self._announce()]
            self.setup_event_loop()
            self.register_signal_handler()
            asyncio.run(self._serve())

        async def _announce(self) -> None:
            while not (self._rest_server.started and self._grpc_server.started):
                await asyncio.sleep(0.05)
            print(self.ready_line, flush=True)

    return LoopbackModelServer


def serve(models: Sequence[Any], http_port: int, grpc_port: int, max_body_bytes: int, ready_line: str,
          host: str = HOST) -> None:
    """Serve loaded models until SIGTERM or SIGINT: V1 and V2 REST on host:http_port, V2 gRPC on host:grpc_port
    (host: 127.0.0.1 unless told); `ready_line` goes to stdout once both accept connections."""
    server = _server_class()(http_port, grpc_port, max_body_bytes, ready_line, host)
    logging.getLogger("kserve").addFilter(_ClientErrorsInOneLine())
    # KServe's timing middleware logs two lines per request; uvicorn's access log already has one.
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)
    server.start(list(models))


# --- the command line all four servers take -------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--artifacts", type=Path, required=True,
                        help="a framework's artifacts folder (artifacts/<framework>): one run folder per model")
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help="serve only these run folders (default: every one there)")
    parser.add_argument("--init", type=Path, required=True,
                        help="the init stage's folder (artifacts/init): each model's canonical init weights, served "
                             f"as <model>{INIT_SUFFIX}")
    # A container's server listens on its own interfaces (0.0.0.0), which only the network its stage made reaches.
    parser.add_argument("--host", default=HOST,
                        help=f"the IPv4 address REST and gRPC listen on (default {HOST}; in a container 0.0.0.0)")
    parser.add_argument("--http-port", type=int, required=True, help="V1 and V2 REST, on --host")
    parser.add_argument("--grpc-port", type=int, required=True, help="V2 gRPC, on --host")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"the largest REST body or gRPC message accepted (default {DEFAULT_MAX_BODY_BYTES})")
    args = parser.parse_args(argv)
    try:
        ipaddress.IPv4Address(args.host)
    except ValueError:
        parser.error(f"--host {args.host}: not an IPv4 address; allowed: e.g. {HOST} (default) or 0.0.0.0")
    for flag, port in (("--http-port", args.http_port), ("--grpc-port", args.grpc_port)):
        if not 1 <= port <= 65535:
            parser.error(f"{flag} {port}: not a port; allowed: 1 to 65535")
    if args.http_port == args.grpc_port:
        parser.error(f"--grpc-port {args.grpc_port}: the same as --http-port; allowed: two different ports")
    if not args.init.is_dir():
        parser.error(f"--init {args.init}: not a folder; allowed: the init stage's folder, e.g. artifacts/init")
    if args.max_body_bytes < 1024:
        parser.error(f"--max-body-bytes {args.max_body_bytes}: too small; allowed: 1024 or more")
    return args


def find_models(artifacts: Path, wanted: Sequence[str] | None, served_file: Path) -> dict[str, Path]:
    """Model name (the run folder's) -> run folder: every subfolder of `artifacts` holding `served_file`, sorted by
    name (or the `wanted` ones, in their order; a wanted name may be the folder's or its served name,
    text-transformer for text_transformer). SystemExit with one line when one is missing, or when a folder's name
    cannot be served (served_name) or two folders would be served under one name."""
    if not artifacts.is_dir():
        raise SystemExit(f"error: --artifacts {artifacts}: not a folder; allowed: a framework's artifacts folder, "
                         "e.g. artifacts/torch")
    found = {run.name: run for run in sorted(artifacts.iterdir()) if (run / served_file).exists()}
    if not found:
        raise SystemExit(f"error: --artifacts {artifacts}: no run folder holds {served_file}")
    chosen = []
    for name in wanted or ():
        folder = name if name in found else next((f for f in found if f.replace("_", "-") == name), None)
        if folder is None:
            raise SystemExit(f"error: --models {name}: {artifacts / name / served_file} is missing; allowed: "
                             f"{', '.join(found)}")
        chosen.append(folder)
    runs = {name: found[name] for name in chosen} if wanted else found
    names: dict[str, str] = {}
    for folder in runs:
        try:
            served = served_name(folder)
        except ValueError as error:
            raise SystemExit(f"error: --artifacts {artifacts}: {error}") from None
        if names.setdefault(served, folder) != folder:
            raise SystemExit(f"error: --artifacts {artifacts}: run folders {names[served]} and {folder} would both "
                             f"be served as {served!r}; allowed: one of them (--models)")
    return runs


def main(argv: Sequence[str] | None, *, server: str, served_file: Path, model: Callable[[str, Path], Any],
         init_model: Callable[[str, Path, Path], Any], configure: Callable[[], None] | None = None) -> int:
    """The entry point every server module's `main` is: parse the command line, load every model and its init
    twin once (`model(served_name(folder), run_dir)`, `init_model(init_name(folder), run_dir, init_file)`: each
    named as it is served, whatever its run folder is called; a missing or damaged file is one line, exit 1),
    serve until SIGTERM or SIGINT (exit 0)."""
    args = parse_args(argv, f"Serve Rosetta's models: the {server} server (KServe ModelServer).")
    runs = find_models(args.artifacts, args.models, served_file)
    for name in runs:  # every init file is there before anything is loaded
        if not init_file(args.init, name).is_file():
            raise SystemExit(f"error: --init {args.init}: {init_file(args.init, name)} is missing; allowed: the "
                             "init stage's folder, holding <model>.safetensors for every model served")
    if configure is not None:
        configure()
    models = []
    for name, run in runs.items():  # the run folder's name; each model is served under its served name
        for served in (model(served_name(name), run), init_model(init_name(name), run, init_file(args.init, name))):
            try:
                served.load()
            except RosettaError as error:  # ArtifactError, WeightsError and their kin: one line naming the file
                raise SystemExit(f"error: {error}") from None
            models.append(served)
    ready = (f"ready: {server} server, models {', '.join(served_models(runs))}: http://{args.host}:{args.http_port} "
             f"(V1, V2 REST), grpc {args.host}:{args.grpc_port} (V2), pid {os.getpid()}")
    serve(models, args.http_port, args.grpc_port, args.max_body_bytes, ready, args.host)
    print(f"stopped: {server} server", file=sys.stderr, flush=True)
    return 0
