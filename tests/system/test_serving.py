"""The four model servers on the session's tiny run, for real: rosetta_torch.serve, rosetta_tf.serve and
rosetta_jax.serve in their frameworks' environments, pipelines.serving.onnx (torch's model.onnx files under ONNX
Runtime) in the validation environment, all started once for this module by pipelines.serving.servers on free
loopback ports, and traffic to 127.0.0.1 only.

On every server and every model: the logits served through V1 REST, V2 REST and V2 gRPC are bit for bit the
in-process logits of the same export on the model's validation batch, images or the token model's int64 ids (the
framework's, recorded by train_export in native_outputs.npz for the reloaded native format; ONNX Runtime's,
computed here in the validation environment with the validate stage's own sessions). Every server also serves each
model's `<model>-init`, its framework's model of the shared canonical init weights (ONNX: init.onnx): bit for bit
what train_export's models.predict (or ONNX Runtime in process) gave, and within tolerances.forward_parity_abs of
the float64 reference forward of those weights on every server, every protocol, and so of each other. The metadata
is the same on all four; each bad request (the image model's, and the token model's: an id outside the vocabulary,
a sequence too long, a row of padding alone, a wrong datatype, an image batch, ...) gets its protocol's status and
one line naming the field, and the good request after it still succeeds; the token model takes ids of any length
up to its maximum. REST runs from this process (urllib); gRPC needs kserve's stubs, so one script in the
validation environment sends every gRPC request and writes what came back.

The token model is the tiny run's text_transformer, served beside the image models. (A second server set for a
small token model of its own, a minute of the suite, checked nothing this one does not: its trained weights were
the same in every framework, which validate's parity checks already hold the run's exports to.)
"""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines import paths
from pipelines.serving import client as serving_client
from pipelines.serving import servers as serving
from rosetta_common.data import Dataset, load_for
from rosetta_common.inputs import PAD_ID
from rosetta_common.reference import forward
from rosetta_common.serving import init_name, served_models, served_name
from rosetta_common.spec import ModelConfig, load_spec
from rosetta_common.weights import load_weights
from support import REPO, TinyRun, orchestrator_env, run_in

NATIVE_FORMAT = {"torch": "torch_export", "tf": "saved_model", "jax": "jax_export"}  # what each server serves
ONNX_FROM = serving.ONNX_FROM
LIMIT = 1024 * 1024  # the servers' body limit here: well above the validation batch, cheap to exceed
SERVERS = list(serving.SERVERS)


class Served:
    """What the module's servers serve: the run, its models (run folders) and served names, each model's batch and
    config, and the logits expected of each served name."""

    def __init__(self, run: TinyRun, servers: list[serving.Server]) -> None:
        self.run, self.servers = run, {server.name: server for server in servers}
        spec = load_spec(run.root / "params.yaml")
        self.models = list(spec.models)
        self.names = served_models(self.models)  # each model and its init twin, as served
        self.tolerance = spec.tolerances.forward_parity_abs
        cache: dict[str, Dataset] = {}
        self.configs: dict[str, ModelConfig] = {}
        self.batches: dict[str, np.ndarray] = {}  # served name -> the batch it is sent (train_export's)
        for model in self.models:
            data = load_for(model, run.root / paths.PREPARED, cache)
            self.configs[model] = data.model_config(spec, model)
            batch = data.validation_batch(spec.export.validation_batch_size)
            self.batches |= dict.fromkeys(served_models([model]), batch)
        self.expected: dict[str, dict[str, np.ndarray]] = {}
        for framework, fmt in NATIVE_FORMAT.items():
            self.expected[framework] = {}
            for model in self.models:
                with np.load(run.root / paths.native_outputs(model, framework)) as outputs:
                    self.expected[framework][served_name(model)] = outputs[paths.native_inference_keys(fmt)[0]][0]
                    # train_export's models.predict of the model built from the canonical init weights
                    self.expected[framework][init_name(model)] = outputs["init_validation_logits"]
        # The float64 reference forward of each model's canonical init weights, as validate computes it.
        self.reference = {}
        for model in self.models:
            config = self.configs[model]
            init = load_weights(run.root / paths.init_weights(model), config)
            self.reference[model] = forward(config, init, self.batches[served_name(model)])

    def first(self, kind: str) -> str | None:
        """The first model (run folder) reading `kind` (images, tokens), or None."""
        return next((m for m in self.models if self.configs[m].input.kind == kind), None)


