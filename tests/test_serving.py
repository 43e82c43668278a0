"""The four model servers on the session's tiny run, for real: rosetta_torch.serve, rosetta_tf.serve and
rosetta_jax.serve in their frameworks' environments, pipelines.serve_onnx (torch's model.onnx files under ONNX
Runtime) in the validation environment, all started once for this module by pipelines.serving on free loopback
ports, and traffic to 127.0.0.1 only.

On every server and every model: the logits served through V1 REST, V2 REST and V2 gRPC are bit for bit the
in-process logits of the same export on the validation batch (the framework's, recorded by train_export in
native_outputs.npz for the reloaded native format; ONNX Runtime's, computed here in the validation environment
with the validate stage's own sessions). Every server also serves each model's `<model>-init`, its framework's
model of the shared canonical init weights (ONNX: init.onnx): bit for bit what train_export's models.predict (or
ONNX Runtime in process) gave, and within tolerances.forward_parity_abs of the float64 reference forward of those
weights on every server, every protocol, and so of each other. The metadata is the same on all four; each bad
request gets its
protocol's status and one line naming the field, and the good request after it still succeeds. REST runs from
this process (urllib); gRPC needs kserve's stubs, so one script in the validation environment sends every gRPC
request and writes what came back."""

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

from pipelines import paths, serving, serving_client
from rosetta_common.data import load_prepared
from rosetta_common.reference import forward
from rosetta_common.serving import init_name, served_models
from rosetta_common.spec import ModelConfig, load_spec
from rosetta_common.weights import load_weights
from support import REPO, TinyRun, orchestrator_env, run_in

NATIVE_FORMAT = {"torch": "torch_export", "tf": "saved_model", "jax": "jax_export"}  # what each server serves
ONNX_FROM = serving.ONNX_FROM
LIMIT = 1024 * 1024  # the servers' body limit here: well above the validation batch, cheap to exceed
SERVERS = list(serving.SERVERS)


class Served:
    """What the module's servers serve: the run, its models, the batch and the logits expected of each."""

    def __init__(self, run: TinyRun, servers: list[serving.Server]) -> None:
        self.run, self.servers = run, {server.name: server for server in servers}
        spec = load_spec(run.root / "params.yaml")
        self.models = list(spec.models)
        self.names = served_models(self.models)  # each model and its init twin
        self.tolerance = spec.tolerances.forward_parity_abs
        data = load_prepared(run.root / paths.PREPARED)
        self.batch = data.validation_batch(spec.export.validation_batch_size)
        self.expected: dict[str, dict[str, np.ndarray]] = {}
        for framework, fmt in NATIVE_FORMAT.items():
            self.expected[framework] = {}
            for model in self.models:
                with np.load(run.root / paths.native_outputs(model, framework)) as outputs:
                    self.expected[framework][model] = outputs[paths.native_inference_keys(fmt)[0]][0]
                    # train_export's models.predict of the model built from the canonical init weights
                    self.expected[framework][init_name(model)] = outputs["init_validation_logits"]
        # The float64 reference forward of each model's canonical init weights, as validate computes it.
        self.reference = {}
        for model in self.models:
            config = ModelConfig.of(spec, model, data.image_shape, data.num_classes)
            init = load_weights(run.root / paths.init_weights(model), config)
            self.reference[model] = forward(config, init, self.batch)


def onnx_in_process(run: TinyRun, models: list[str], batch: Path, out: Path) -> dict[str, np.ndarray]:
    """ONNX Runtime's own logits of each served model.onnx (and init.onnx, for <model>-init), in the validation
    environment, as validate opens them."""
    files = {name: str(run.root / paths.onnx_model(m, ONNX_FROM)) for m in models for name in [m]}
    files |= {init_name(m): str(run.root / paths.init_onnx(m, ONNX_FROM)) for m in models}
    code = (
        "import numpy as np\n"
        "from pathlib import Path\n"
        "from pipelines.checks.sessions import open_session, run_onnx\n"
        f"batch = np.load({str(batch)!r})\n"
        f"found = {{name: run_onnx(open_session(Path(file)), batch) for name, file in {files!r}.items()}}\n"
        f"np.savez({str(out)!r}, **found)\n"
    )
    result = run_in("validation", code)
    assert result.returncode == 0, result.stderr
    with np.load(out) as found:
        return {name: found[name] for name in files}


