"""KServe InferenceService manifests for the four model servers: written from SERVERS, checked against KServe's schema.

    python -m tooling.build.kserve_manifests write  # deploy/kserve/<server>.yaml from pipelines.serving.servers.SERVERS
    python -m tooling.build.kserve_manifests check [FILE...]  # each manifest against KServe's own CRD schema (offline)
    python -m tooling.build.kserve_manifests vendor CRD.yaml --url URL --tag TAG --commit SHA  # re-vendor the schema

Each manifest is a custom predictor: the server's image and its module's command line, with the model store (the
sources and a finished run's artifacts) mounted from STORAGE_URI. They are written, not hand-kept, so that the
command line, environments and thread pins come from the modules that own them; tests/unit/test_kserve_manifests.py
fails when the committed files drift from what this module writes. The check is as strict as the API server
(`strict` says how), so a field KServe would prune or refuse fails offline, before any cluster sees it. Deploying
them: docs/serving.md, "On KServe".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from pipelines.containers import image_name
from pipelines.environments import ENVIRONMENTS, REPO_ROOT, thread_environment
from pipelines.serving.servers import SERVERS
from rosetta_common.serving import DNS_1123_LABEL, served_models
from rosetta_common.spec import load_spec

DEPLOY = REPO_ROOT / "deploy" / "kserve"
SCHEMA = DEPLOY / "schema" / "inferenceservice-v1beta1.json"
SOURCE = DEPLOY / "schema" / "SOURCE.json"  # where the schema came from: URL, tag, commit, sha256 of the CRD file
API_VERSION, KIND = "serving.kserve.io/v1beta1", "InferenceService"
MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts (or, for pvc://, mounts) STORAGE_URI
# The store holds what the runner mounts for a stage (the images hold no code of ours): the sources, put on
# PYTHONPATH, and the finished run's artifacts, so a server runs the code that made its models.
STORAGE_URI = "pvc://rosetta-store/rosetta"  # PVC rosetta-store, folder rosetta/: docs/serving.md, "On KServe"
HTTP_PORT, GRPC_PORT = 8080, 8081  # KServe's defaults for a ModelServer (its --http_port and --grpc_port)
# Standard (KServe's raw Deployment + Service): the one mode that exposes both ports of a container; Knative takes
# exactly one port per container, so gRPC would be unreachable there.
DEPLOYMENT_MODE = "Standard"
VARIANT = "cpu"
THREADS = "2"  # the runner's default (pipelines/environments.py DEFAULT_THREADS); the CPU request matches it
# A start imports kserve (~6 s of CPU) and the framework and loads every model twice (trained and init): 100 s for
# the four side by side on 2 busy cores (pipelines/serving/servers.py READY_SECONDS), so the startup probe allows
# 300 s.
PROBE_PERIOD_S, STARTUP_FAILURES = 5, 60
# Peak RSS once ready, each manifest's command run on the committed run (trained + init models): tf 671 MB,
# torch 463 MB, jax 368 MB, onnx 202 MB; the limit leaves tf three times that.
RESOURCES = {"requests": {"cpu": THREADS, "memory": "1Gi"}, "limits": {"cpu": THREADS, "memory": "2Gi"}}
# Loaded by the stages' runner too, but meaningless in a pod: where things live on this machine.
_LOCAL_ONLY = ("PATH", "VIRTUAL_ENV", "HOME")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # KServe's rule for an InferenceService name (<= 63)
# ObjectMeta, which a CRD's schema leaves open (the API server checks it natively), gets the checks the API server
# makes of the fields these manifests use (problems).
METADATA_FIELDS = {"name", "namespace", "labels", "annotations"}
PARAMS = REPO_ROOT / "params.yaml"  # whose models the store's finished run holds
# The annotation: every name the server answers to once the store holds params.yaml's models, comma-separated
# (rosetta_common.serving.served_models: each model and its init twin, DNS-1123 labels, so text_transformer is
# `text-transformer`): the names a client puts in /v2/models/<name>, which problems() holds to KServe's own rule
# for a TrainedModel's name.
SERVED_MODELS = "rosetta.served-models"


class ManifestError(ValueError):
    """A manifest KServe's schema (or ObjectMeta's rules) refuses; the message names the file and the field."""


# ------------------------------------------------------------------------------------------------- writing


def python_path(env: str) -> str:
    """What stage_environment puts on PYTHONPATH, under MODEL_DIR: common's sources, the framework package's, the
    repository root (pipelines, for the ONNX server)."""
    paths = ["packages/common/src"]
    if ENVIRONMENTS[env].framework:
        paths.append(f"{ENVIRONMENTS[env].package}/src")
    return ":".join([*(f"{MODEL_DIR}/{p}" for p in paths), MODEL_DIR])


def artifacts_of(server: str) -> str:
    """The artifacts folder a server serves: its framework's, torch's model.onnx files for the ONNX server (as
    pipelines/serving/servers.py ONNX_FROM)."""
    return f"{MODEL_DIR}/artifacts/{server if server != 'onnx' else 'torch'}"


def server_args() -> list[str]:
    """The command line every server takes (rosetta_common.serving.cli.parse_args), less --artifacts."""
    return ["--init", f"{MODEL_DIR}/artifacts/init", "--host", "0.0.0.0",
            "--http-port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT)]


def container_env(env: str) -> list[dict[str, str]]:
    """The variables a stage of `env` runs with (the runner's thread and instruction-set pins, deterministic ops),
    less what only means something on this machine; STORAGE_URI first, as KServe's custom-predictor docs put it."""
    pins = {
        "PYTHONPATH": python_path(env),
        "PYTHONHASHSEED": "0",
        "ROSETTA_ENV": env,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_DETERMINISTIC_OPS": "1",
        **thread_environment({"ROSETTA_THREADS": THREADS}),
    }
    return [{"name": "STORAGE_URI", "value": STORAGE_URI},
            *({"name": k, "value": v} for k, v in pins.items() if k not in _LOCAL_ONLY)]


def probe(path: str, **extra: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": HTTP_PORT}, "periodSeconds": PROBE_PERIOD_S, **extra}


def served_names(params: Path = PARAMS) -> list[str]:
    """Every name a server answers to on the store of params.yaml's run: each model's served name and its init
    twin's (rosetta_common.serving.served_models, the one list every server, client and check uses)."""
    return served_models(load_spec(params).models)


def manifest(server: str) -> dict[str, Any]:
    """The InferenceService of one server of SERVERS."""
    env, module = SERVERS[server]
    container = {
        "name": "kserve-container",  # the name KServe looks for in a custom predictor (its STORAGE_URI, its port)
        "image": image_name(env, VARIANT),
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", module],
        "args": ["--artifacts", artifacts_of(server), *server_args()],
        "env": container_env(env),
        # KServe's Service puts the first port on 80 and the others on their own numbers, and marks a port whose
        # name holds "grpc" as h2c (a ContainerPort has no appProtocol field: the schema refuses one).
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
                  {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}],
        "resources": RESOURCES,
        # Ready when every model is (the server answers /v2/health/ready only after loading them all); alive while
        # the REST server answers; the startup probe holds the other two off while the models load.
        "startupProbe": probe("/v2/health/live", failureThreshold=STARTUP_FAILURES),
        "readinessProbe": probe("/v2/health/ready", failureThreshold=3),
        "livenessProbe": probe("/v2/health/live", failureThreshold=3),
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": f"rosetta-{server}",
            "labels": {"app.kubernetes.io/part-of": "rosetta", "rosetta.environment": env},
            "annotations": {"serving.kserve.io/deploymentMode": DEPLOYMENT_MODE,
                            SERVED_MODELS: ", ".join(served_names())},
        },
        # One replica: the models are small, and results must not depend on which pod answered (all are the same).
        "spec": {"predictor": {"minReplicas": 1, "maxReplicas": 1, "containers": [container]}},
    }


