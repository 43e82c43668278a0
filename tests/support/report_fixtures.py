"""A small, real set of pipeline artifacts for the report tests: tiny ONNX files built with onnx.helper (each
"framework" emitting different ops, as the real converters do), metrics, train logs, export records and a
validation report, laid out as pipelines/paths.py says (each run's folder artifacts/<framework>/<model>/), and,
apart, measurements of a run (measurements/, written by pipelines.measurements as the train_export stage does).
Nothing is mocked: the report reads them exactly as it reads a real run."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from pipelines import paths
from rosetta_common.io import write_json
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.taps import tap_names

# Not `from support import ...`: packages/common/tests has a conftest module too, and under a plain `pytest`
# whichever loads last owns the name.
REPO = Path(__file__).resolve().parents[2]
MODELS = ["mlp", "cnn", "attention"]
# Models the extended fixture adds: one with BatchNorm (running statistics), one recurrent (its ONNX form).
NEW_MODELS = ["resnet", "lstm"]
LSTM_HIDDEN = 4
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


def _lstm_graph(fw: str, rng: np.random.Generator) -> onnx.ModelProto:
    """A real, checkable recurrent classifier (image rows as time steps) in the form the named exporter gives it
    here: torch keeps the layer as one ONNX LSTM op; the others come out unrolled (here: the MLP graph, which has
    no LSTM, Loop or Scan)."""
    if fw != "torch":
        return _mlp_graph(fw, rng)
    batch, opset, producer = EXPORTERS[fw]
    h = LSTM_HIDDEN
    weights = {
        "w": rng.standard_normal((1, 4 * h, SIDE)), "r": rng.standard_normal((1, 4 * h, h)),
        "b": np.zeros((1, 8 * h)), "head": rng.standard_normal((h, CLASSES)), "axes": np.array([0], np.int64),
    }
    initializers = [numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k)
                    for k, v in weights.items()]
    nodes = [
        helper.make_node("Transpose", ["images"], ["steps"], perm=[1, 0, 2]),  # (rows, batch, width)
        helper.make_node("LSTM", ["steps", "w", "r", "b"], ["", "last"], hidden_size=h),
        helper.make_node("Squeeze", ["last", "axes"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "head"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        f"{fw}_lstm",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, SIDE, SIDE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, CLASSES])],
        initializer=initializers,
    )
    model = helper.make_model(graph, producer_name=producer, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


# The extended fixture's BatchNorm figures: (pair index, statistic) -> its worst layer's relative difference.
RUNNING_STATS = {"running_mean": [2e-6, 4e-6, 3e-6], "running_var": [5e-6, 7e-5, 6e-6]}
BN_LAYERS = ["stem.bn", "block.bn1"]


def _new_model_rows(model: str, add: Any) -> list[dict[str, Any]]:
    """Rows of the checks only the new models have, and the BatchNorm figures (validation.json's
    running_statistics) for a model with BatchNorm."""
    for k, fw in enumerate(FRAMEWORKS):
        add(model, fw, "inference_mode_onnx_model", 0.0, 1e-4, True)
        add(model, fw, "inference_mode_native_" + f"{fw}_native", 2e-6 * k, 1e-4, True)
    if model != "resnet":
        return []
    figures = []
    for k, pair in enumerate(PAIRS):
        fig: dict[str, Any] = {"model": model, "frameworks": pair, "layers": {}}
        for statistic, values in RUNNING_STATS.items():
            add(model, pair, f"{statistic}_rel", values[k], 1e-3)
            fig[f"{statistic}_max_rel"] = values[k]
            for i, layer in enumerate(BN_LAYERS):  # the last layer is the worst
                fig["layers"].setdefault(layer, {})[statistic] = values[k] / (len(BN_LAYERS) - i)
        figures.append(fig)
    return figures


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2))


def _losses(rng: np.random.Generator, steps: int, offset: float) -> list[float]:
    base = 2.3 * np.exp(-np.arange(steps) / (steps / 3)) + 0.05
    return [float(v) for v in base * (1 + offset) + rng.normal(0, 0.01, steps) ** 2]


# In the failing fixture the failing pair's init taps part here (validate names it in the check's detail), and
# jax's native taps leave the reference there: the report's taps figure and the failed check's link show it.
FAILING_TAP = "conv2"


def _comparison(names: list[str], base: float, first: str | None) -> dict[str, Any]:
    """One comparison as validate's taps record holds it: errors growing along the taps, 300x from `first` on."""
    at = names.index(first) if first is not None else len(names)
    taps = [{"tap": name, "max_abs": base * (1 + i) * (300 if i >= at else 1), "scale": 2.0,
             "rel": base * (1 + i) * (300 if i >= at else 1) / 2.0} for i, name in enumerate(names)]
    taps[0] |= {"max_abs": 0.0, "rel": 0.0}  # bitwise equal: drawn at the floor
    return {"first_divergent": first, "tolerance": 1e-5, "taps": taps}


