"""A small, real set of pipeline artifacts for the report tests: tiny ONNX files built with onnx.helper (each
"framework" emitting different ops, as the real converters do), metrics, train logs, export records, a
validation report and latency records, laid out as pipelines/paths.py says. Nothing is mocked: the report
reads them exactly as it reads a real run."""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

# Not `from support import ...`: packages/common/tests has a conftest module too, and under a plain `pytest`
# whichever loads last owns the name.
REPO = Path(__file__).resolve().parents[1]
MODELS = ["mlp", "cnn", "attention"]
FRAMEWORKS = ["torch", "tf", "jax"]
HIDDEN, CLASSES, SIDE = 16, 10, 8
# What each converter calls the dynamic batch dimension, its default opset and its name.
EXPORTERS = {"torch": ("batch", 20, "pytorch"), "tf": ("unk__7", 17, "tf2onnx"), "jax": ("B", 23, "jax2onnx")}
PAIRS = [f"{a}|{b}" for a, b in itertools.combinations(FRAMEWORKS, 2)]
# The check that fails in the failing fixture, and by how much (32x its tolerance).
FAILING = {"model": "cnn", "framework": "tf|jax", "check": "forward_parity_init_onnx", "value": 3.2e-4}
SOURCES = {
    "torch": '''import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(64, hidden)

    def forward(self, x):
        return self.hidden(x.flatten(1))


class SelfAttention(nn.Module):
    pass


class AttentionClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = SelfAttention()
''',
    "tf": '''import keras


@keras.saving.register_keras_serializable(package="x")
class AddChannel(keras.layers.Layer):
    pass


def mlp(spec):
    return keras.Sequential([keras.layers.Dense(16)])


def cnn(spec):
    return keras.Sequential([AddChannel()])
''',
    "jax": "this is not python (",
}