def onnx_in_process(artifacts: Path, models: list[str], batches: dict[str, str], out: Path) -> dict[str, np.ndarray]:
    """ONNX Runtime's own logits of each served model.onnx (and init.onnx, for <model>-init) on its batch
    (`batches`: served name -> .npy), in the validation environment, as validate opens them."""
    files = {served_name(m): str(artifacts / ONNX_FROM / m / "model.onnx") for m in models}
    files |= {init_name(m): str(artifacts / ONNX_FROM / m / "init.onnx") for m in models}
    code = (
        "import numpy as np\n"
        "from pathlib import Path\n"
        "from pipelines.checks.sessions import open_session, run_onnx\n"
        f"batches = {batches!r}\n"
        f"found = {{name: run_onnx(open_session(Path(file)), np.load(batches[name])) for name, file in "
        f"{files!r}.items()}}\n"
        f"np.savez({str(out)!r}, **found)\n"
    )
    result = run_in("validation", code)
    assert result.returncode == 0, result.stderr
    with np.load(out) as found:
        return {name: found[name] for name in files}


# Every gRPC request of the module, sent from the validation environment (kserve's stubs); the good request after
# each bad one is recorded as "then_ok". The image cases go to config["image_model"], the token cases to
# config["token_model"] (each skipped where the servers serve none).
GRPC_SCRIPT = r"""
import json, os, sys
import numpy as np
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.infer_type import InferResponse
from pipelines.serving import client

config = json.loads(open(os.environ["ROSETTA_TEST_GRPC"]).read())
batches = {model: np.load(path) for model, path in config["batches"].items()}
found, results = {}, {"errors": {}, "metadata": {}, "ready": {}}

def tensor(name, datatype, shape, contents=None):
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape, contents=contents)

def request(model, inputs, raw):
    return pb.ModelInferRequest(model_name=model, inputs=inputs, raw_input_contents=raw)

def image_cases(first):
    batch = batches[first]
    n, h, w = batch.shape
    good_raw = [batch.astype("<f4").tobytes()]
    image = lambda name="images", datatype="FP32", shape=None: tensor(name, datatype, shape or [n, h, w])
    return {
        "wrong_shape": request(first, [image(shape=[n, h, w - 1])], [batch[:, :, 1:].astype("<f4").tobytes()]),
        "wrong_datatype": request(first, [image(datatype="FP64")], [batch.astype("<f8").tobytes()]),
        "missing_input": request(first, [], []),
        "wrong_name": request(first, [image(name="pixels")], good_raw),
        "out_of_range": request(first, [image()], [(batch * 255 + 1).astype("<f4").tobytes()]),
        "unknown_model": request("nope", [image()], good_raw),
        "too_large": request(first, [image(shape=[config["limit"] // 4 + 1])],
                             [bytes(4 * (config["limit"] // 4 + 1))]),
    }

def token_cases(first):
    batch = batches[first]
    vocab, longest = config["token_bounds"]["vocab_size"], config["token_bounds"]["max_length"]
    outside = batch.copy()
    outside[0, 0] = vocab
    padding = batch.copy()
    padding[-1] = 0
    ids = lambda array: [np.ascontiguousarray(array, "<i8").tobytes()]
    token = lambda array, name="tokens", datatype="INT64": tensor(name, datatype, list(array.shape))
    too_long = np.ones((1, longest + 1), np.int64)
    contents = pb.InferTensorContents(int64_contents=batch.ravel().tolist())
    return {
        "token_out_of_vocabulary": request(first, [token(outside)], ids(outside)),
        "token_too_long": request(first, [token(too_long)], ids(too_long)),
        "token_all_padding": request(first, [token(padding)], ids(padding)),
        "token_wrong_datatype": request(first, [token(batch, datatype="FP32")], [batch.astype("<f4").tobytes()]),
        "token_wrong_name": request(first, [token(batch, name="images")], ids(batch)),
        "token_raw_not_int64": request(first, [token(batch)], [batch.astype("<i4").tobytes()]),
        # good: the ids as typed int64_contents rather than raw bytes
        "token_int64_contents": request(first, [tensor("tokens", "INT64", list(batch.shape), contents)], []),
    }

for server, target in config["targets"].items():
    stub = client.grpc_stub(target)
    results["ready"][server] = {
        "server": stub.ServerReady(pb.ServerReadyRequest()).ready,
        "models": {m: stub.ModelReady(pb.ModelReadyRequest(name=m)).ready for m in config["models"]}}
    for model in config["models"]:
        found[f"{server}/{model}"] = client.infer_grpc(target, model, batches[model], stub)
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=model))
        results["metadata"].setdefault(server, {})[model] = {
            "name": meta.name, "platform": meta.platform,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs]}
    cases = {}
    for key, make in (("image_model", image_cases), ("token_model", token_cases)):
        if config[key]:
            cases |= {case: (config[key], message) for case, message in make(config[key]).items()}
    for case, (model, message) in cases.items():
        try:
            reply = client.grpc_call(stub.ModelInfer, message)
            answer = InferResponse.from_grpc(reply).outputs[0].as_numpy()
            outcome = {"code": "OK", "message": "", "same": bool(np.array_equal(answer, found[f"{server}/{model}"]))}
        except client.RequestFailed as error:
            outcome = {"code": error.status, "message": error.message}
        then = client.infer_grpc(target, model, batches[model], stub)
        outcome["then_ok"] = bool(np.array_equal(then, found[f"{server}/{model}"]))
        results["errors"].setdefault(server, {})[case] = outcome
np.savez(config["logits"], **found)
open(config["results"], "w").write(json.dumps(results))
"""


