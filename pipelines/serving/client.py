"""A small client of Rosetta's model servers: one batch (images, or a token model's ids) through V1 REST, V2 REST and
V2 gRPC, the logits back as numpy arrays.

    from pipelines.serving import client
    logits = client.predict_v1(url, "mlp", images)      # POST /v1/models/mlp:predict
    logits = client.infer_v2(url, "text-transformer", tokens)   # POST /v2/models/text-transformer/infer
    logits = client.infer_grpc(target, "mlp", images)   # GRPCInferenceService/ModelInfer

A model is asked for by its served name; the batch's dtype says what it is sent as (requests.request_input of
rosetta_common.serving): floats as the FP32 input "images", integers as the INT64 input "tokens". REST is urllib
(anywhere, the orchestrator included); gRPC takes KServe's own stubs, so it runs in a serving environment
(`python -m pipelines.runner validation -- python -m pipelines.serving.client ...`). No bit is lost: float32 goes
out as JSON numbers (the shortest repr, which parses back to the same value) or raw little-endian float32, token
ids as JSON integers or raw int64. A refused request raises RequestFailed with the status and the server's line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rosetta_common.errors import RosettaError
from rosetta_common.onnx_conventions import OUTPUT_NAME
from rosetta_common.serving import import_kserve
from rosetta_common.serving.requests import request_input

TIMEOUT_SECONDS = 60.0
MAX_GRPC_MESSAGE = 64 * 1024 * 1024  # the client's own; the server enforces its limit


class RequestFailed(RosettaError):
    """A request the server refused: `status` is the HTTP status (int), the gRPC code's name, or "unreachable"."""

    def __init__(self, status: int | str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


def request(url: str, body: bytes | None = None, content_type: str = "application/json",
            timeout: float = TIMEOUT_SECONDS) -> Any:
    """GET (no body) or POST `url`; the decoded JSON answer, or RequestFailed with the status and the server's
    `error` line."""
    headers = {"Content-Type": content_type} if body is not None else {}
    call = urllib.request.Request(url, data=body, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(call, timeout=timeout) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):  # not JSON, or not an object: the text as it is
            text = json.loads(text).get("error", text)
        raise RequestFailed(error.code, text) from None
    except (urllib.error.URLError, OSError) as error:  # refused, reset, timed out: no HTTP status at all
        raise RequestFailed("unreachable", f"{url}: {getattr(error, 'reason', error)}") from None


def predict_v1(url: str, model: str, batch: np.ndarray) -> np.ndarray:
    """V1 (TF Serving's REST): {"instances": images (or rows of token ids)} -> {"predictions": logits}."""
    body = json.dumps({"instances": request_input(batch)[2].tolist()}).encode()
    answer = request(f"{url}/v1/models/{model}:predict", body)
    return np.asarray(answer["predictions"], dtype=np.float32)


def infer_v2(url: str, model: str, batch: np.ndarray) -> np.ndarray:
    """V2 REST (Open Inference Protocol): one tensor in (FP32 "images", or INT64 "tokens"), the "logits" tensor
    out."""
    name, datatype, values = request_input(batch)
    tensor = {"name": name, "shape": list(values.shape), "datatype": datatype, "data": values.ravel().tolist()}
    answer = request(f"{url}/v2/models/{model}/infer", json.dumps({"inputs": [tensor]}).encode())
    (output,) = [o for o in answer["outputs"] if o["name"] == OUTPUT_NAME]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def metadata(url: str, model: str) -> dict[str, Any]:
    """V2 model metadata: name, platform, inputs and outputs (name, datatype, shape)."""
    return request(f"{url}/v2/models/{model}")


def grpc_stub(target: str) -> Any:
    """KServe's V2 gRPC stub on an insecure channel to `target` (host:port)."""
    import grpc

    import_kserve()
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc

    channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
                                                     ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE)])
    return grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_call(method: Any, message: Any, timeout: float = TIMEOUT_SECONDS) -> Any:
    """One unary call; RequestFailed with the gRPC code's name and the server's details when refused."""
    import grpc

    try:
        return method(message, timeout=timeout)
    except grpc.RpcError as error:
        raise RequestFailed(error.code().name, error.details() or "") from None


def infer_grpc(target: str, model: str, batch: np.ndarray, stub: Any = None) -> np.ndarray:
    """V2 gRPC: the images as raw float32 (or token ids as raw int64) in raw_input_contents, built with KServe's
    InferRequest; the logits from its InferResponse."""
    import_kserve()
    from kserve.protocol.infer_type import InferInput, InferRequest, InferResponse

    name, datatype, values = request_input(batch)
    tensor = InferInput(name=name, shape=list(values.shape), datatype=datatype)
    tensor.set_data_from_numpy(values, binary_data=True)
    message = InferRequest(model_name=model, infer_inputs=[tensor]).to_grpc()
    reply = grpc_call((stub or grpc_stub(target)).ModelInfer, message)
    (output,) = [o for o in InferResponse.from_grpc(reply).outputs if o.name == OUTPUT_NAME]
    return output.as_numpy().astype(np.float32, copy=False)


def logits(url: str, grpc_target: str | None, model: str, batch: np.ndarray) -> dict[str, np.ndarray]:
    """The batch through every protocol: {"v1": ..., "v2": ..., "grpc": ...} (gRPC only with a target, and only
    where kserve is installed)."""
    found = {"v1": predict_v1(url, model, batch), "v2": infer_v2(url, model, batch)}
    if grpc_target:
        found["grpc"] = infer_grpc(grpc_target, model, batch)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Send one batch (a .npy of float32 images, or of int64 token ids) "
                                                 "to a Rosetta model server through V1 REST, V2 REST and V2 gRPC.")
    parser.add_argument("--url", required=True, help="the server's REST base, e.g. http://127.0.0.1:8500")
    parser.add_argument("--grpc", help="its gRPC host:port, e.g. 127.0.0.1:8501 (needs kserve)")
    parser.add_argument("--model", required=True, help="its served name, e.g. mlp, cnn-init, text-transformer")
    parser.add_argument("--batch", "--images", dest="batch", type=Path, required=True,
                        help=".npy: float32 (n, height, width) images, or int64 (n, length) token ids")
    parser.add_argument("--out", type=Path, required=True, help=".npz with one array of logits per protocol")
    args = parser.parse_args(argv)
    try:
        found = logits(args.url, args.grpc, args.model, np.load(args.batch, allow_pickle=False))
    except RequestFailed as error:
        print(f"error: {args.model}: {error}", file=sys.stderr)
        return 1
    with open(args.out, "wb") as f:
        np.savez(f, **found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