def _taps(model: str, failing: bool) -> dict[str, Any]:
    """A model's entry in validation.json's "taps" (pipelines/checks/taps.py taps_record)."""
    names = tap_names(ModelConfig.of(Spec(), model, (SIDE, SIDE), CLASSES))
    off = failing and model == FAILING["model"]
    record: dict[str, Any] = {"model": model}
    for kind, base in (("init", 1e-8), ("trained", 3e-7)):
        # trained runs part somewhere in every model (figures only); init taps only in the failing one
        parts = names[len(names) // 2] if kind == "trained" else FAILING_TAP if off else None
        record[kind] = {
            "vs_reference": {fw: _comparison(names, base, parts if fw == "jax" else None) for fw in FRAMEWORKS},
            "pairs": {pair: _comparison(names, base, parts if "jax" in pair else None) for pair in PAIRS},
        }
    return record


# Where two runs part (pair -> step) in every fixture: cnn's torch|tf and torch|jax runs part, and their test
# losses, beyond the float32 bound, are judged by the measured null (validate's Ledger.add_null, judge_nulls): one
# pooled test over the three frameworks' runs and parted replicates that both pairs share, p 0.054, not rejected.
PARTED = {("cnn", "torch|tf"): 412, ("cnn", "torch|jax"): 530}
PARTED_TEST_LOSS = {"torch|tf": 0.0267, "torch|jax": 0.03}
POOLED_NULL = {"method": "pooled_permutation", "test": "cnn test_loss_rel torch|tf|jax", "statistic": 2.41,
               "p_value": 0.054, "floor": 1e-4, "permutations": 9999, "groups": {"torch": 6, "tf": 6, "jax": 6},
               "threshold": 0.05, "holm_family": 1}

# Where cnn's trainings part within each framework (validate's parting_record): torch's replicates part from its run
# before its runs part from the others, tf's after them or never.
PARTING = {"model": "cnn", "steps": 600,
           "within": {"torch": {"run": [37, 40], "replicates": [52]}, "tf": {"run": [450, None], "replicates": [480]},
                      "jax": {"run": [300, 520], "replicates": [390]}}}


def _validation(failing: bool, models: list[str]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []

    def add(model: str, fw: str, check: str, value: float, tolerance: float, passed: bool | None = None,
            detail: str = "") -> None:
        rows.append({"model": model, "framework": fw, "check": check, "value": value, "tolerance": tolerance,
                     "passed": value <= tolerance if passed is None else passed, **({"detail": detail} if detail
                                                                                    else {})})

    parity, statistics = [], []
    for model in models:
        if model in NEW_MODELS:
            statistics += _new_model_rows(model, add)
        for fw in FRAMEWORKS:
            add(model, fw, "onnx_checker_model", 0.0, 0.0, True)
            add(model, fw, "onnx_vs_native", 1.2e-6, 1e-5)
            add(model, fw, "init_onnx_vs_native", 9.5e-7, 1e-5)
            add(model, fw, "init_onnx_vs_reference", 2.0e-6, 1e-5)
            add(model, fw, "min_test_accuracy", 0.97, 0.95, True)
        for k, pair in enumerate(PAIRS):
            value, detail = 1.0e-6 * (k + 1), ""
            if failing and (model, pair) == (FAILING["model"], FAILING["framework"]):
                value = FAILING["value"]
                detail = f"init taps of {pair}: first divergent tap {FAILING_TAP} (max abs 0.0012, 0.0006 of its scale)"
            add(model, pair, "forward_parity_init_onnx", value, 1e-5, detail=detail)
            add(model, pair, "train_step1_loss_rel", 2e-8, 1e-6)
            add(model, pair, "train_lockstep_loss_rel", 4e-7, 1e-5)
            parting = PARTED.get((model, pair))
            test_loss = PARTED_TEST_LOSS[pair] if parting else 1.5e-4
            if parting:
                add(model, pair, "test_loss_rel", test_loss, 1e-3, True, f"runs part at step {parting}")
                rows[-1]["null"] = dict(POOLED_NULL)
            else:
                add(model, pair, "test_loss_rel", test_loss, 1e-3)
            add(model, pair, "test_accuracy_points", 0.0, 0.6)
            parity.append({"model": model, "frameworks": pair, "optimizer": "adam", "step1_loss_rel": 2e-8,
                           "lockstep_loss_max_rel": 4e-7, "parting_step": parting, "all_steps_loss_max_rel": 3e-4,
                           "all_steps_loss_max_abs": 1e-4, "test_loss_rel": test_loss,
                           "test_accuracy_diff_points": 0.0, "final_weights_max_abs": 2e-3})
    failed = sum(not r["passed"] for r in rows)
    return {"passed": failed == 0, "checks": rows, "training_parity": parity, "running_statistics": statistics,
            "taps": [_taps(model, failing) for model in models],
            "parting": [{**PARTING, "across": {pair: PARTED.get(("cnn", pair)) for pair in PAIRS}}
                        for model in models if model == "cnn"],
            "summary": {"checks": len(rows), "failed": failed}}


# Measurement figures no lineage file holds: the report may show them only through measurements/timings.js.
TRAIN_SECONDS = {"torch": 2.345, "tf": 3.456, "jax": 4.567}
STAGE_IMPORT_SECONDS = {"torch": 5.125, "tf": 7.25, "jax": 3.375}
VERSIONS = {"torch": {"torch": "2.13.0+cpu"}, "tf": {"tensorflow-cpu": "2.21.0", "keras": "3.15.1"},
            "jax": {"jax": "0.10.2", "jaxlib": "0.10.2"}}


def _measurement(model: str, fw: str) -> dict[str, Any]:
    """One record as the train_export stage writes it (pipelines/measurements.py)."""
    native = {"torch": 0.08, "tf": 0.9, "jax": 0.15}[fw] * (8 if model == "attention" else 1)
    return {
        "framework": fw,
        "model": model,
        "startup_seconds": 4.25,
        "stage_seconds": 17.75,
        "train": {"train_seconds": TRAIN_SECONDS[fw], "epoch_seconds": [1.5, 0.4, 0.4],
                  "steady_samples_per_second": 1234.5 * (1 + FRAMEWORKS.index(fw))},
        "export": {"native_export_seconds": 0.4, "onnx_export_seconds": 1.5},
        "latency": {
            "native": f"rosetta_{fw}.predict (numpy in, numpy out)",
            "results": [
                {"batch": b, "repeats": 50, "native_median_ms": native * (1 + b / 16),
                 "onnx_median_ms": 0.05 * (1 + b / 8), "native_min_ms": native, "onnx_min_ms": 0.05,
                 "native_over_onnx": native * (1 + b / 16) / (0.05 * (1 + b / 8)), "outputs_max_abs_diff": 1e-6}
                for b in (1, 64)
            ],
            "settings": {"batch_sizes": [1, 64], "warmup": 3},
            "environment": {"python": "3.11.9", "machine": "x86_64", "available_cores": 4,
                            "threads": {"framework": {"intra_op": 2, "source": fw},
                                        "onnxruntime": {"intra_op": 2, "inter_op": 1}}},
        },
    }


def _throughput_results() -> list[dict[str, Any]]:
    """benchmarks/train_throughput_worker.py's results for two cases: torch's digits mlp, where ours took 0.02 s an
    epoch against the idiomatic loop's 0.025 (1.25x), and tf's, ours 0.05 s against 0.04 in both repeats."""
    def runs(steady: float) -> list[dict[str, Any]]:
        return [{"epoch_seconds": [0.5, steady, steady], "epoch_losses": [0.9, 0.5, 0.3], "samples_per_epoch": 1408}
                for _ in range(2)]

    def case(ours: float, idiomatic: float) -> dict[str, Any]:
        return {"scale": "digits", "model": "mlp", "epochs": 3, "train_samples": None, "batch_size": 32,
                "runs": {"ours": runs(ours), "idiomatic": runs(idiomatic)}}

    return [{"framework": "torch", "cases": [case(0.02, 0.025)]}, {"framework": "tf", "cases": [case(0.05, 0.04)]}]


def make_measurements(root: Path, *, skip: tuple[tuple[str, str], ...] = (), throughput: bool = False) -> Path:
    """measurements/ under `root`, written record by record by pipelines.measurements (timings.js included);
    with `throughput`, also a training-throughput benchmark's table, from the benchmark's own summarize() and
    report_table()."""
    from benchmarks.train_throughput import report_table, summarize
    from pipelines import measurements

    if throughput:
        write_json(root / measurements.THROUGHPUT_TABLE,
                   report_table(summarize(_throughput_results()), {"epochs": 3, "repeats": 2}))

    for model in MODELS:
        for fw in FRAMEWORKS:
            if (model, fw) not in skip:
                measurements.write(model, fw, _measurement(model, fw), root / measurements.ROOT)
    for fw in FRAMEWORKS:  # each framework stage's start-up breakdown, as StageClock records it
        measurements.write_stage({
            "stage": f"train_export@{fw}", "models": MODELS,
            "startup": {"runner_seconds": 0.125, "interpreter_seconds": 0.03, "imports_seconds": 0.75},
            "phases": {"inputs": 0.05, "framework_import": STAGE_IMPORT_SECONDS[fw],
                       **{f"{m}.train": TRAIN_SECONDS[fw] for m in MODELS}},
            "total_seconds": 30.5}, root / measurements.ROOT)
    return root / measurements.ROOT


def cli_env(**extra: str) -> dict[str, str]:
    """The orchestrator's interpreter (and its dvc) first on PATH, our sources importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "packages/common/src"), str(REPO)])
    return {**env, **extra}


def make_artifacts(root: Path, *, failing: bool = False, models: list[str] = MODELS) -> Path:
    """Write a complete set of artifacts under `root` (a repository-like folder) for `models` and return it."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["epochs"] = 3
    params["models"] = models
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (root / "requirements.lock").write_text("numpy==2.4.6 \\\n    --hash=sha256:00\n")
    for env, package in {"torch": "packages/torch_impl", "tf": "packages/tf_impl", "jax": "packages/jax_impl",
                         "validation": "packages/validation"}.items():
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "pyproject.toml").write_text((REPO / package / "pyproject.toml").read_text())
        (root / package / "requirements-cpu.lock").write_text((REPO / package / "requirements-cpu.lock").read_text())
        if env in SOURCES:
            src = root / package / "src" / f"rosetta_{env}" / "models.py"
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(SOURCES[env])
    steps_per_epoch = 20
    for model in models:
        graph = _lstm_graph if model == "lstm" else _mlp_graph
        for k, fw in enumerate(FRAMEWORKS):
            run = root / paths.run_dir(model, fw)
            run.mkdir(parents=True, exist_ok=True)
            onnx.save(graph(fw, rng), str(run / "model.onnx"))
            onnx.save(graph(fw, rng), str(run / "init.onnx"))
            steps = _losses(rng, 3 * steps_per_epoch, 1e-3 * k)
            epochs = [float(np.mean(steps[i : i + steps_per_epoch])) for i in range(0, len(steps), steps_per_epoch)]
            _write_json(run / "train_log.json", {"framework": fw, "model": model, "optimizer": "adam",
                                                 "learning_rate": 0.001, "epochs": 3, "batch_size": 32,
                                                 "steps_per_epoch": steps_per_epoch, "step_losses": steps,
                                                 "epoch_losses": epochs})
            _write_json(run / "metrics.json", {
                "test_accuracy": 0.97 - 0.001 * k, "test_loss": 0.1, "final_train_loss": epochs[-1],
                "parameters": 1210, "epochs": 3, "optimizer": "adam"})
            _write_json(run / "export.json", {
                "framework": fw, "model": model, "native_roundtrip_max_abs": {f"{fw}_native": 0.0},
                "sha256": {"model.onnx": "0" * 64, "init.onnx": "1" * 64},
                # As train_export records them: the environment's distributions, found installed.
                "versions": {**VERSIONS[fw], "onnx": "1.21.0", "onnxruntime": "1.32.0", "numpy": "2.4.6"}})
    _write_json(root / "reports" / "validation.json", _validation(failing, models))
    return root


# --- The browser: Debian's chromium, driven by Selenium through Debian's chromium-driver. ---

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
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
    "--window-size=1280,2000",
]