def render(server: str) -> str:
    header = (f"# The {server} server as a KServe InferenceService. Written by "
              "`python -m tooling.build.kserve_manifests write`; do not edit.\n"
              "# Deploying it: docs/serving.md, \"On KServe\".\n")
    return header + yaml.safe_dump(manifest(server), sort_keys=False, width=120)


def manifest_path(server: str) -> Path:
    return DEPLOY / f"{server}.yaml"


# ------------------------------------------------------------------------------------------------- checking


# Why the check is strict: the API server prunes (or, under kubectl's default --validate=strict, refuses) a field its
# structural schema does not declare, while plain JSON Schema lets any extra field through; so every object schema
# that lists properties and does not say x-kubernetes-preserve-unknown-fields is closed here, as kubeconform's strict
# mode closes it, and x-kubernetes-int-or-string becomes "an integer or a string".
def strict(node: Any) -> Any:
    """The schema as the API server applies it (the comment above): closed objects, int-or-string."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get(
            "x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string"):
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    return out


def load_schema(path: Path = SCHEMA) -> dict[str, Any]:
    return strict(json.loads(path.read_text()))


def _where(path: Iterator[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path) or "."


def problems(document: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every way `document` breaks the schema or ObjectMeta's rules, one line each, naming the field."""
    import jsonschema

    found = [f"{_where(error.absolute_path)}: {error.message}"
             for error in sorted(jsonschema.Draft7Validator(schema).iter_errors(document), key=str)]
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        found.append(f".apiVersion/.kind: {document.get('apiVersion')!r}/{document.get('kind')!r}; allowed: "
                     f"{API_VERSION!r}/{KIND!r}")
    metadata = document.get("metadata")
    if isinstance(metadata, dict):
        name = metadata.get("name")
        if not isinstance(name, str) or len(name) > 63 or not DNS_1035.match(name):
            found.append(f".metadata.name: {name!r}; allowed: a DNS-1035 label (a-z first, then a-z, 0-9, '-', "
                         "at most 63)")
        for field in sorted(set(metadata) - METADATA_FIELDS):
            found.append(f".metadata.{field}: not a field these manifests set; allowed: "
                         f"{', '.join(sorted(METADATA_FIELDS))}")
        for field in ("labels", "annotations"):
            values = metadata.get(field, {})
            if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
                found.append(f".metadata.{field}: {values!r}; allowed: a map of strings to strings")
        served = metadata.get("annotations", {}).get(SERVED_MODELS) if isinstance(metadata.get("annotations"),
                                                                                  dict) else None
        for name in (served.split(", ") if isinstance(served, str) else []):
            if len(name) > 63 or not DNS_1123_LABEL.fullmatch(name):
                found.append(f".metadata.annotations.{SERVED_MODELS}: {name!r} is not a model name KServe takes; "
                             "allowed: DNS-1123 labels (a-z, 0-9, '-' inside, at most 63)")
    return found


