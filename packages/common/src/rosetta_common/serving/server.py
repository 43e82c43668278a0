"""KServe's ModelServer as every Rosetta model server runs it, the served model, and the entry point.

Each server process is KServe's `ModelServer`: V1 (TF Serving's REST shape, `POST /v1/models/<m>:predict`) and V2
(the Open Inference Protocol) over REST, V2 over gRPC. KServe's own REST and gRPC servers, handlers, error types
and status codes, subclassed only where Rosetta asks for more: both bind 127.0.0.1 unless told (KServe binds every
interface); a REST body or gRPC message above the size limit is refused (413 / RESOURCE_EXHAUSTED); a request its
protocol does not take is 400 / INVALID_ARGUMENT with one line naming the field (FastAPI's default for a V2 body
is 422 with a list of errors); an unknown model's 404 / NOT_FOUND names the models served. The server keeps
serving after each. Only server processes import this module: it imports kserve at its top (through
`import_kserve`, which keeps kserve from parsing the server's own command line).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import numpy as np

from rosetta_common.serving import import_kserve

kserve = import_kserve()

from fastapi.exceptions import RequestValidationError  # noqa: E402  (after import_kserve, as every kserve import)
from fastapi.responses import JSONResponse  # noqa: E402
from grpc import aio  # noqa: E402
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER  # noqa: E402
from kserve.errors import InvalidInput, ModelNotFound  # noqa: E402
from kserve.model_server import app  # noqa: E402
from kserve.protocol.dataplane import DataPlane  # noqa: E402
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc  # noqa: E402
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor, LoggingInterceptor  # noqa: E402
from kserve.protocol.grpc.server import GRPCServer  # noqa: E402
from kserve.protocol.grpc.servicer import InferenceServicer  # noqa: E402
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse  # noqa: E402
from kserve.protocol.rest.server import RESTServer  # noqa: E402
from kserve.utils.utils import generate_uuid  # noqa: E402
from orjson import JSONDecodeError  # noqa: E402

from rosetta_common.errors import InputError, RosettaError, one_line  # noqa: E402
from rosetta_common.interface import Predict  # noqa: E402
from rosetta_common.onnx_conventions import OUTPUT_NAME  # noqa: E402
from rosetta_common.serving.cli import HOST, find_models, parse_args  # noqa: E402
from rosetta_common.serving.init_twins import init_file, init_forward  # noqa: E402
from rosetta_common.serving.names import init_name, served_models, served_name  # noqa: E402
from rosetta_common.serving.requests import (  # noqa: E402
    DATATYPE,
    V2_EXAMPLE,
    AnySignature,
    RequestError,
    Signature,
    check_logits,
)
from rosetta_common.spec import ModelConfig  # noqa: E402

GRACE_SECONDS = 5  # how long a stopping server lets requests in flight finish
GRPC_WORKERS = 4


class ServedModel(kserve.Model):
    """A served model: a `kserve.Model` that answers V1 and V2 requests (REST and gRPC alike) and the metadata.
    A subclass's `load` sets `signature` (Signature.of its config: images or tokens), `forward` (the export's
    predict: the checked inputs in, logits out) and `ready`. Its `name` is the served name `main` gives it."""

    name: str
    signature: AnySignature
    forward: Predict

    def validate(self, payload: Any) -> Any:
        """kserve.Model checks `instances` and `inputs` with messages that name no value; predict checks all."""
        return payload

    def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        """Run the model on a V1 payload (-> {"predictions": ...}) or a V2 InferRequest (-> InferResponse)."""
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


class NativeModel(ServedModel):
    """<model>: a run folder's native export, loaded once. A framework's server subclasses it with how its export
    is loaded (`load_export`: its load_native's predict of SERVED_FORMAT) and where the run's config is
    (`run_config`). The export is loaded first, so a missing or damaged file is named by the framework's loader."""

    def __init__(self, name: str, run_dir: Path) -> None:
        super().__init__(name)
        self.run_dir = run_dir

    def load_export(self) -> Predict:
        raise NotImplementedError

    def run_config(self) -> ModelConfig:
        raise NotImplementedError

    def load(self) -> bool:
        self.forward = self.load_export()
        self.signature = Signature.of(self.run_config())
        self.ready = True
        return self.ready


class InitModel(ServedModel):
    """<model>-init: a framework's model of the canonical init weights at `init_file`, built by `build` (its
    models.build, inference mode, as train_export builds it) and run by `predict` (its models.predict), described
    by the run's config (`run_config(run_dir)`). Loaded after the run's <model> (main's order)."""

    def __init__(self, name: str, run_dir: Path, init_file: Path, *, run_config: Callable[[Path], ModelConfig],
                 build: Callable[[ModelConfig, Any], Any], predict: Callable[[Any, np.ndarray], np.ndarray]) -> None:
        super().__init__(name)
        self.run_dir, self.init_file = run_dir, init_file
        self._run_config, self._build, self._predict = run_config, build, predict

    def load(self) -> bool:
        config = self._run_config(self.run_dir)
        self.signature = Signature.of(config)
        self.forward = init_forward(self._build, self._predict, config, self.init_file)
        self.ready = True
        return self.ready


# --- KServe's ModelServer, on loopback, with a body size limit ----------------------------------------------------


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
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, InvalidInput | ModelNotFound):
            record.msg, record.args, record.exc_info = f"refused: {error}", (), None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


class RosettaDataPlane(DataPlane):
    """KServe's data plane, with an unknown model's 404 / NOT_FOUND naming the models served and a body that is
    not what its protocol takes refused with one line naming the field."""

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
    """KServe's REST server bound to `host`, with the body size limit and one-line 400s for V2 bodies."""

    def __init__(self, *args: Any, max_body_bytes: int, host: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config.host = host  # the uvicorn.Config its server holds: bound at start
        self.max_body_bytes = max_body_bytes

    @property
    def started(self) -> bool:
        return bool(self._server.started)

    def create_application(self) -> None:
        super().create_application()
        app.add_exception_handler(RequestValidationError, invalid_request)
        app.add_middleware(BodyLimit, limit=self.max_body_bytes)  # added last: outermost, sees bodies first


class LoopbackGRPCServer(GRPCServer):
    """GRPCServer.start as KServe writes it, bound to `host` (HOST unless told) instead of every interface
    ([::])."""

    started = False
    host = HOST

    async def start(self, max_workers: int) -> None:
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
    """KServe's ModelServer with one REST process and a gRPC server, both on `host`, the data plane above, and
    one line on stdout once both accept connections."""

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


def serve(models: Sequence[Any], http_port: int, grpc_port: int, max_body_bytes: int, ready_line: str,
          host: str = HOST) -> None:
    """Serve loaded models until SIGTERM or SIGINT: V1 and V2 REST on host:http_port, V2 gRPC on host:grpc_port
    (host: 127.0.0.1 unless told); `ready_line` goes to stdout once both accept connections."""
    server = LoopbackModelServer(http_port, grpc_port, max_body_bytes, ready_line, host)
    logging.getLogger("kserve").addFilter(_ClientErrorsInOneLine())
    # KServe's timing middleware logs two lines per request; uvicorn's access log already has one.
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)
    server.start(list(models))


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
