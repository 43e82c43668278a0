"""The load client of benchmarks/serving_load.py: closed-loop V2 requests to running model servers, on loopback.

    python -m pipelines.runner validation -- python -m benchmarks.serving_load_client JOB.json RESULT.json

It runs in the validation environment, which has KServe's gRPC stubs (REST needs only the standard library).
JOB.json (written by serving_load.py) names the servers, the model, the batches, the protocols, concurrencies,
bounds, rounds and how often a bad request goes out. Round after round, for every cell (protocol, batch,
concurrency), each server in turn gets one slice: C workers, each on its own keep-alive connection, each sending its
next request as soon as its previous answer came, until the slice's count or time is used up. Every answer is
checked, and a failure counted and kept, never dropped. Only raw figures go to RESULT.json (per slice: the good
answers' latencies, the errors, the wall time, the CPU seconds of the client and of the server); serving_load.py
summarizes. The method in full: benchmarks/README.md, "serving_load.py".
"""

from __future__ import annotations

import contextlib
import http.client
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from rosetta_common import serving
from rosetta_common.onnx_conventions import INPUT_NAME, OUTPUT_NAME

TIMEOUT_SECONDS = 60.0
WARMUP_PER_WORKER = 2  # per worker and slice: opens its connection and gets the server's path warm; not counted
FIRST_WARMUP = 10  # per server and batch before any cell: JAX compiles the export per batch shape on its first call
ERROR_EXAMPLES = 5  # distinct error messages kept per slice

Check = Callable[[], None]  # one request and the check of its answer; raises on anything but a good answer


class BadAnswer(Exception):
    """An answer that is not a good one (status, output name, shape or size); str(error) says what was wrong."""


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process and all its threads (/proc/<pid>/stat), this one by default."""
    if pid is None:
        return time.process_time()
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def v2_body(images: np.ndarray) -> bytes:
    """The V2 REST request body, built as pipelines.serving.client.infer_v2 builds it (once per batch here)."""
    tensor = {"name": INPUT_NAME, "shape": list(images.shape), "datatype": "FP32", "data": images.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def check_shape(name: str, shape: list[int], values: int, expected: list[int]) -> None:
    if name != OUTPUT_NAME or shape != expected or values != expected[0] * expected[1]:
        raise BadAnswer(f"output {name!r} shape {shape} with {values} values; expected {OUTPUT_NAME!r} {expected}")


class RestWorker:
    """One keep-alive HTTP/1.1 connection to one server, sending one V2 REST body again and again."""

    def __init__(self, url: str, model: str, body: bytes, bad_body: bytes, expected: list[int]) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path, self.body, self.bad_body, self.expected = f"/v2/models/{model}/infer", body, bad_body, expected
        self.headers = {"Content-Type": "application/json"}
        self.connection: http.client.HTTPConnection | None = None

    def _post(self, body: bytes) -> tuple[int, bytes]:
        """POST `body` on the keep-alive connection: the status and the whole answer."""
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_SECONDS)
        try:
            self.connection.request("POST", self.path, body, self.headers)
            reply = self.connection.getresponse()
            return reply.status, reply.read()
        except (OSError, http.client.HTTPException):
            self.close()  # the next request opens a fresh connection
            raise

    def send(self) -> bytes:
        status, answer = self._post(self.body)
        if status != 200:
            raise BadAnswer(f"HTTP {status}: {answer[:200].decode(errors='replace')}")
        return answer

    def refused(self) -> None:
        """Send the bad request (the images one pixel narrower than they say); the protocol's error is the only
        right answer (HTTP 400), and the connection stays usable."""
        status, answer = self._post(self.bad_body)
        if status != 400:
            raise BadAnswer(f"a bad request got HTTP {status}: {answer[:200].decode(errors='replace')}; "
                            "expected 400")

    def check(self, answer: bytes) -> None:
        outputs = json.loads(answer).get("outputs") or [{}]
        if len(outputs) != 1:
            raise BadAnswer(f"{len(outputs)} outputs; expected one, {OUTPUT_NAME!r}")
        out = outputs[0]
        check_shape(out.get("name"), out.get("shape"), len(out.get("data") or ()), self.expected)

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


class GrpcWorker:
    """Its own gRPC channel to one server, sending one prebuilt ModelInferRequest again and again."""

    def __init__(self, target: str, message: Any, bad_message: Any, expected: list[int]) -> None:
        import grpc

        serving.import_kserve()
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc

        self.channel = grpc.insecure_channel(target)
        self.infer = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(self.channel).ModelInfer
        self.message, self.bad_message, self.expected = message, bad_message, expected

    def refused(self) -> None:
        """Send the bad request; the protocol's error (INVALID_ARGUMENT) is the only right answer."""
        import grpc

        try:
            self.infer(self.bad_message, timeout=TIMEOUT_SECONDS)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise BadAnswer(f"a bad request got gRPC {error.code().name}: {error.details()}; "
                                "expected INVALID_ARGUMENT") from None
            return
        raise BadAnswer("a bad request was answered; expected INVALID_ARGUMENT")

    def send(self) -> Any:
        import grpc

        try:
            return self.infer(self.message, timeout=TIMEOUT_SECONDS)
        except grpc.RpcError as error:
            raise BadAnswer(f"gRPC {error.code().name}: {error.details()}") from None

    def check(self, reply: Any) -> None:
        if len(reply.outputs) != 1:
            raise BadAnswer(f"{len(reply.outputs)} outputs; expected one, {OUTPUT_NAME!r}")
        out = reply.outputs[0]
        # The servers answer typed contents (binary_data=False); raw bytes are the protocol's other way.
        raw = reply.raw_output_contents
        values = len(raw[0]) // 4 if raw else len(out.contents.fp32_contents)
        check_shape(out.name, list(out.shape), values, self.expected)

    def close(self) -> None:
        self.channel.close()