def send_grpc(work: Path, targets: dict[str, str], names: list[str], batches: dict[str, np.ndarray],
              image_model: str | None, token_model: str | None, token_config: ModelConfig | None) -> dict[str, Any]:
    """GRPC_SCRIPT on these servers and served names (each with its batch); what came back, logits included."""
    files = {}
    for name in names:
        files[name] = str(work / f"{name}.npy")
        np.save(files[name], batches[name])
    bounds = None if token_config is None else {"vocab_size": token_config.vocab_size,
                                                "max_length": token_config.max_length}
    config = {"targets": targets, "models": names, "batches": files, "limit": LIMIT,
              "logits": str(work / "logits.npz"), "results": str(work / "results.json"),
              "image_model": image_model, "token_model": token_model, "token_bounds": bounds}
    (work / "config.json").write_text(json.dumps(config))
    result = run_in("validation", GRPC_SCRIPT, ROSETTA_TEST_GRPC=str(work / "config.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((work / "results.json").read_text())
    with np.load(work / "logits.npz") as logits:
        results["logits"] = {key: logits[key] for key in logits.files}
    results["batches"] = files
    return results


@pytest.fixture(scope="module")
def served(tiny_pipeline: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> Any:
    models = load_spec(tiny_pipeline.root / "params.yaml").models
    servers = serving.start(SERVERS, tiny_pipeline.root / "artifacts", models, max_body_bytes=LIMIT,
                            log_dir=tmp_path_factory.mktemp("serving-logs"))
    try:
        serving.wait_ready(servers, models)
        yield Served(tiny_pipeline, servers)
    finally:
        serving.stop(servers)


@pytest.fixture(scope="module")
def grpc_results(served: Served, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("grpc")
    image, token = served.first("images"), served.first("tokens")
    results = send_grpc(work, {name: s.grpc_target for name, s in served.servers.items()}, served.names,
                        served.batches, image and served_name(image), token and served_name(token),
                        token and served.configs[token])
    results["onnx_in_process"] = onnx_in_process(served.run.root / "artifacts", served.models, results["batches"],
                                                 work / "ort.npz")
    return results


def expected_logits(served: Served, grpc_results: dict[str, Any], server: str, model: str) -> np.ndarray:
    if server == "onnx":
        return grpc_results["onnx_in_process"][model]
    return served.expected[server][model]


@pytest.mark.parametrize("server", SERVERS)
def test_every_protocol_serves_the_in_process_logits_bit_for_bit(served: Served, grpc_results: dict[str, Any],
                                                                 server: str) -> None:
    """The same export, the same batch, the same threads and pins: V1, V2 REST and V2 gRPC give exactly the
    logits the framework (or ONNX Runtime) computes in process; JSON and raw float32 carry every bit."""
    url = served.servers[server].url
    assert grpc_results["ready"][server] == {"server": True, "models": dict.fromkeys(served.names, True)}
    for model in served.names:
        expected = expected_logits(served, grpc_results, server, model)
        batch = served.batches[model]
        found = {"v1": serving_client.predict_v1(url, model, batch),
                 "v2": serving_client.infer_v2(url, model, batch),
                 "grpc": grpc_results["logits"][f"{server}/{model}"]}
        for protocol, logits in found.items():
            assert logits.dtype == np.float32 and logits.shape == expected.shape, (server, model, protocol)
            assert np.array_equal(logits, expected), (
                f"{server} {model} {protocol}: max abs {np.abs(logits - expected).max():.3g}")


def test_every_server_serves_the_init_model_within_tolerance_of_the_reference(served: Served,
                                                                             grpc_results: dict[str, Any]) -> None:
    """<model>-init, the same canonical init weights on every server: through every protocol each answer is within
    tolerances.forward_parity_abs of the float64 reference forward of those weights (absolute, as validate holds
    init.onnx), and every pair of servers within the same tolerance of each other."""
    for model in served.models:
        answers = {}
        for server in SERVERS:
            url, name = served.servers[server].url, init_name(model)
            answers[server] = {"v1": serving_client.predict_v1(url, name, served.batches[name]),
                               "v2": serving_client.infer_v2(url, name, served.batches[name]),
                               "grpc": grpc_results["logits"][f"{server}/{name}"]}
            for protocol, logits in answers[server].items():
                worst = float(np.abs(logits.astype(np.float64) - served.reference[model]).max())
                assert worst <= served.tolerance, f"{server} {name} {protocol}: {worst:.3g} from the reference"
        for a, b in itertools.combinations(SERVERS, 2):
            for protocol in answers[a]:
                worst = float(np.abs(answers[a][protocol] - answers[b][protocol]).max())
                assert worst <= served.tolerance, f"{a}|{b} {init_name(model)} {protocol}: {worst:.3g}"


def expected_metadata(name: str, config: ModelConfig) -> dict[str, Any]:
    """A served name's V2 metadata: the ONNX conventions' names, the batch as -1, an image model's FP32 image
    shape or the token model's INT64 [-1, -1] (length variable too), the class count."""
    if config.input.kind == "tokens":
        inputs = [{"name": "tokens", "datatype": "INT64", "shape": [-1, -1]}]
    else:
        inputs = [{"name": "images", "datatype": "FP32", "shape": [-1, *config.input.shape]}]
    return {"name": name, "platform": "", "inputs": inputs,
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, config.num_classes]}]}


def test_the_metadata_is_the_same_on_every_server(served: Served, grpc_results: dict[str, Any]) -> None:
    """V2 model metadata over REST and gRPC, identical across the four: the ONNX conventions' names, the batch as
    -1, the image shape (or the token model's INT64 ids of any length) and class count of the run."""
    for model in served.models:
        for name in served_models([model]):  # <model>-init: <model>'s metadata but for the name
            expected = expected_metadata(name, served.configs[model])
            for server in SERVERS:
                rest = serving_client.metadata(served.servers[server].url, name)
                rest.pop("versions", None)  # KServe's optional, empty field
                assert rest == expected, (server, name)
                assert grpc_results["metadata"][server][name] == expected, (server, name)
    assert "text_transformer" not in served.names  # served as a DNS-1123 label


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, str]:
    call = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(call, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["error"]


def v1(batch: Any) -> bytes:
    return json.dumps({"instances": batch}).encode()


def v2(data: Any, shape: list[int], datatype: str = "FP32", name: str = "images") -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]}).encode()