def browser_missing() -> str | None:
    """Why the browser test cannot run on this host, or None."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        return f"{' and '.join(missing)} missing: run `make browser` (Debian's chromium and chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed in this environment (it is in requirements.lock)"
    return None


def run_in_browser(html: Path, script: str, window: tuple[int, int] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """Open the page, run `script` (a JavaScript function body that returns a value) and return that value and the
    browser log's errors (SEVERE entries: uncaught exceptions, failed loads). `window`: its width and height in
    pixels (default CHROMIUM_FLAGS')."""
    from selenium import webdriver

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never try a download
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        if window is None or not flag.startswith("--window-size="):
            options.add_argument(flag)
    if window is not None:
        options.add_argument(f"--window-size={window[0]},{window[1]}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)))
    try:
        driver.get(html.resolve().as_uri())
        found = driver.execute_script(script)
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        driver.quit()
    return found, errors


def load_in_browser(html: Path, png: Path) -> dict[str, Any]:
    """Open the page; return its title, every image's state, the measurements section (its text, its table's
    cells), browser-log errors and every request it made, and save a screenshot of what a reader sees first."""
    from selenium import webdriver

    # The driver is named explicitly and Selenium Manager is told it is offline: it must never try a download.
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    # Console messages, uncaught exceptions and failed loads land in "browser"; DevTools events in "performance".
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)))
    try:
        driver.get(html.resolve().as_uri())
        images = driver.execute_script(
            "return [...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))"
        )
        measured = driver.execute_script(
            "const s = document.getElementById('measurements');"
            "const t = document.getElementById('measurements-table');"
            "return {text: s ? s.innerText : null, rows: t ? [...t.rows].map(r => [...r.cells].map(c => c.innerText))"
            " : null}"
        )
        title = driver.title
        driver.save_screenshot(str(png))
        browser_log = driver.get_log("browser")
        events = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    finally:
        driver.quit()
    return {
        "title": title,
        "images": images,
        "measurements": measured,
        "errors": [entry for entry in browser_log if entry.get("level") == "SEVERE"],
        "requests": [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"],
    }


def built_report(root: Path, failing: bool) -> Path:
    """The report stage run on a fresh fixture set in root (passing, or with FAILING's check failing): its folder."""
    from pipelines.stages.report import build

    make_artifacts(root, failing=failing)
    build(root)
    return root / paths.REPORT


def deployment_row(fmt: str, framework: str, total: float) -> dict:
    """One row of benchmarks/deployment.py's record (made-up figures, as the benchmark writes them)."""
    return {"model": "cnn", "format": fmt, "framework": framework, "env": "validation", "bytes": 2048,
            "cold": {"interpreter_seconds": 0.05, "imports_seconds": 1.0, "load_seconds": 0.02,
                     "first_request_seconds": 0.0007, "total_seconds": total},
            "first_batch64_ms": 1.7, "steady": {"1": {"median_ms": 0.06, "p90_ms": 0.08},
                                                "64": {"median_ms": 0.9, "p90_ms": 1.2}},
            "max_rss_mib": 58.5, "needs_model_code": False, "max_abs_vs_onnx": None}
