"""Served logits (the serve stage's artifacts/served/): each model server's answers to the validation batch, through
V1 REST, V2 REST and V2 gRPC, against the same export's logits computed in process, and the servers' metadata.

The rules, each stated before it was measured:
- a framework's server (torch, tf, jax) runs the very export train_export reloaded and ran on the same float32
  batch (torch: model.pt2, tf: the SavedModel, jax: the jax.export artifact), with the same thread count and
  instruction-set pins (the runner's stage environment), the whole batch in one request as train_export ran it;
  the transports carry every bit (V1 and V2 REST: each float32 as the shortest decimal of the float64 that holds
  it exactly, which parses back to that float64 and so to the same float32; gRPC: raw little-endian float32). So
  the served logits must equal native_outputs.npz's record of that export (`inference_<format>_batch_runs[0]`)
  bit for bit: tolerance 0 (`served_native_vs_in_process_<protocol>`);
- the ONNX server runs `onnx_from`'s model.onnx in a session opened as this stage opens its own
  (pipelines/serve_onnx.py: the settings of pipelines/checks/sessions.py, the same thread count and providers):
  bit for bit against this stage's session on the same batch (`served_onnx_vs_in_process_<protocol>`);
- the ONNX server against that framework's own server, the same protocol (`served_onnx_vs_native_<protocol>`):
  the two exports of one trained model, each within its own bound of the in-memory model (onnx_vs_native's,
  native_roundtrip's), so within the sum of the two bounds at the largest logit;
- every model's V2 metadata is the same on every server, over REST and over gRPC, and says what the ONNX
  conventions and the prepared data say: input "images" FP32 [-1, height, width], output "logits" FP32
  [-1, classes] (`served_metadata_identical`);
- the folder is what the serve stage published for this batch: index.json readable, every file with the sha256
  it records and no other, the batch's sha256 equal to this stage's batch, every model's array in every
  server's file, float32 (batch, classes) (`served_readable`).

Across frameworks the served logits are figures, not checks: the three frameworks' trained models are three
models (training parity judges how they came to differ), and trained logits differ by more than the forward
tolerance even where the runs stay in lockstep (digits, 10 epochs: mlp torch|jax 1.1e-5, lstm 1.4e-5; cnn torch|tf,
whose runs part at step 37, 0.78), so no float32 bound holds for them; whatever the servers add to that
difference is what the checks above bound, at 0.

Where the serve stage served nothing and said why (its off.json: the container runtime, for now), no serving check
is made and validation.json's "serving" records why, as with data-parallel training switched off.

Checks of a framework's server (its subject: that framework) are made only for a run that is judged (intact, see
integrity.py), like every other check of that run; the ONNX server's are the framework's whose model.onnx it
serves."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.exports import onnx_tolerance
from pipelines.checks.ledger import Ledger
from pipelines.checks.sessions import run_onnx
from rosetta_common.data import batch_sha256
from rosetta_common.io import sha256
from rosetta_common.metrics import max_abs_diff
from rosetta_common.onnx_conventions import INPUT_NAME, OUTPUT_NAME
from rosetta_common.spec import ModelConfig, Spec

ONNX_SERVER = "onnx"
# The native format each framework's server runs (rosetta_<framework>.serve's SERVED_FORMAT; the validator cannot
# import those modules, which import the frameworks): its record in native_outputs.npz is what the server must
# reproduce. tests/test_serve_stage.py checks that the two agree.
SERVED_FORMAT = {"torch": "torch_export", "tf": "saved_model", "jax": "jax_export"}
METADATA_SUBJECT = "servers"  # a check of every server at once (the folder, the metadata)


@dataclass
class Served:
    """artifacts/served/ as read once per validate run: the index, the problems of the folder as a whole, and
    per server and protocol the arrays of every model."""

    index: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # the folder's own: every model's served_readable fails
    logits: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)  # server -> protocol -> model
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # server -> model -> {"rest", "grpc"}
    off: str | None = None  # why nothing was served (the serve stage's off.json), or None

    @property
    def servers(self) -> list[str]:
        return list(self.index.get("servers", {}))

    @property
    def onnx_from(self) -> str | None:
        return self.index.get("onnx_from")


def read_served(batch: np.ndarray) -> Served:
    """The served folder, checked as a whole (index, hashes, batch); what it holds, loaded."""
    served = Served()
    root, index_path = paths.SERVED, paths.SERVED_INDEX
    if paths.SERVED_OFF.is_file() and not index_path.exists():
        try:
            served.off = str(json.loads(paths.SERVED_OFF.read_text())["why"])
            return served
        except (OSError, ValueError, KeyError, TypeError) as error:
            served.problems.append(f"{paths.SERVED_OFF}: unreadable ({type(error).__name__}: {error})")
            return served
    try:
        served.index = json.loads(index_path.read_text())
        recorded = served.index["sha256"]
        servers, recorded_batch = served.index["servers"], served.index["batch"]["sha256"]
        if not isinstance(recorded, dict) or not isinstance(servers, dict) or not servers:
            raise TypeError("sha256 must be an object, servers a non-empty one")
    except (OSError, ValueError, KeyError, TypeError) as error:
        served.index = {}
        served.problems.append(f"{index_path}: unreadable ({type(error).__name__}: {error}); the serve stage "
                               "writes it")
        return served
    if recorded_batch != batch_sha256(batch):
        served.problems.append(f"{index_path}: served another batch (its sha256 differs from this stage's "
                               "validation batch of export.validation_batch_size)")
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {index_path.name}
    for rel in sorted(present - set(recorded)):
        served.problems.append(f"{root / rel}: not among the files index.json records")
    for rel, digest in sorted(recorded.items()):
        if not (root / rel).is_file():
            served.problems.append(f"{root / rel}: missing (index.json records it)")
        elif sha256(root / rel) != digest:
            served.problems.append(f"{root / rel}: altered since it was served (sha256 differs from index.json's)")
    if served.problems:
        return served
    for server in servers:
        for protocol in paths.SERVED_PROTOCOLS:
            try:
                with np.load(paths.served_logits(server, protocol), allow_pickle=False) as npz:
                    served.logits.setdefault(server, {})[protocol] = {key: npz[key] for key in npz.files}
            except (OSError, ValueError) as error:
                served.problems.append(f"{paths.served_logits(server, protocol)}: unreadable ({error})")
        try:
            served.metadata[server] = json.loads(paths.served_metadata(server).read_text())
        except (OSError, ValueError) as error:
            served.problems.append(f"{paths.served_metadata(server)}: unreadable ({error})")
    return served


def model_problems(served: Served, arch: str, shape: tuple[int, int]) -> list[str]:
    """What keeps one model's served answers from being judged: the folder's problems, or its own."""
    if served.problems:
        return served.problems
    problems = []
    for server in served.servers:
        for protocol in paths.SERVED_PROTOCOLS:
            where = f"{paths.served_logits(server, protocol)}: {arch}"
            found = served.logits.get(server, {}).get(protocol, {}).get(arch)
            if found is None:
                problems.append(f"{where}: missing")
            elif found.dtype != np.float32 or found.shape != shape:
                problems.append(f"{where}: {found.dtype} {list(found.shape)}, expected float32 {list(shape)}")
        if arch not in served.metadata.get(server, {}):
            problems.append(f"{paths.served_metadata(server)}: no metadata of {arch}")
    return problems


def bitwise(found: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """(max abs difference, how many values differ in any bit): float32 compared as their bit patterns, so -0.0
    against 0.0 or one NaN against another counts as a difference."""
    expected = np.ascontiguousarray(expected, dtype=np.float32)
    found = np.ascontiguousarray(found, dtype=np.float32)
    differ = int(np.count_nonzero(found.view(np.uint32) != expected.view(np.uint32)))
    return max_abs_diff(found, expected), differ


def expected_metadata(arch: str, config: ModelConfig) -> dict[str, Any]:
    """The V2 inputs and outputs every server must describe (rosetta_common.serving.Signature's form)."""
    height, width = config.image_shape
    return {"name": arch,
            "inputs": [{"name": INPUT_NAME, "datatype": "FP32", "shape": [-1, height, width]}],
            "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, config.num_classes]}]}


def metadata_problems(served: Served, arch: str, config: ModelConfig) -> list[str]:
    """Every server and protocol whose metadata of `arch` differs from the first server's over the same
    protocol, or whose name, inputs or outputs differ from what the run's data say."""
    expected = expected_metadata(arch, config)
    problems = []
    first = served.servers[0]
    for protocol in ("rest", "grpc"):
        reference = served.metadata[first][arch].get(protocol)
        for server in served.servers:
            found = served.metadata[server][arch].get(protocol)
            if not isinstance(found, dict):
                problems.append(f"{server} {protocol}: no metadata")
                continue
            if found != reference:
                problems.append(f"{server} {protocol}: {json.dumps(found, sort_keys=True)} differs from {first}'s "
                                f"{json.dumps(reference, sort_keys=True)}")
            wrong = {key: found.get(key) for key, value in expected.items() if found.get(key) != value}
            if wrong:
                problems.append(f"{server} {protocol}: {json.dumps(wrong, sort_keys=True)}, expected "
                                f"{json.dumps({k: expected[k] for k in wrong}, sort_keys=True)}")
    return problems


def serving_checks(spec: Spec, ledger: Ledger, arch: str, runs: dict[str, dict[str, Any]], batch: np.ndarray,
                   config: ModelConfig, served: Served) -> dict[str, Any]:
    """Every serving check of one model (see the module's docstring), and its figures for validation.json."""
    if served.off is not None:
        return {"model": arch, "off": served.off}  # the serve stage says why it served nothing; nothing to judge
    tol = spec.tolerances
    record: dict[str, Any] = {"model": arch, "onnx_from": served.onnx_from, "servers": {}, "onnx_vs_native": {},
                              "across_frameworks": {}}
    problems = model_problems(served, arch, (len(batch), config.num_classes))
    ledger.add(arch, METADATA_SUBJECT, names.SERVED_READABLE, float(len(problems)), 0.0, not problems,
               "; ".join(problems[:3]))
    if problems:
        record["problems"] = problems
        return record
    logits = {server: {protocol: served.logits[server][protocol][arch] for protocol in paths.SERVED_PROTOCOLS}
              for server in served.servers}

    def judge(server: str, subject: str, check: str, expected: np.ndarray, what: str) -> None:
        figures = record["servers"].setdefault(server, {})
        for protocol, found in logits[server].items():
            worst, differ = bitwise(found, expected)
            figures[protocol] = {"max_abs": worst, "values_differing": differ}
            ledger.add(arch, subject, names.served(check, protocol), worst, 0.0, differ == 0,
                       f"{differ} of {found.size} logits differ in some bit from {what}; bit for bit required")

    for server in served.servers:
        if server == ONNX_SERVER:
            continue
        if server not in runs or server not in SERVED_FORMAT:
            continue  # a run that is not judged (integrity.py says why): nothing of it is
        fmt = SERVED_FORMAT[server]
        key = paths.native_inference_keys(fmt)[0]
        with np.load(paths.native_outputs(arch, server), allow_pickle=False) as native:
            expected = native[key][0]
        judge(server, server, names.SERVED_NATIVE_VS_IN_PROCESS, expected,
              f"{paths.native_outputs(arch, server)}'s {key}[0] (the {fmt} export as train_export ran it)")
    source = served.onnx_from
    if ONNX_SERVER in served.servers and source in runs:
        session = runs[source]["sessions"].get("model")
        if session is None:  # onnx_checker_model failed and says why; there is no in-process figure to judge by
            for protocol in paths.SERVED_PROTOCOLS:
                ledger.add(arch, source, names.served(names.SERVED_ONNX_VS_IN_PROCESS, protocol), None, 0.0, False,
                           f"{paths.onnx_model(arch, source)}: no ONNX Runtime session (see onnx_checker_model)")
        else:
            judge(ONNX_SERVER, source, names.SERVED_ONNX_VS_IN_PROCESS, run_onnx(session, batch),
                  f"{paths.onnx_model(arch, source)} under this stage's own ONNX Runtime session")
        if source in served.servers:
            for protocol in paths.SERVED_PROTOCOLS:
                native = logits[source][protocol]
                bound = onnx_tolerance(tol, native) + tol.native_roundtrip_abs + tol.native_roundtrip_rel * float(
                    np.abs(native).max())
                worst = max_abs_diff(logits[ONNX_SERVER][protocol], native)
                record["onnx_vs_native"][protocol] = worst
                ledger.add(arch, source, names.served(names.SERVED_ONNX_VS_NATIVE, protocol), worst, bound,
                           detail=f"the onnx server against the {source} server; bound: onnx_vs_native's plus "
                                  f"native_roundtrip's at max |logit| {np.abs(native).max():.3g}")
    problems = metadata_problems(served, arch, config)
    ledger.add(arch, METADATA_SUBJECT, names.SERVED_METADATA_IDENTICAL, float(len(problems)), 0.0, not problems,
               "; ".join(problems[:3]) or f"the same on {', '.join(served.servers)}, over REST and gRPC")
    # Figures only (see the module's docstring): the framework servers pairwise, the worst protocol.
    frameworks = [s for s in served.servers if s != ONNX_SERVER]
    for a, b in itertools.combinations(frameworks, 2):
        record["across_frameworks"][f"{a}|{b}"] = {
            "max_abs": max(max_abs_diff(logits[a][p], logits[b][p]) for p in paths.SERVED_PROTOCOLS),
            "argmax_differ": max(int(np.count_nonzero(logits[a][p].argmax(1) != logits[b][p].argmax(1)))
                                 for p in paths.SERVED_PROTOCOLS)}
    return record
