"""A small client of Rosetta's model servers: one batch of images through V1 REST, V2 REST and V2 gRPC, the logits
back as numpy arrays.

    from pipelines import serving_client
    logits = serving_client.predict_v1(url, "mlp", images)      # POST /v1/models/mlp:predict
    logits = serving_client.infer_v2(url, "mlp", images)        # POST /v2/models/mlp/infer
    logits = serving_client.infer_grpc(target, "mlp", images)   # GRPCInferenceService/ModelInfer

REST is the standard library's urllib (it runs anywhere, the orchestrator included). gRPC takes KServe's own
generated stubs and its InferRequest / InferResponse, so it runs where kserve is installed: any of the four serving
environments (`python -m pipelines.runner validation -- python -m pipelines.serving_client ...`).

No bit is lost on the way: float32 values go out as JSON numbers (Python's shortest repr of the float64 that holds
each float32 exactly, which parses back to that float64) or as raw little-endian float32 (gRPC), and come back
the same way. A refused request raises RequestFailed with the status and the server's one line.
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

from rosetta_common import serving
from rosetta_common.errors import RosettaError
from rosetta_common.onnx_conventions import INPUT_NAME, OUTPUT_NAME

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


def _float32(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images, dtype=np.float32)


def predict_v1(url: str, model: str, images: np.ndarray) -> np.ndarray:
    """V1 (TF Serving's REST): {"instances": images} -> {"predictions": logits}."""
    body = json.dumps({"instances": _float32(images).tolist()}).encode()
    answer = request(f"{url}/v1/models/{model}:predict", body)
    return np.asarray(answer["predictions"], dtype=np.float32)


def infer_v2(url: str, model: str, images: np.ndarray) -> np.ndarray:
    """V2 REST (Open Inference Protocol): one FP32 tensor "images" in, the "logits" tensor out."""
    images = _float32(images)
    tensor = {"name": INPUT_NAME, "shape": list(images.shape), "datatype": "FP32", "data": images.ravel().tolist()}
    answer = request(f"{url}/v2/models/{model}/infer", json.dumps({"inputs": [tensor]}).encode())
    (output,) = [o for o in answer["outputs"] if o["name"] == OUTPUT_NAME]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def metadata(url: str, model: str) -> dict[str, Any]:
    """V2 model metadata: name, platform, inputs and outputs (name, datatype, shape)."""
    return request(f"{url}/v2/models/{model}")


def grpc_stub(target: str) -> Any:
    """KServe's V2 gRPC stub on an insecure channel to `target` (host:port)."""
    import grpc

    serving.import_kserve()
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


def infer_grpc(target: str, model: str, images: np.ndarray, stub: Any = None) -> np.ndarray:
    """V2 gRPC: the images as raw float32 (raw_input_contents), built with KServe's InferRequest; the logits from
    its InferResponse."""
    serving.import_kserve()
    from kserve.protocol.infer_type import InferInput, InferRequest, InferResponse

    images = _float32(images)
    tensor = InferInput(name=INPUT_NAME, shape=list(images.shape), datatype="FP32")
    tensor.set_data_from_numpy(images, binary_data=True)
    message = InferRequest(model_name=model, infer_inputs=[tensor]).to_grpc()
    reply = grpc_call((stub or grpc_stub(target)).ModelInfer, message)
    (output,) = [o for o in InferResponse.from_grpc(reply).outputs if o.name == OUTPUT_NAME]
    return output.as_numpy().astype(np.float32, copy=False)


def logits(url: str, grpc_target: str | None, model: str, images: np.ndarray) -> dict[str, np.ndarray]:
    """The batch through every protocol: {"v1": ..., "v2": ..., "grpc": ...} (gRPC only with a target, and only
    where kserve is installed)."""
    found = {"v1": predict_v1(url, model, images), "v2": infer_v2(url, model, images)}
    if grpc_target:
        found["grpc"] = infer_grpc(grpc_target, model, images)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Send one batch (a .npy of float32 images) to a Rosetta model "
                                                 "server through V1 REST, V2 REST and V2 gRPC.")
    parser.add_argument("--url", required=True, help="the server's REST base, e.g. http://127.0.0.1:8500")
    parser.add_argument("--grpc", help="its gRPC host:port, e.g. 127.0.0.1:8501 (needs kserve)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--images", type=Path, required=True, help=".npy, float32 (n, height, width)")
    parser.add_argument("--out", type=Path, required=True, help=".npz with one array of logits per protocol")
    args = parser.parse_args(argv)
    try:
        found = logits(args.url, args.grpc, args.model, np.load(args.images))
    except RequestFailed as error:
        print(f"error: {args.model}: {error}", file=sys.stderr)
        return 1
    with open(args.out, "wb") as f:
        np.savez(f, **found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