def rest_cases(batch: np.ndarray, model: str) -> dict[str, tuple[str, bytes, int, str]]:
    """An image model's bad REST requests: case -> (path, body, status, what the one line must say)."""
    n, h, w = batch.shape
    flat = batch.ravel().tolist()
    pad = b" " * LIMIT
    return {
        "v1_wrong_shape": (f"/v1/models/{model}:predict", v1(batch[:, :, 1:].tolist()), 400,
                           f"instances: shape [{n}, {h}, {w - 1}] is not allowed"),
        "v1_wrong_datatype": (f"/v1/models/{model}:predict", v1([[["0.5"] * w] * h]), 400, "instances: holds strings"),
        "v1_missing_input": (f"/v1/models/{model}:predict", json.dumps({"images": batch.tolist()}).encode(), 400,
                             "instances: missing"),
        "v1_out_of_range": (f"/v1/models/{model}:predict", v1((batch * 255 + 1).tolist()), 400,
                            "instances: values from"),
        "v1_unknown_model": ("/v1/models/nope:predict", v1(batch.tolist()), 404, "model 'nope': not served here"),
        "v1_too_large": (f"/v1/models/{model}:predict", v1(batch.tolist())[:-1] + b',"pad":"' + pad + b'"}', 413,
                         f"allowed: at most {LIMIT} bytes"),
        "v1_not_json": (f"/v1/models/{model}:predict", b"instances=1", 400, "body: not JSON"),
        "v2_wrong_shape": (f"/v2/models/{model}/infer", v2(flat[: n * h * (w - 1)], [n, h, w - 1]), 400,
                           f"inputs[0].shape: [{n}, {h}, {w - 1}] is not allowed"),
        "v2_wrong_datatype": (f"/v2/models/{model}/infer", v2(flat, [n, h, w], "INT32"), 400,
                              "inputs[0].datatype: 'INT32' is not allowed; allowed: 'FP32'"),
        "v2_short_data": (f"/v2/models/{model}/infer", v2(flat[:-1], [n, h, w]), 400,
                          f"inputs[0].data: {n * h * w - 1} values do not fill shape"),
        "v2_missing_input": (f"/v2/models/{model}/infer", json.dumps({"inputs": []}).encode(), 400,
                             "inputs: no input named 'images' (got [])"),
        "v2_wrong_name": (f"/v2/models/{model}/infer", v2(flat, [n, h, w], name="pixels"), 400,
                          "inputs: no input named 'images' (got ['pixels'])"),
        "v2_unknown_model": ("/v2/models/nope/infer", v2(flat, [n, h, w]), 404, "model 'nope': not served here"),
        "v2_too_large": (f"/v2/models/{model}/infer", v2(flat, [n, h, w])[:-1] + b',"pad":"' + pad + b'"}', 413,
                         f"allowed: at most {LIMIT} bytes"),
        "v2_not_json": (f"/v2/models/{model}/infer", b"{not json", 400, "body"),
        "v2_not_a_request": (f"/v2/models/{model}/infer", json.dumps({"instances": []}).encode(), 400,
                             "body.inputs: Field required"),
    }