# Every gRPC request of the module, sent from the validation environment (kserve's stubs); the good request after
# each bad one is recorded as "then_ok".
GRPC_SCRIPT = r"""
import json, os, sys
import numpy as np
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from pipelines import serving_client as client

config = json.loads(open(os.environ["ROSETTA_TEST_GRPC"]).read())
batch = np.load(config["batch"])
n, h, w = batch.shape
found, results = {}, {"errors": {}, "metadata": {}, "ready": {}}

def tensor(name="images", datatype="FP32", shape=None):
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape or [n, h, w])

def request(model, inputs, raw):
    return pb.ModelInferRequest(model_name=model, inputs=inputs, raw_input_contents=raw)

good_raw = [batch.astype("<f4").tobytes()]
for server, target in config["targets"].items():
    stub = client.grpc_stub(target)
    first = config["models"][0]
    results["ready"][server] = {
        "server": stub.ServerReady(pb.ServerReadyRequest()).ready,
        "models": {m: stub.ModelReady(pb.ModelReadyRequest(name=m)).ready for m in config["models"]}}
    for model in config["models"]:
        found[f"{server}/{model}"] = client.infer_grpc(target, model, batch, stub)
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=model))
        results["metadata"].setdefault(server, {})[model] = {
            "name": meta.name, "platform": meta.platform,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs]}
    cases = {
        "wrong_shape": request(first, [tensor(shape=[n, h, w - 1])], [batch[:, :, 1:].astype("<f4").tobytes()]),
        "wrong_datatype": request(first, [tensor(datatype="FP64")], [batch.astype("<f8").tobytes()]),
        "missing_input": request(first, [], []),
        "wrong_name": request(first, [tensor(name="pixels")], good_raw),
        "out_of_range": request(first, [tensor()], [(batch * 255 + 1).astype("<f4").tobytes()]),
        "unknown_model": request("nope", [tensor()], good_raw),
        "too_large": request(first, [tensor(shape=[config["limit"] // 4 + 1])],
                             [bytes(4 * (config["limit"] // 4 + 1))]),
    }
    for case, message in cases.items():
        try:
            client.grpc_call(stub.ModelInfer, message)
            outcome = {"code": "OK", "message": ""}
        except client.RequestFailed as error:
            outcome = {"code": error.status, "message": error.message}
        then = client.infer_grpc(target, first, batch, stub)
        outcome["then_ok"] = bool(np.array_equal(then, found[f"{server}/{first}"]))
        results["errors"].setdefault(server, {})[case] = outcome
np.savez(config["logits"], **found)
open(config["results"], "w").write(json.dumps(results))
"""


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
    np.save(work / "batch.npy", served.batch)
    config = {"targets": {name: s.grpc_target for name, s in served.servers.items()}, "models": served.names,
              "batch": str(work / "batch.npy"), "limit": LIMIT, "logits": str(work / "logits.npz"),
              "results": str(work / "results.json")}
    (work / "config.json").write_text(json.dumps(config))
    result = run_in("validation", GRPC_SCRIPT, ROSETTA_TEST_GRPC=str(work / "config.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((work / "results.json").read_text())
    with np.load(work / "logits.npz") as logits:
        results["logits"] = {key: logits[key] for key in logits.files}
    results["onnx_in_process"] = onnx_in_process(served.run, served.models, work / "batch.npy", work / "ort.npz")
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
        found = {"v1": serving_client.predict_v1(url, model, served.batch),
                 "v2": serving_client.infer_v2(url, model, served.batch),
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
            answers[server] = {"v1": serving_client.predict_v1(url, name, served.batch),
                               "v2": serving_client.infer_v2(url, name, served.batch),
                               "grpc": grpc_results["logits"][f"{server}/{name}"]}
            for protocol, logits in answers[server].items():
                worst = float(np.abs(logits.astype(np.float64) - served.reference[model]).max())
                assert worst <= served.tolerance, f"{server} {name} {protocol}: {worst:.3g} from the reference"
        for a, b in itertools.combinations(SERVERS, 2):
            for protocol in answers[a]:
                worst = float(np.abs(answers[a][protocol] - answers[b][protocol]).max())
                assert worst <= served.tolerance, f"{a}|{b} {init_name(model)} {protocol}: {worst:.3g}"


def test_the_metadata_is_the_same_on_every_server(served: Served, grpc_results: dict[str, Any]) -> None:
    """V2 model metadata over REST and gRPC, identical across the four: the ONNX conventions' names, FP32, the
    batch as -1, the image shape and class count of the run."""
    height, width = served.batch.shape[1:]
    for model in served.names:  # <model>-init: <model>'s metadata but for the name
        expected = {"name": model, "platform": "",
                    "inputs": [{"name": "images", "datatype": "FP32", "shape": [-1, height, width]}],
                    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}
        for server in SERVERS:
            rest = serving_client.metadata(served.servers[server].url, model)
            rest.pop("versions", None)  # KServe's optional, empty field
            assert rest == expected, (server, model)
            assert grpc_results["metadata"][server][model] == expected, (server, model)


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


def rest_cases(served: Served, model: str) -> dict[str, tuple[str, bytes, int, str]]:
    """case -> (path, body, status, what the one line must say)."""
    batch = served.batch
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


@pytest.mark.parametrize("server", SERVERS)
def test_bad_rest_requests_get_their_status_and_one_line(served: Served, grpc_results: dict[str, Any],
                                                         server: str) -> None:
    url, model = served.servers[server].url, served.models[0]
    expected = expected_logits(served, grpc_results, server, model)
    for case, (path, body, status, says) in rest_cases(served, model).items():
        # The V1 body that is not JSON goes as a form, as curl -d sends it; the rest as JSON.
        found, line = post(url + path, body, "application/x-www-form-urlencoded" if case == "v1_not_json"
                           else "application/json")
        assert (found, "\n" in line) == (status, False), (server, case, found, line)
        assert says in line, (server, case, line)
        # The server keeps serving: the good request right after succeeds, with the same logits.
        assert np.array_equal(serving_client.infer_v2(url, model, served.batch), expected), (server, case)
    status, line = post(url + f"/v1/models/{model}:predict", b"{not json")  # JSON content type, not JSON
    assert status == 400 and line.startswith("body: not JSON"), (server, line)
    with pytest.raises(serving_client.RequestFailed) as refused:
        serving_client.metadata(url, "nope")
    assert refused.value.status == 404 and "allowed: " + ", ".join(served.names) in refused.value.message


@pytest.mark.parametrize("server", SERVERS)
def test_bad_grpc_requests_get_their_status_and_one_line(grpc_results: dict[str, Any], server: str) -> None:
    expected = {
        "wrong_shape": ("INVALID_ARGUMENT", "inputs[0].shape: "),
        "wrong_datatype": ("INVALID_ARGUMENT", "inputs[0].datatype: 'FP64' is not allowed"),
        "missing_input": ("INVALID_ARGUMENT", "inputs: no input named 'images' (got [])"),
        "wrong_name": ("INVALID_ARGUMENT", "inputs: no input named 'images' (got ['pixels'])"),
        "out_of_range": ("INVALID_ARGUMENT", "inputs[0].data: values from"),
        "unknown_model": ("NOT_FOUND", "model 'nope': not served here"),
        "too_large": ("RESOURCE_EXHAUSTED", "larger than max"),  # gRPC's own limit, set to the same size
    }
    errors = grpc_results["errors"][server]
    for case, (code, says) in expected.items():
        outcome = errors[case]
        assert (outcome["code"], "\n" in outcome["message"]) == (code, False), (server, case, outcome)
        assert says in outcome["message"], (server, case, outcome)
        assert outcome["then_ok"], (server, case)


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
