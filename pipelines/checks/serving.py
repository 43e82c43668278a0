"""Served logits (the serve stage's artifacts/served/): each model server's answers to each model's validation batch
and to its init twin's, through V1 REST, V2 REST and V2 gRPC, against the same export's logits computed in
process, the float64 reference, each other, and the servers' metadata.

A framework's server runs the very export train_export ran, with the same pins and the thread count its export.json
recorded, and the transports carry every bit, so its logits must equal the in-process record bit for bit
(tolerance 0); the ONNX server is held bit for bit to this stage's own session of the same file (both at the
source export's thread count), and to the framework's server within the sum of the two exports' bounds; init twins
are also held to the reference forward within tolerances.forward_parity_abs. Trained models' served logits across
frameworks are figures, not checks. Every rule, its tolerance and why: docs/judge.md and docs/serving.md. Checks
are made only for a run that is judged (intact, see integrity.py)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.checks import ledger as names
from pipelines.checks.exports import onnx_tolerance
from pipelines.checks.ledger import Ledger
from pipelines.checks.sessions import run_onnx
from rosetta_common.io import sha256
from rosetta_common.metrics import max_abs_diff
from rosetta_common.onnx_conventions import INPUT_NAME, OUTPUT_NAME, TOKENS_NAME
from rosetta_common.reference import forward
from rosetta_common.serving import SERVED_FORMAT, batch_kind, batch_sha256, init_name, served_name
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.weights import load_weights

ONNX_SERVER = "onnx"
# SERVED_FORMAT (rosetta_common.serving, beside the servers): the native format each framework's server runs; its
# record in native_outputs.npz is what the server must reproduce.
INIT_IN_PROCESS_KEY = "init_validation_logits"  # native_outputs.npz: train_export's models.predict of the init model
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

    def batch_of(self, name: str) -> tuple[str, dict[str, Any]] | None:
        """(kind, record) of the batch index.json says `name` (a served name) was sent, or None."""
        for kind, record in self.index.get("batches", {}).items():
            if name in record["models"]:
                return kind, record
        return None


def read_served(batches: np.ndarray | Mapping[str, np.ndarray] | None = None) -> Served:
    """The served folder, checked as a whole (index, hashes, and each batch given: an array, or kind -> array, each
    against index.json's record of its kind); what it holds, loaded. Each model's own batch is checked again by
    serving_checks, which has it."""
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
        servers, recorded_batches = served.index["servers"], served.index["batches"]
        if not isinstance(recorded, dict) or not isinstance(servers, dict) or not servers:
            raise TypeError("sha256 must be an object, servers a non-empty one")
        if not isinstance(recorded_batches, dict) or not all(
                isinstance(b, dict) and isinstance(b.get("sha256"), str) and isinstance(b.get("models"), list)
                for b in recorded_batches.values()):
            raise TypeError("batches must be an object of {sha256, models, ...} records")
    except (OSError, ValueError, KeyError, TypeError) as error:
        served.index = {}
        served.problems.append(f"{index_path}: unreadable ({type(error).__name__}: {error}); the serve stage "
                               "writes it")
        return served
    given = {} if batches is None else {batch_kind(batches): batches} if isinstance(batches, np.ndarray) else batches
    for kind, batch in given.items():
        if kind in recorded_batches and recorded_batches[kind]["sha256"] != batch_sha256(batch):
            served.problems.append(f"{index_path}: served another {kind} batch (its sha256 differs from this "
                                   "stage's validation batch of export.validation_batch_size)")
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


def model_problems(served: Served, arch: str, batch: np.ndarray, shape: tuple[int, int]) -> list[str]:
    """What keeps one model's served answers from being judged: the folder's problems, or its own (its batch not
    the one index.json records it was sent, an array or its metadata missing or malformed)."""
    if served.problems:
        return served.problems
    problems = []
    for name in (served_name(arch), init_name(arch)):
        sent = served.batch_of(name)
        if sent is None:
            problems.append(f"{paths.SERVED_INDEX}: records no batch sent to {name}")
        elif sent[0] != batch_kind(batch) or sent[1]["sha256"] != batch_sha256(batch):
            problems.append(f"{paths.SERVED_INDEX}: {name} was served another batch ({sent[0]}, sha256 "
                            f"{sent[1]['sha256'][:12]}...) than this stage's validation batch of "
                            f"export.validation_batch_size ({batch_kind(batch)}, {batch_sha256(batch)[:12]}...)")
    for server in served.servers:
        for name in (served_name(arch), init_name(arch)):
            for protocol in paths.SERVED_PROTOCOLS:
                where = f"{paths.served_logits(server, protocol)}: {name}"
                found = served.logits.get(server, {}).get(protocol, {}).get(name)
                if found is None:
                    problems.append(f"{where}: missing")
                elif found.dtype != np.float32 or found.shape != shape:
                    problems.append(f"{where}: {found.dtype} {list(found.shape)}, expected float32 {list(shape)}")
            if name not in served.metadata.get(server, {}):
                problems.append(f"{paths.served_metadata(server)}: no metadata of {name}")
    return problems


def bitwise(found: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """(max abs difference, how many values differ in any bit): float32 compared as their bit patterns, so -0.0
    against 0.0 or one NaN against another counts as a difference."""
    expected = np.ascontiguousarray(expected, dtype=np.float32)
    found = np.ascontiguousarray(found, dtype=np.float32)
    differ = int(np.count_nonzero(found.view(np.uint32) != expected.view(np.uint32)))
    return max_abs_diff(found, expected), differ


def expected_metadata(name: str, config: ModelConfig) -> dict[str, Any]:
    """The V2 inputs and outputs every server must describe (rosetta_common.serving.Signature's form): images FP32
    [-1, height, width], or token ids INT64 [-1, -1] (the batch and the length variable); logits FP32."""
    if config.input.kind == "tokens":
        inputs = [{"name": TOKENS_NAME, "datatype": "INT64", "shape": [-1, -1]}]
    else:
        height, width = config.input.shape
        inputs = [{"name": INPUT_NAME, "datatype": "FP32", "shape": [-1, height, width]}]
    return {"name": name, "inputs": inputs,
            "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, config.num_classes]}]}


def metadata_problems(served: Served, arch: str, config: ModelConfig) -> list[str]:
    """Every server and protocol whose metadata of `arch` (or of its init twin) differs from the first server's
    over the same protocol, or whose name, inputs or outputs differ from what the run's data say; and every one
    whose init twin's metadata is not its `arch`'s but for the name."""
    problems = []
    first, trained_name = served.servers[0], served_name(arch)
    for name in (trained_name, init_name(arch)):
        expected = expected_metadata(name, config)
        for protocol in ("rest", "grpc"):
            reference = served.metadata[first][name].get(protocol)
            for server in served.servers:
                found = served.metadata[server][name].get(protocol)
                if not isinstance(found, dict):
                    problems.append(f"{server} {protocol} {name}: no metadata")
                    continue
                if found != reference:
                    problems.append(f"{server} {protocol} {name}: {json.dumps(found, sort_keys=True)} differs from "
                                    f"{first}'s {json.dumps(reference, sort_keys=True)}")
                wrong = {key: found.get(key) for key, value in expected.items() if found.get(key) != value}
                if wrong:
                    problems.append(f"{server} {protocol} {name}: {json.dumps(wrong, sort_keys=True)}, expected "
                                    f"{json.dumps({k: expected[k] for k in wrong}, sort_keys=True)}")
                trained = served.metadata[server][trained_name].get(protocol)
                if name != trained_name and isinstance(trained, dict) and {**found, "name": trained_name} != trained:
                    problems.append(f"{server} {protocol} {name}: {json.dumps(found, sort_keys=True)} is not "
                                    f"{trained_name}'s {json.dumps(trained, sort_keys=True)} but for the name")
    return problems


def top_two_margins(logits: np.ndarray) -> np.ndarray:
    """Per row, the largest logit minus the second largest."""
    top = np.sort(logits, axis=1)[:, -2:]
    return top[:, 1] - top[:, 0]


def thread_note(served: Served, server: str, run: dict[str, Any]) -> str:
    """Like with like: the thread count the server ran with (the serve stage's index) against the one the export
    it is held to recorded (`run`'s, from the export.json integrity.py checked), which set the last bits of the
    in-process logits; the servers take the export's (pipelines/serving/servers.py, export_threads), so they
    differ only where one was made elsewhere."""
    ran = served.index.get("servers", {}).get(server, {}).get("threads")
    made = run.get("threads")
    if ran == made:
        return "" if ran is None else f", both at {ran} threads"
    return f"; the server ran at {ran} threads, the export at {made}: a server must run with its export's count"


def serving_checks(spec: Spec, ledger: Ledger, arch: str, runs: dict[str, dict[str, Any]], batch: np.ndarray,
                   config: ModelConfig, served: Served) -> dict[str, Any]:
    """Every serving check of one model (see the module's docstring), and its figures for validation.json."""
    if served.off is not None:
        return {"model": arch, "off": served.off}  # the serve stage says why it served nothing; nothing to judge
    tol = spec.tolerances
    record: dict[str, Any] = {"model": arch, "onnx_from": served.onnx_from, "servers": {}, "onnx_vs_native": {},
                              "across_frameworks": {}}
    problems = model_problems(served, arch, batch, (len(batch), config.num_classes))
    ledger.add(arch, METADATA_SUBJECT, names.SERVED_READABLE, float(len(problems)), 0.0, not problems,
               "; ".join(problems[:3]))
    if problems:
        record["problems"] = problems
        return record
    name = served_name(arch)
    logits = {server: {protocol: served.logits[server][protocol][name] for protocol in paths.SERVED_PROTOCOLS}
              for server in served.servers}

    def judge(server: str, subject: str, check: str, expected: np.ndarray, what: str) -> None:
        figures = record["servers"].setdefault(server, {})
        threads = thread_note(served, server, runs[subject])
        for protocol, found in logits[server].items():
            worst, differ = bitwise(found, expected)
            figures[protocol] = {"max_abs": worst, "values_differing": differ}
            ledger.add(arch, subject, names.served(check, protocol), worst, 0.0, differ == 0,
                       f"{differ} of {found.size} logits differ in some bit from {what}{threads}; bit for bit "
                       "required")

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
               "; ".join(problems[:3]) or f"the same on {', '.join(served.servers)}, over REST and gRPC, "
                                           f"{init_name(arch)}'s {name}'s but for the name")
    record["init"] = init_checks(spec, ledger, arch, runs, batch, config, served)
    # Figures only (see the module's docstring): the framework servers pairwise, the worst protocol.
    frameworks = [s for s in served.servers if s != ONNX_SERVER]
    for a, b in itertools.combinations(frameworks, 2):
        record["across_frameworks"][f"{a}|{b}"] = {
            "max_abs": max(max_abs_diff(logits[a][p], logits[b][p]) for p in paths.SERVED_PROTOCOLS),
            "argmax_differ": max(int(np.count_nonzero(logits[a][p].argmax(1) != logits[b][p].argmax(1)))
                                 for p in paths.SERVED_PROTOCOLS)}
    return record


def init_checks(spec: Spec, ledger: Ledger, arch: str, runs: dict[str, dict[str, Any]], batch: np.ndarray,
                config: ModelConfig, served: Served) -> dict[str, Any]:
    """The checks of every server's `<arch>-init` (see the module's docstring), and their figures: each judged
    server's worst protocol against the reference, every pair's worst protocol, the rows judged and excluded by
    the argmax check."""
    tol = spec.tolerances.forward_parity_abs
    name = init_name(arch)
    reference = forward(config, load_weights(paths.init_weights(arch), config), batch)
    answers: dict[str, dict[str, np.ndarray]] = {}  # the judged servers' answers, server -> protocol
    figures: dict[str, Any] = {"tolerance": tol, "vs_reference": {}, "across_servers": {}}

    def bitwise_check(server: str, subject: str, check: str, expected: np.ndarray, what: str) -> None:
        threads = thread_note(served, server, runs[subject])
        for protocol, found in answers[server].items():
            worst, differ = bitwise(found, expected)
            ledger.add(arch, subject, names.served(check, protocol), worst, 0.0, differ == 0,
                       f"{differ} of {found.size} logits of {name} differ in some bit from {what}{threads}; bit "
                       "for bit required")

    for server in served.servers:
        onnx = server == ONNX_SERVER
        subject = served.onnx_from if onnx else server
        if subject not in runs or (not onnx and server not in SERVED_FORMAT):
            continue  # a run that is not judged (integrity.py says why): nothing of it is
        answers[server] = {p: served.logits[server][p][name] for p in paths.SERVED_PROTOCOLS}
        if onnx:
            session = runs[subject]["sessions"].get("init")
            if session is None:  # onnx_checker_init failed and says why
                for protocol in paths.SERVED_PROTOCOLS:
                    ledger.add(arch, subject, names.served(names.SERVED_ONNX_INIT_VS_IN_PROCESS, protocol), None, 0.0,
                               False, f"{paths.init_onnx(arch, subject)}: no ONNX Runtime session (see "
                                      "onnx_checker_init)")
            else:
                bitwise_check(server, subject, names.SERVED_ONNX_INIT_VS_IN_PROCESS, run_onnx(session, batch),
                              f"{paths.init_onnx(arch, subject)} under this stage's own ONNX Runtime session")
        else:
            with np.load(paths.native_outputs(arch, server), allow_pickle=False) as native:
                expected = native[INIT_IN_PROCESS_KEY]
            bitwise_check(server, subject, names.SERVED_INIT_VS_IN_PROCESS, expected,
                          f"{paths.native_outputs(arch, server)}'s {INIT_IN_PROCESS_KEY} (train_export's "
                          "models.predict of the same init model)")
        check = names.SERVED_ONNX_INIT_VS_REFERENCE if onnx else names.SERVED_INIT_VS_REFERENCE
        for protocol, found in answers[server].items():
            ledger.add(arch, subject, names.served(check, protocol), max_abs_diff(found, reference), tol,
                       detail=f"the {server} server's {name} against the float64 reference forward of "
                              f"{paths.init_weights(arch)}; absolute, tolerances.forward_parity_abs")
        figures["vs_reference"][server] = max(max_abs_diff(found, reference) for found in answers[server].values())
    for a, b in itertools.combinations(answers, 2):
        worst = max(max_abs_diff(answers[a][p], answers[b][p]) for p in paths.SERVED_PROTOCOLS)
        figures["across_servers"][f"{a}|{b}"] = worst
        ledger.add(arch, f"{a}|{b}", names.SERVED_INIT_ACROSS_SERVERS, worst, tol,
                   detail=f"{name}: the {a} and {b} servers, the worst of {', '.join(paths.SERVED_PROTOCOLS)}; "
                          "tolerances.forward_parity_abs, as forward_parity_init_onnx holds init.onnx pairs")
    if answers:
        margin = 2 * tol
        judged = top_two_margins(reference) > margin
        expected = reference.argmax(axis=1)
        differ = np.zeros(len(batch), bool)
        for server in answers.values():
            for found in server.values():
                differ |= found.argmax(axis=1) != expected
        differ &= judged
        excluded = int(np.count_nonzero(~judged))
        figures["argmax"] = {"margin_above": margin, "rows_judged": int(np.count_nonzero(judged)),
                             "rows_excluded": excluded, "rows_differing": int(np.count_nonzero(differ))}
        rows = np.flatnonzero(differ)[:5].tolist()
        ledger.add(arch, METADATA_SUBJECT, names.SERVED_INIT_ARGMAX_ACROSS_SERVERS, float(np.count_nonzero(differ)),
                   0.0, detail=f"{name} on {', '.join(answers)}, every protocol: rows {rows} classified otherwise "
                               f"than the reference; {excluded} of {len(batch)} rows excluded "
                               f"(reference top-two margin at most {margin:.0e}, 2 x tolerances.forward_parity_abs)")
    return figures