def token_rest_cases(batch: np.ndarray, model: str, config: ModelConfig) -> dict[str, tuple[str, bytes, int, str]]:
    """The token model's bad REST requests, each refused as InputSpec.check refuses it: case -> (path, body, status,
    what the one line must say)."""
    vocab, longest = int(config.vocab_size), int(config.max_length)
    n, length = batch.shape
    outside, negative, padding = batch.copy(), batch.copy(), batch.copy()
    outside[0, 0], negative[-1, 0], padding[-1] = vocab, -1, PAD_ID
    too_long = np.ones((1, longest + 1), np.int64)
    v1_path, v2_path = f"/v1/models/{model}:predict", f"/v2/models/{model}/infer"

    def ints(array: np.ndarray, datatype: str = "INT64", name: str = "tokens") -> bytes:
        return v2(array.ravel().tolist(), list(array.shape), datatype, name)

    return {
        "v1_token_out_of_vocabulary": (v1_path, v1(outside.tolist()), 400,
                                       f"instances: token id {vocab} outside the vocabulary 0..{vocab - 1}"),
        "v1_token_negative": (v1_path, v1(negative.tolist()), 400, "instances: token id -1 outside the vocabulary"),
        "v1_token_too_long": (v1_path, v1(too_long.tolist()), 400, f"instances: sequence length {longest + 1}, "
                              f"longer than the model's maximum {longest}"),
        "v1_token_all_padding": (v1_path, v1(padding.tolist()), 400, f"instances: row {n - 1} is all padding"),
        "v1_token_floats": (v1_path, v1((batch + 0.5).tolist()), 400,
                            "instances: holds numbers that are not integers"),
        "v1_token_ragged": (v1_path, v1([batch[0].tolist(), batch[1, :-1].tolist()]), 400,
                            "instances: nested lists of unequal lengths"),
        "v1_token_one_row_flat": (v1_path, v1(batch[0].tolist()), 400,
                                  f"instances: shape [{length}] is not allowed; allowed: one INT64 input 'tokens'"),
        "v2_token_wrong_datatype": (v2_path, ints(batch.astype(np.float32), "FP32"), 400,
                                    "inputs[0].datatype: 'FP32' is not allowed; allowed: 'INT64'"),
        "v2_token_out_of_vocabulary": (v2_path, ints(outside), 400,
                                       f"inputs[0].data: token id {vocab} outside the vocabulary 0..{vocab - 1}"),
        "v2_token_too_long": (v2_path, ints(too_long), 400, f"inputs[0].data: sequence length {longest + 1}"),
        "v2_token_all_padding": (v2_path, ints(padding), 400, f"inputs[0].data: row {n - 1} is all padding"),
        "v2_token_floats": (v2_path, v2((batch + 0.5).ravel().tolist(), [n, length], "INT64", "tokens"), 400,
                            "inputs[0].data: holds numbers that are not integers"),
        "v2_token_wrong_name": (v2_path, ints(batch, name="images"), 400,
                                "inputs: no input named 'tokens' (got ['images'])"),
        "v2_token_short_data": (v2_path, v2(batch.ravel().tolist()[:-1], [n, length], "INT64", "tokens"), 400,
                                f"inputs[0].data: {n * length - 1} values do not fill shape [{n}, {length}]"),
        "v2_token_wrong_shape": (v2_path, v2(batch.ravel().tolist(), [n * length], "INT64", "tokens"), 400,
                                 f"inputs[0].shape: [{n * length}] is not allowed"),
    }


