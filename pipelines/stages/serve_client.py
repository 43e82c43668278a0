"""The serve stage's client: each model's validation batch and metadata through every protocol of every server.

    python -m pipelines.runner validation -- python -m pipelines.stages.serve_client <config.json>

pipelines/stages/serve.py starts it once every server is ready (dvc.yaml's command names this module; DVC never
runs it alone). It runs in the validation environment, not the orchestrator's, because gRPC needs KServe's
generated stubs and grpcio, which the orchestrator lacks; REST goes through the same pipelines.serving.client.
It writes each first answer where the stage publishes, and the request latencies outside it, as measurements; a
request that fails is one `error:` line naming the server, the protocol and the model, and exit 1. The config and
the files: main and serve_one below; what the stage publishes: docs/serving.md, 'The serve stage'.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import numpy as np

from pipelines import paths
from pipelines.serving import client as serving_client
from rosetta_common.io import read_json, write_json


class ClientError(Exception):
    """A request that got no usable answer; the message names the server, the protocol and the model."""


def grpc_metadata(stub: Any, model: str) -> dict[str, Any]:
    """V2 model metadata over gRPC, as the REST answer spells it (name, versions, platform, inputs, outputs)."""
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    meta = serving_client.grpc_call(stub.ModelMetadata, pb.ModelMetadataRequest(name=model))
    return {"name": meta.name, "versions": list(meta.versions), "platform": meta.platform,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs]}


def timed(call: Any, repeats: int) -> tuple[Any, list[float]]:
    """The first answer of `call()` and the seconds each of `repeats` calls took."""
    first, seconds = None, []
    for i in range(repeats):
        started = time.perf_counter()
        answer = call()
        seconds.append(time.perf_counter() - started)
        if i == 0:
            first = answer
    return first, seconds


def serve_one(name: str, server: dict[str, str], models: list[str], batches: dict[str, np.ndarray], out: Path,
              repeats: int) -> dict[str, dict[str, list[float]]]:
    """Every model of one server through every protocol, each with its own batch (`batches`: served name ->
    batch), `repeats` timed requests each; writes `<out>/<server>/<protocol>.npz` (one float32 array per served
    name, the first answer: np.savez, no pickle) and `<out>/<server>/metadata.json` (each served name's V2
    metadata over REST and gRPC), and returns each request's seconds (protocol -> model)."""
    stub = serving_client.grpc_stub(server["grpc"])
    senders = {
        "v1": lambda model: serving_client.predict_v1(server["url"], model, batches[model]),
        "v2": lambda model: serving_client.infer_v2(server["url"], model, batches[model]),
        "grpc": lambda model: serving_client.infer_grpc(server["grpc"], model, batches[model], stub),
    }
    assert tuple(senders) == paths.SERVED_PROTOCOLS
    seconds: dict[str, dict[str, list[float]]] = {}
    metadata: dict[str, Any] = {}
    for protocol, send in senders.items():
        logits = {}
        for model in models:
            try:
                logits[model], seconds.setdefault(protocol, {})[model] = timed(lambda m=model, s=send: s(m), repeats)
            except serving_client.RequestFailed as error:
                raise ClientError(f"the {name} server: {protocol} {model}: refused ({error})") from None
            except (urllib.error.URLError, OSError) as error:  # refused or reset: the server went away
                raise ClientError(f"the {name} server: {protocol} {model}: no answer "
                                  f"({getattr(error, 'reason', error)})") from None
        path = paths.served_logits(name, protocol, out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            np.savez(f, **logits)
    for model in models:
        try:
            rest = serving_client.metadata(server["url"], model)
            metadata[model] = {"rest": rest, "grpc": grpc_metadata(stub, model)}
        except serving_client.RequestFailed as error:
            raise ClientError(f"the {name} server: metadata {model}: refused ({error})") from None
        except (urllib.error.URLError, OSError) as error:
            raise ClientError(f"the {name} server: metadata {model}: no answer "
                              f"({getattr(error, 'reason', error)})") from None
    write_json(paths.served_metadata(name, out), metadata)
    return seconds


# The config, written by the stage: {"servers": {name: {"url": REST base, "grpc": host:port}}, "models": [served
# names], "batches": {served name: a .npy of the validation batch it is sent: float32 images or int64 token ids},
# "out": the folder being published, "timings": a JSON file outside it (measurements, never into "out"),
# "repeats": how many timed requests per model and protocol}.
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Positional: importing kserve parses the command line itself (its ModelServer's options, abbreviations
    # allowed), and took an option "--config" for its own "--configure_logging".
    parser.add_argument("config", type=Path, help="written by pipelines/stages/serve.py")
    args = parser.parse_args(argv)
    config = read_json(args.config)
    loaded = {path: np.load(path, allow_pickle=False) for path in dict.fromkeys(config["batches"].values())}
    batches = {model: loaded[config["batches"][model]] for model in config["models"]}
    out = Path(config["out"])
    timings = {}
    try:
        for name, server in config["servers"].items():
            timings[name] = serve_one(name, server, config["models"], batches, out, int(config["repeats"]))
    except ClientError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    write_json(config["timings"], timings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