def grpc_message(model: str, images: np.ndarray) -> Any:
    """The V2 gRPC request, built as pipelines.serving.client.infer_grpc builds it (raw float32)."""
    serving.import_kserve()
    from kserve.protocol.infer_type import InferInput, InferRequest

    tensor = InferInput(name=INPUT_NAME, shape=list(images.shape), datatype="FP32")
    tensor.set_data_from_numpy(images, binary_data=True)
    return InferRequest(model_name=model, infer_inputs=[tensor]).to_grpc()


def bad_images(images: np.ndarray) -> np.ndarray:
    """The batch one pixel narrower than the model takes: a request every server must refuse."""
    return np.ascontiguousarray(images[..., 1:])


def make_worker(protocol: str, server: dict[str, Any], model: str, images: np.ndarray, classes: int,
                bodies: dict[str, Any]) -> RestWorker | GrpcWorker:
    expected = [len(images), classes]
    if protocol == "v2-rest":
        return RestWorker(server["url"], model, bodies["v2-rest"], bodies["bad-v2-rest"], expected)
    return GrpcWorker(server["grpc"], bodies["v2-grpc"], bodies["bad-v2-grpc"], expected)


def one(worker: RestWorker | GrpcWorker) -> float:
    """One request and its check; the latency in ms (sending to the whole answer read, the check left out)."""
    started = time.perf_counter()
    answer = worker.send()
    seconds = time.perf_counter() - started
    worker.check(answer)
    return seconds * 1000.0


def run_slice(workers: list[RestWorker | GrpcWorker], max_requests: int, max_seconds: float, warmup: int,
              pid: int | None, bad_every: int = 0) -> dict[str, Any]:
    """One closed loop of len(workers) workers against one server: at most max_requests requests, started within
    max_seconds of the start (after every worker's warm-up); with `bad_every` N, every Nth request of a worker is
    the bad one, which must be refused with the protocol's error (counted apart, its latency not)."""
    latencies: list[list[float]] = [[] for _ in workers]
    refused = [0 for _ in workers]
    errors: list[list[str]] = [[] for _ in workers]
    lock, issued = threading.Lock(), [0]
    start, cpu0 = [0.0], [0.0, 0.0]

    def clock() -> None:  # run by one thread when every worker is warm, before any is released: the slice starts
        cpu0[:] = [cpu_seconds(), cpu_seconds(pid) if pid else 0.0]
        start[0] = time.perf_counter()

    ready = threading.Barrier(len(workers) + 1, action=clock)

    def ticket() -> bool:
        with lock:
            if issued[0] >= max_requests or time.perf_counter() - start[0] >= max_seconds:
                return False
            issued[0] += 1
            return True

    def loop(i: int) -> None:
        worker = workers[i]
        for _ in range(warmup):
            with contextlib.suppress(Exception):  # warm-up answers are not counted; counted ones are all checked
                one(worker)
        ready.wait()
        sent = 0
        while ticket():
            sent += 1
            try:
                if bad_every and sent % bad_every == 0:
                    worker.refused()
                    refused[i] += 1
                else:
                    latencies[i].append(one(worker))
            except Exception as error:  # every failure is an error of the slice, whatever it was
                errors[i].append(f"{type(error).__name__}: {error}"[:300])

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    ready.wait()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start[0]
    client1, server1 = cpu_seconds(), cpu_seconds(pid) if pid else 0.0
    every_error = [e for found in errors for e in found]
    return {"latencies_ms": [round(x, 4) for found in latencies for x in found], "refused": sum(refused),
            "errors": len(every_error),
            "error_examples": list(dict.fromkeys(every_error))[:ERROR_EXAMPLES], "seconds": wall,
            "client_cpu_seconds": client1 - cpu0[0], "server_cpu_seconds": server1 - cpu0[1] if pid else None}