def refused_then_served(url: str, model: str, batch: np.ndarray, expected: np.ndarray,
                        cases: dict[str, tuple[str, bytes, int, str]], where: str) -> None:
    """Each case gets its status and one line saying what it must; the good request right after each still
    succeeds with the same logits (the server keeps serving)."""
    for case, (path, body, status, says) in cases.items():
        # The V1 body that is not JSON goes as a form, as curl -d sends it; the rest as JSON.
        found, line = post(url + path, body, "application/x-www-form-urlencoded" if case == "v1_not_json"
                           else "application/json")
        assert (found, "\n" in line) == (status, False), (where, case, found, line)
        assert says in line, (where, case, line)
        assert np.array_equal(serving_client.infer_v2(url, model, batch), expected), (where, case)


@pytest.mark.parametrize("server", SERVERS)
def test_bad_rest_requests_get_their_status_and_one_line(served: Served, grpc_results: dict[str, Any],
                                                         server: str) -> None:
    url, model = served.servers[server].url, served_name(served.first("images"))
    expected = expected_logits(served, grpc_results, server, model)
    refused_then_served(url, model, served.batches[model], expected, rest_cases(served.batches[model], model),
                        server)
    status, line = post(url + f"/v1/models/{model}:predict", b"{not json")  # JSON content type, not JSON
    assert status == 400 and line.startswith("body: not JSON"), (server, line)
    with pytest.raises(serving_client.RequestFailed) as refused:
        serving_client.metadata(url, "nope")
    assert refused.value.status == 404 and "allowed: " + ", ".join(served.names) in refused.value.message