def _mlp_graph(fw: str, rng: np.random.Generator) -> onnx.ModelProto:
    """A real, checkable MLP graph, in the op vocabulary of the named exporter."""
    batch, opset, producer = EXPORTERS[fw]
    w1 = numpy_helper.from_array(rng.standard_normal((SIDE * SIDE, HIDDEN)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((HIDDEN, CLASSES)).astype(np.float32), "w2")
    b2 = numpy_helper.from_array(np.zeros(CLASSES, np.float32), "b2")
    shape = numpy_helper.from_array(np.array([-1, SIDE * SIDE], np.int64), "shape")
    if fw == "torch":
        nodes = [
            helper.make_node("Flatten", ["images"], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"]),
        ]
    else:
        nodes = [
            helper.make_node("Reshape", ["images", "shape"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w1"], ["m1"]),
            helper.make_node("Add", ["m1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["m2"]),
            helper.make_node("Add", ["m2", "b2"], ["logits"]),
        ]
        if fw == "jax":
            nodes[-1] = helper.make_node("Add", ["m2", "b2"], ["pre"])
            nodes.append(helper.make_node("Identity", ["pre"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        f"{fw}_graph",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, SIDE, SIDE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, CLASSES])],
        initializer=[w1, b1, w2, b2, shape],
    )
    model = helper.make_model(graph, producer_name=producer, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2))


def _losses(rng: np.random.Generator, steps: int, offset: float) -> list[float]:
    base = 2.3 * np.exp(-np.arange(steps) / (steps / 3)) + 0.05
    return [float(v) for v in base * (1 + offset) + rng.normal(0, 0.01, steps) ** 2]


def _validation(failing: bool) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []

    def add(model: str, fw: str, check: str, value: float, tolerance: float, passed: bool | None = None) -> None:
        rows.append({"model": model, "framework": fw, "check": check, "max_abs_err": value, "tolerance": tolerance,
                     "passed": value <= tolerance if passed is None else passed})

    parity = []
    for model in MODELS:
        for fw in FRAMEWORKS:
            add(model, fw, "onnx_checker_model", 0.0, 0.0, True)
            add(model, fw, "onnx_vs_native", 1.2e-6, 1e-5)
            add(model, fw, "init_onnx_vs_native", 9.5e-7, 1e-5)
            add(model, fw, "init_onnx_vs_reference", 2.0e-6, 1e-5)
            add(model, fw, "min_test_accuracy", 0.97, 0.95, True)
        for k, pair in enumerate(PAIRS):
            value = 1.0e-6 * (k + 1)
            if failing and (model, pair) == (FAILING["model"], FAILING["framework"]):
                value = FAILING["value"]
            add(model, pair, "forward_parity_init_onnx", value, 1e-5)
            add(model, pair, "train_step1_loss_rel", 2e-8, 1e-6)
            add(model, pair, "train_first_epoch_loss_rel", 4e-7, 1e-5)
            add(model, pair, "test_loss_rel", 1.5e-4, 1e-3)
            add(model, pair, "test_accuracy_points", 0.0, 0.6)
            parity.append({"model": model, "frameworks": pair, "optimizer": "adam", "step1_loss_rel": 2e-8,
                           "first_epoch_loss_max_rel": 4e-7, "all_steps_loss_max_rel": 3e-4,
                           "all_steps_loss_max_abs": 1e-4, "test_loss_rel": 1.5e-4,
                           "test_accuracy_diff_points": 0.0, "final_weights_max_abs": 2e-3})
    failed = sum(not r["passed"] for r in rows)
    return {"passed": failed == 0, "checks": rows, "training_parity": parity,
            "summary": {"checks": len(rows), "failed": failed}}


def _latency(model: str, fw: str) -> dict[str, Any]:
    native = {"torch": 0.08, "tf": 0.9, "jax": 0.15}[fw] * (8 if model == "attention" else 1)
    return {
        "framework": fw,
        "model": model,
        "results": [
            {"batch": b, "repeats": 50, "native_median_ms": native * (1 + b / 16), "onnx_median_ms": 0.05 * (1 + b / 8),
             "native_over_onnx": native * (1 + b / 16) / (0.05 * (1 + b / 8)), "outputs_max_abs_diff": 1e-6}
            for b in (1, 64)
        ],
        "settings": {"batch_sizes": [1, 64], "warmup": 3},
        "environment": {"threads": {"framework": {"intra_op": 2, "source": fw},
                                    "onnxruntime": {"intra_op": 2, "inter_op": 1}}},
    }


def cli_env(**extra: str) -> dict[str, str]:
    """The orchestrator's interpreter (and its dvc) first on PATH, our sources importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "packages/common/src"), str(REPO)])
    return {**env, **extra}


def make_artifacts(root: Path, *, failing: bool = False) -> Path:
    """Write a complete set of artifacts under `root` (a repository-like folder) and return it."""
    rng = np.random.default_rng(0)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["epochs"] = 3
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (root / "requirements.lock").write_text("numpy==2.4.6 \\\n    --hash=sha256:00\n")
    for env, package in {"torch": "packages/torch_impl", "tf": "packages/tf_impl", "jax": "packages/jax_impl",
                         "validation": "pipelines/validation"}.items():
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "pyproject.toml").write_text((REPO / package / "pyproject.toml").read_text())
        (root / package / "requirements-cpu.lock").write_text((REPO / package / "requirements-cpu.lock").read_text())
        if env in SOURCES:
            src = root / package / "src" / f"rosetta_{env}" / "models.py"
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(SOURCES[env])
    steps_per_epoch = 20
    for model in MODELS:
        for k, fw in enumerate(FRAMEWORKS):
            run = root / "artifacts" / model / fw
            run.mkdir(parents=True, exist_ok=True)
            onnx.save(_mlp_graph(fw, rng), str(run / "model.onnx"))
            onnx.save(_mlp_graph(fw, rng), str(run / "init.onnx"))
            steps = _losses(rng, 3 * steps_per_epoch, 1e-3 * k)
            epochs = [float(np.mean(steps[i : i + steps_per_epoch])) for i in range(0, len(steps), steps_per_epoch)]
            _write_json(run / "train_log.json", {"framework": fw, "model": model, "optimizer": "adam",
                                                 "steps_per_epoch": steps_per_epoch, "step_losses": steps,
                                                 "epoch_losses": epochs})
            _write_json(run / "export.json", {"framework": fw, "model": model, "native_files": ["a"],
                                              "native_export_seconds": 0.4 + k, "onnx_export_seconds": 1.5 + k,
                                              "native_roundtrip_max_abs": {f"{fw}_native": 0.0}})
            _write_json(root / "metrics" / model / f"{fw}.json", {
                "test_accuracy": 0.97 - 0.001 * k, "test_loss": 0.1, "final_train_loss": epochs[-1],
                "train_seconds": 2.0 + k, "samples_per_second": 1000.0 * (3 - k), "parameters": 1210,
                "epochs": 3, "optimizer": "adam", "epoch_losses": epochs})
            _write_json(root / "reports" / "latency" / model / f"{fw}.json", _latency(model, fw))
    _write_json(root / "reports" / "validation.json", _validation(failing))
    return root


# --- The browser: headless Chromium driven directly (no Python browser package is in the orchestrator env). ---

CHROMIUM = Path("/usr/bin/chromium")
# No network at all: no DNS, no background services; the report must render from the file alone.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # we run as root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--hide-scrollbars",
]


def screenshot(html: Path, png: Path, profile: Path, size: tuple[int, int] = (1280, 2000)) -> None:
    """Chromium's own one-shot screenshot of the page (what a reader would see first)."""
    result = subprocess.run(
        [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
         f"--window-size={size[0]},{size[1]}", html.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    if result.returncode != 0 or not png.is_file():
        raise AssertionError(f"chromium --screenshot failed ({result.returncode}):\n{result.stderr[-3000:]}")


class WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: masked text frames out, unmasked frames in."""

    def __init__(self, url: str, timeout: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            response += chunk
        if b" 101 " not in response.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {response[:200]!r}")
        self.buffer = response.split(b"\r\n\r\n", 1)[1]

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytes([0x81])  # FIN + text
        if len(payload) < 126:
            header += bytes([0x80 | len(payload)])
        elif len(payload) < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(payload))
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(length)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the websocket")
            if opcode in (0x9, 0xA):  # ping/pong: not part of a message
                continue
            message += payload
            if first & 0x80:
                return message.decode()

    def close(self) -> None:
        self.sock.close()


class DevTools:
    """A headless Chromium with one page, spoken to over the DevTools protocol; events are kept in order."""

    def __init__(self, profile: Path, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.process = subprocess.Popen(
            [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--window-size=1280,2000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"  # Chromium writes the port it picked here
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise AssertionError("headless Chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages: list[dict[str, Any]] = []
        local = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a configured proxy
        while not pages:
            with local.open(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as response:
                pages = [t for t in json.load(response) if t.get("type") == "page"]
            if not pages:
                time.sleep(0.1)
        self.ws = WebSocket(pages[0]["webSocketDebuggerUrl"], timeout)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.receive())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, event: str) -> dict[str, Any]:
        for seen in self.events:
            if seen["method"] == event:
                return seen
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            message = json.loads(self.ws.receive())
            if "method" in message:
                self.events.append(message)
                if message["method"] == event:
                    return message
        raise AssertionError(f"no {event} within {self.timeout}s")

    def close(self) -> None:
        if getattr(self, "ws", None):
            self.ws.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def load_in_browser(html: Path, profile: Path) -> dict[str, Any]:
    """Open the page; return its console errors, uncaught exceptions, requests and every image's state."""
    browser = DevTools(profile)
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable")
        browser.call("Page.navigate", url=html.resolve().as_uri())
        browser.wait_for("Page.loadEventFired")
        images = browser.call(
            "Runtime.evaluate",
            expression="JSON.stringify([...document.images].map(i => "
            "({alt: i.alt, complete: i.complete, width: i.naturalWidth, src: i.src.slice(0, 30)})))",
            returnByValue=True,
        )["result"]["value"]
        title = browser.call("Runtime.evaluate", expression="document.title", returnByValue=True)["result"]["value"]
        events = browser.events
    finally:
        browser.close()
    return {
        "title": title,
        "images": json.loads(images),
        "console_errors": [
            e["params"] for e in events
            if e["method"] == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert")
        ],
        "log_errors": [
            e["params"]["entry"] for e in events
            if e["method"] == "Log.entryAdded" and e["params"]["entry"].get("level") == "error"
        ],
        "exceptions": [e["params"] for e in events if e["method"] == "Runtime.exceptionThrown"],
        "requests": [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"],
    }