def metadata_classes(url: str, model: str) -> int:
    """The model's number of classes from its V2 metadata (output logits [-1, classes])."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=TIMEOUT_SECONDS)
    try:
        connection.request("GET", f"/v2/models/{model}")
        reply = connection.getresponse()
        answer = json.loads(reply.read())
    finally:
        connection.close()
    (logits,) = [o for o in answer["outputs"] if o["name"] == OUTPUT_NAME]
    return int(logits["shape"][1])


def run(job: dict[str, Any]) -> dict[str, Any]:
    servers: dict[str, dict[str, Any]] = job["servers"]
    names, model = list(servers), job["model"]
    batches = {int(size): np.ascontiguousarray(np.load(path, allow_pickle=False), dtype=np.float32)
               for size, path in job["batches"].items()}
    classes = {name: metadata_classes(server["url"], model) for name, server in servers.items()}
    grpc = "v2-grpc" in job["protocols"]
    bodies = {size: {"v2-rest": v2_body(images), "v2-grpc": grpc_message(model, images) if grpc else None,
                     "bad-v2-rest": v2_body(bad_images(images)),
                     "bad-v2-grpc": grpc_message(model, bad_images(images)) if grpc else None}
              for size, images in batches.items()}
    warmup_errors: dict[str, list[str]] = {name: [] for name in names}
    for protocol in job["protocols"]:  # the first calls of each batch shape, every server: not measured
        for size, images in batches.items():
            for name in names:
                worker = make_worker(protocol, servers[name], model, images, classes[name], bodies[size])
                for _ in range(FIRST_WARMUP):
                    try:
                        one(worker)
                    except Exception as error:  # not counted, but reported: a server failing
                        warmup_errors[name].append(f"{protocol} batch {size}: {type(error).__name__}: {error}"[:300])
                worker.close()
    slices = []
    rounds, per_round = job["rounds"], max(1, job["max_requests"] // job["rounds"])
    cells = [(protocol, size, concurrency) for protocol in job["protocols"] for size in batches
             for concurrency in job["concurrency"]]
    # Every cell once a round, the rounds one after the other: each round asks the same of every server, so what
    # a server holds in the last round against the first (threads, descriptors, memory) is what requests add.
    for repeat in range(rounds):
        for cell, (protocol, size, concurrency) in enumerate(cells):
            shift = (cell + repeat) % len(names)  # who goes first moves every round (and every cell)
            for name in names[shift:] + names[:shift]:
                workers = [make_worker(protocol, servers[name], model, batches[size], classes[name], bodies[size])
                           for _ in range(concurrency)]
                try:
                    found = run_slice(workers, per_round, job["max_seconds"] / rounds, WARMUP_PER_WORKER,
                                      servers[name].get("pid"), job.get("bad_every", 0))
                finally:
                    for worker in workers:
                        worker.close()
                slices.append({"server": name, "protocol": protocol, "batch": size, "concurrency": concurrency,
                               "round": repeat, **found})
                print(f"[serving_load] {protocol} batch {size} C={concurrency} round {repeat + 1}/{rounds} {name}: "
                      f"{len(found['latencies_ms'])} ok, {found['refused']} bad refused, {found['errors']} errors "
                      f"in {found['seconds']:.2f} s", file=sys.stderr, flush=True)
    return {"classes": classes, "warmup_errors": warmup_errors, "slices": slices}


def main(argv: list[str]) -> int:
    job_path, result_path = Path(argv[0]), Path(argv[1])
    result = run(json.loads(job_path.read_text()))
    result_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