def check_file(path: Path, schema: Mapping[str, Any]) -> None:
    """ManifestError naming the file and every problem; a file that is not one YAML mapping is one too."""
    try:
        documents = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as error:
        raise ManifestError(f"{path}: not readable YAML ({' '.join(str(error).split())})") from None
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ManifestError(f"{path}: {len(documents)} YAML documents; allowed: one InferenceService mapping")
    found = problems(documents[0], schema)
    if found:
        raise ManifestError(f"{path}: {'; '.join(found)}")


def vendor(crd_file: Path, url: str, tag: str, commit: str) -> None:
    """Write the v1beta1 openAPIV3Schema of an InferenceService CRD file, and where it came from."""
    raw = crd_file.read_bytes()
    crd = yaml.safe_load(raw)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    SCHEMA.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA.write_text(json.dumps(version["schema"]["openAPIV3Schema"], separators=(",", ":"), sort_keys=True) + "\n")
    SOURCE.write_text(json.dumps({"url": url, "tag": tag, "commit": commit, "crd": crd["metadata"]["name"],
                                  "version": "v1beta1", "crd_sha256": hashlib.sha256(raw).hexdigest(),
                                  "schema_sha256": hashlib.sha256(SCHEMA.read_bytes()).hexdigest()}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("write")
    check = commands.add_parser("check")
    check.add_argument("files", nargs="*", type=Path)
    vend = commands.add_parser("vendor")
    vend.add_argument("crd", type=Path)
    for flag in ("--url", "--tag", "--commit"):
        vend.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    if args.command == "write":
        for server in SERVERS:
            manifest_path(server).write_text(render(server))
            print(f"wrote {manifest_path(server).relative_to(REPO_ROOT)}")
    elif args.command == "vendor":
        vendor(args.crd, args.url, args.tag, args.commit)
        print(f"wrote {SCHEMA.relative_to(REPO_ROOT)} and {SOURCE.relative_to(REPO_ROOT)}")
    else:
        schema = load_schema()
        for path in args.files or [manifest_path(server) for server in SERVERS]:
            try:
                check_file(path, schema)
            except ManifestError as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
            print(f"ok: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