@pytest.mark.parametrize("server", SERVERS)
def test_bad_token_rest_requests_get_their_status_and_one_line(served: Served, grpc_results: dict[str, Any],
                                                               server: str) -> None:
    token = served.first("tokens")
    if token is None:
        pytest.skip("the run serves no token model")
    url, model = served.servers[server].url, served_name(token)
    expected = expected_logits(served, grpc_results, server, model)
    refused_then_served(url, model, served.batches[model], expected,
                        token_rest_cases(served.batches[model], model, served.configs[token]), server)
    status, line = post(url + f"/v1/models/{token}:predict", v1(served.batches[model].tolist()))
    assert status == 404 and f"model {token!r}: not served here" in line, (server, line)  # its served name only


IMAGE_GRPC_CASES = {
    "wrong_shape": ("INVALID_ARGUMENT", "inputs[0].shape: "),
    "wrong_datatype": ("INVALID_ARGUMENT", "inputs[0].datatype: 'FP64' is not allowed"),
    "missing_input": ("INVALID_ARGUMENT", "inputs: no input named 'images' (got [])"),
    "wrong_name": ("INVALID_ARGUMENT", "inputs: no input named 'images' (got ['pixels'])"),
    "out_of_range": ("INVALID_ARGUMENT", "inputs[0].data: values from"),
    "unknown_model": ("NOT_FOUND", "model 'nope': not served here"),
    "too_large": ("RESOURCE_EXHAUSTED", "larger than max"),  # gRPC's own limit, set to the same size
}


def token_grpc_cases(config: ModelConfig) -> dict[str, tuple[str, str]]:
    vocab, longest = int(config.vocab_size), int(config.max_length)
    return {
        "token_out_of_vocabulary": ("INVALID_ARGUMENT", f"inputs[0].data: token id {vocab} outside the vocabulary "
                                                        f"0..{vocab - 1}"),
        "token_too_long": ("INVALID_ARGUMENT", f"inputs[0].data: sequence length {longest + 1}, longer than the "
                                               f"model's maximum {longest}"),
        "token_all_padding": ("INVALID_ARGUMENT", "is all padding (id 0); every row needs at least one token"),
        "token_wrong_datatype": ("INVALID_ARGUMENT", "inputs[0].datatype: 'FP32' is not allowed; allowed: 'INT64'"),
        "token_wrong_name": ("INVALID_ARGUMENT", "inputs: no input named 'tokens' (got ['images'])"),
        # int32 bytes: half as many values, or a byte count no int64 fills
        "token_raw_not_int64": ("INVALID_ARGUMENT", "inputs[0].data: "),
    }


def check_grpc_outcomes(errors: dict[str, Any], expected: dict[str, tuple[str, str]], where: str) -> None:
    for case, (code, says) in expected.items():
        outcome = errors[case]
        assert (outcome["code"], "\n" in outcome["message"]) == (code, False), (where, case, outcome)
        assert says in outcome["message"], (where, case, outcome)
        assert outcome["then_ok"], (where, case)


@pytest.mark.parametrize("server", SERVERS)
def test_bad_grpc_requests_get_their_status_and_one_line(served: Served, grpc_results: dict[str, Any],
                                                         server: str) -> None:
    errors = grpc_results["errors"][server]
    check_grpc_outcomes(errors, IMAGE_GRPC_CASES, server)
    token = served.first("tokens")
    if token is not None:
        check_grpc_outcomes(errors, token_grpc_cases(served.configs[token]), server)
        # int64_contents (typed, not raw) is as good as raw bytes: the same answer
        assert errors["token_int64_contents"] == {"code": "OK", "message": "", "same": True, "then_ok": True}


@pytest.mark.parametrize("server", SERVERS)
def test_the_token_model_takes_any_length_and_refuses_an_image_batch(served: Served, grpc_results: dict[str, Any],
                                                                     server: str) -> None:
    """The token model's ids may be of any length up to max_length: a batch of length 1 and one of max_length are
    served; an image batch sent to it is refused in one line naming the input it lacks, and the good request
    after it still gets the in-process logits."""
    token = served.first("tokens")
    if token is None:
        pytest.skip("the run serves no token model")
    url, model, config = served.servers[server].url, served_name(token), served.configs[token]
    for length in (1, int(config.max_length)):
        tokens = np.ones((2, length), np.int64)
        assert serving_client.infer_v2(url, model, tokens).shape == (2, config.num_classes), (server, length)
    with pytest.raises(serving_client.RequestFailed) as refused:
        serving_client.infer_v2(url, model, np.zeros((1, 8, 8), np.float32))
    assert refused.value.status == 400 and "inputs: no input named 'tokens' (got ['images'])" in refused.value.message
    expected = expected_logits(served, grpc_results, server, model)
    assert np.array_equal(serving_client.predict_v1(url, model, served.batches[model]), expected), server


def launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipelines.serving", *args], cwd=REPO, env=orchestrator_env(),
                          capture_output=True, text=True, check=False)


def test_a_server_that_cannot_start_is_one_error_line(tmp_path: Path) -> None:
    """The ONNX server (the quickest to start) on a model.onnx that is not one: it exits, and the launcher says
    which server, how it ended and why, in one line."""
    (tmp_path / ONNX_FROM / "mlp").mkdir(parents=True)
    (tmp_path / ONNX_FROM / "mlp" / "model.onnx").write_bytes(b"not an onnx model")
    (tmp_path / "init").mkdir()
    (tmp_path / "init" / "mlp.safetensors").write_bytes(b"")  # as --init requires; the ONNX server reads init.onnx
    result = launch("onnx", "--artifacts", str(tmp_path), "--timeout", "60", "--logs", str(tmp_path / "logs"))
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert errors[0].startswith("error: the onnx server (pid ") and "exited with code 1 before it was ready; its " \
        "last line: 'error: " in errors[0], errors[0]
    assert "mlp/model.onnx: not a valid ONNX model" in errors[0] and str(tmp_path / "logs" / "onnx.log") in errors[0]


def test_a_missing_init_file_is_one_error_line_before_any_model_loads(tmp_path: Path) -> None:
    """A server serves every model's init twin, so an --init folder without a model's canonical weights is one line
    naming the file, before anything is loaded (model.onnx here is not one: it is never opened)."""
    (tmp_path / ONNX_FROM / "mlp").mkdir(parents=True)
    (tmp_path / ONNX_FROM / "mlp" / "model.onnx").write_bytes(b"not an onnx model")
    (tmp_path / "init").mkdir()
    result = launch("onnx", "--artifacts", str(tmp_path), "--timeout", "60", "--logs", str(tmp_path / "logs"))
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert f"--init {tmp_path / 'init'}: {tmp_path / 'init' / 'mlp.safetensors'} is missing" in errors[0], errors[0]
    assert "not a valid ONNX model" not in errors[0], errors[0]


def test_a_port_in_use_is_one_error_line_before_anything_starts(tiny_pipeline: TinyRun, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((serving.HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = launch("onnx", "--artifacts", str(tiny_pipeline.root / "artifacts"), "--port",
                        str(port - 2 * SERVERS.index("onnx")), "--logs", str(tmp_path))
    assert result.returncode == 1 and result.stderr.count("error:") == 1, result.stderr
    assert f"the onnx server's port {port} on 127.0.0.1 cannot be bound" in result.stderr, result.stderr


def test_a_server_that_dies_is_one_error_line(tiny_pipeline: TinyRun, tmp_path: Path) -> None:
    servers = serving.start(["onnx"], tiny_pipeline.root / "artifacts", log_dir=tmp_path)
    try:
        serving.wait_ready(servers)
        servers[0].process.kill()
        with pytest.raises(serving.ServingError) as died:
            serving.watch(servers)
        assert "the onnx server (pid" in str(died.value) and "was killed by SIGKILL while serving" in str(died.value)
        assert "\n" not in str(died.value)
    finally:
        serving.stop(servers)


def test_every_server_stops_cleanly_on_sigterm(served: Served) -> None:
    """Last: SIGTERM, and each server closes its REST and gRPC servers and exits 0 (the module's fixture then has
    nothing left to stop)."""
    codes = serving.stop(list(served.servers.values()))
    assert codes == dict.fromkeys(SERVERS, 0), codes
    for server in served.servers.values():
        assert "stopped: " + server.name in server.log.read_text(), server.log.read_text()[-2000:]
