"""deploy/kserve/<server>.yaml: KServe InferenceServices of the four servers, checked offline against KServe's own
CRD schema (deploy/kserve/schema, vendored), and against the servers they start: image, module, command line
(parsed by the servers' own parser), ports, the model store's layout under /mnt/models, and the names its models
are served under (DNS-1123 labels: text_transformer as text-transformer)."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.containers import image_name
from pipelines.serving.servers import SERVERS
from rosetta_common import serving
from rosetta_common.serving import cli
from rosetta_common.spec import load_spec
from tooling.build import kserve_manifests as km

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return km.load_schema()


def committed(server: str) -> dict[str, Any]:
    return yaml.safe_load(km.manifest_path(server).read_text())


def container(document: dict[str, Any]) -> dict[str, Any]:
    (only,) = document["spec"]["predictor"]["containers"]
    return only


def test_the_vendored_schema_is_the_one_recorded() -> None:
    source = json.loads(km.SOURCE.read_text())
    assert hashlib.sha256(km.SCHEMA.read_bytes()).hexdigest() == source["schema_sha256"]
    assert source["url"].startswith("https://github.com/kserve/kserve/") and source["tag"] in source["url"]


@pytest.mark.parametrize("server", SERVERS)
def test_committed_manifest_is_what_the_module_writes(server: str) -> None:
    """Drift from SERVERS, the runner's pins or the ports fails here: rerun `python -m tooling.build.kserve_manifests
    write`. OPENBLAS_CORETYPE is left out on both sides: the runner drops it on a CPU without AVX2."""
    def without_openblas(document: dict[str, Any]) -> dict[str, Any]:
        env = container(document)["env"]
        container(document)["env"] = [item for item in env if item["name"] != "OPENBLAS_CORETYPE"]
        return document

    assert without_openblas(committed(server)) == without_openblas(yaml.safe_load(km.render(server)))


@pytest.mark.parametrize("server", SERVERS)
def test_manifest_validates_against_kserves_schema(server: str, schema: dict[str, Any]) -> None:
    km.check_file(km.manifest_path(server), schema)


@pytest.mark.parametrize("server", SERVERS)
def test_manifest_starts_the_right_server(server: str, tmp_path: Path) -> None:
    env, module = SERVERS[server]
    spec = container(committed(server))
    assert spec["name"] == "kserve-container"  # the container KServe reads STORAGE_URI and ports from
    assert spec["image"] == image_name(env, "cpu")
    assert spec["command"] == ["python", "-m", module]
    assert {p["name"]: p["containerPort"] for p in spec["ports"]} == {"http": 8080, "grpc": 8081}
    variables = {item["name"]: item["value"] for item in spec["env"]}
    assert variables["STORAGE_URI"].startswith("pvc://") and variables["ROSETTA_ENV"] == env
    # The module and everything it imports from us are where PYTHONPATH says, in the layout docs/serving.md copies
    # into the store (the checkout's own paths under /mnt/models).
    roots = [REPO / Path(p).relative_to(km.MODEL_DIR) for p in variables["PYTHONPATH"].split(":")]
    assert any((root / Path(*module.split("."))).with_suffix(".py").is_file() for root in roots), roots
    # The servers' own parser takes the command line, with /mnt/models a folder holding the layout it names.
    store = tmp_path / "models"
    args = [str(store / Path(a).relative_to(km.MODEL_DIR)) if a.startswith(km.MODEL_DIR) else a
            for a in spec["args"]]
    for flag in ("--artifacts", "--init"):
        Path(args[args.index(flag) + 1]).mkdir(parents=True)
    parsed = cli.parse_args(args, "the manifest's command line")
    assert (parsed.http_port, parsed.grpc_port, parsed.host) == (8080, 8081, "0.0.0.0")
    assert parsed.artifacts == store / "artifacts" / (env if server != "onnx" else "torch")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert spec[probe]["httpGet"]["port"] == 8080, probe
    assert spec["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"


@pytest.mark.parametrize("server", SERVERS)
def test_manifest_names_the_models_as_they_are_served(server: str) -> None:
    """The annotation lists every name the server answers to on params.yaml's run, from rosetta_common.serving (the
    one list the servers, the client and the checks use): each model's served name, then its init twin's, every one
    a DNS-1123 label."""
    annotations = committed(server)["metadata"]["annotations"]
    names = annotations[km.SERVED_MODELS].split(", ")
    models = load_spec(REPO / "params.yaml").models
    assert names == serving.served_models(models) == km.served_names()
    assert all(km.DNS_1123_LABEL.fullmatch(name) for name in names)
    assert not any("_" in name for name in names)


def test_the_token_model_is_annotated_under_its_dns_label(schema: dict[str, Any], tmp_path: Path) -> None:
    """With text_transformer among params.yaml's models (added here when it is not), the annotation names it as it
    is served (text-transformer, text-transformer-init, "_" as "-") and the manifest still passes the check."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["models"] = [m for m in params["models"] if m != "text_transformer"] + ["text_transformer"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    names = km.served_names(tmp_path / "params.yaml")
    assert names[-2:] == ["text-transformer", "text-transformer-init"] and "text_transformer" not in names
    document = committed("onnx")
    document["metadata"]["annotations"][km.SERVED_MODELS] = ", ".join(names)
    path = tmp_path / "onnx.yaml"
    path.write_text(yaml.safe_dump(document))
    km.check_file(path, schema)


def planted(change: str) -> dict[str, Any]:
    document = copy.deepcopy(committed("jax"))
    spec = container(document)
    if change == "misspelled field":
        spec["readinesProbe"] = spec.pop("readinessProbe")
    elif change == "port as a string":
        spec["ports"][0]["containerPort"] = "8080"
    elif change == "unknown predictor field":
        document["spec"]["predictor"]["replicas"] = 1
    elif change == "resources not a map":
        spec["resources"] = ["2", "2Gi"]
    elif change == "name not a DNS label":
        document["metadata"]["name"] = "Rosetta_JAX"
    elif change == "wrong kind":
        document["kind"] = "InferenceServices"
    elif change == "model name not a DNS label":
        document["metadata"]["annotations"][km.SERVED_MODELS] += ", text_transformer"
    return document


@pytest.mark.parametrize(("change", "field"), [
    ("misspelled field", "'readinesProbe' was unexpected"),
    ("port as a string", ".spec.predictor.containers[0].ports[0].containerPort: '8080' is not of type 'integer'"),
    ("unknown predictor field", "'replicas' was unexpected"),
    ("resources not a map", ".spec.predictor.containers[0].resources:"),
    ("name not a DNS label", ".metadata.name: 'Rosetta_JAX'"),
    ("wrong kind", ".apiVersion/.kind:"),
    ("model name not a DNS label", ".metadata.annotations.rosetta.served-models: 'text_transformer' is not a model "
                                   "name KServe takes"),
])
def test_planted_invalid_manifest_fails(change: str, field: str, schema: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(planted(change)))
    with pytest.raises(km.ManifestError, match=r"bad\.yaml") as caught:
        km.check_file(path, schema)
    assert field in str(caught.value)


def test_check_command_refuses_a_bad_manifest_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(planted("port as a string")))
    done = subprocess.run([sys.executable, "-m", "tooling.build.kserve_manifests", "check", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {path}: ")
    assert "containerPort: '8080' is not of type 'integer'" in done.stderr
