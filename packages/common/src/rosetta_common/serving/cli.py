"""The command line every model server takes, and the run folders it names.

    python -m rosetta_torch.serve --artifacts artifacts/torch --init artifacts/init --http-port 8500 \
        --grpc-port 8501 [--models mlp cnn] [--host 127.0.0.1] [--max-body-bytes 16777216]

The same flags for all four servers (the manifests under deploy/kserve/ and the container route build theirs
with it), each refused with one line naming the flag, the value and what is allowed. REST and gRPC listen on
127.0.0.1 unless told (`--host 0.0.0.0` in a container: only the network its stage made reaches it). No kserve:
the orchestrator, which has none, builds and checks these command lines too.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from rosetta_common.serving.names import INIT_SUFFIX, served_name

HOST = "127.0.0.1"  # loopback: no server is meant to be reached from another machine (a container: its network)
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # a REST body or gRPC message; 1024 MNIST images as V2 JSON are ~9 MB


def parse_args(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--artifacts", type=Path, required=True,
                        help="a framework's artifacts folder (artifacts/<framework>): one run folder per model")
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help="serve only these run folders (default: every one there)")
    parser.add_argument("--init", type=Path, required=True,
                        help="the init stage's folder (artifacts/init): each model's canonical init weights, served "
                             f"as <model>{INIT_SUFFIX}")
    # A container's server listens on its own interfaces (0.0.0.0), which only the network its stage made reaches.
    parser.add_argument("--host", default=HOST,
                        help=f"the IPv4 address REST and gRPC listen on (default {HOST}; in a container 0.0.0.0)")
    parser.add_argument("--http-port", type=int, required=True, help="V1 and V2 REST, on --host")
    parser.add_argument("--grpc-port", type=int, required=True, help="V2 gRPC, on --host")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"the largest REST body or gRPC message accepted (default {DEFAULT_MAX_BODY_BYTES})")
    args = parser.parse_args(argv)
    try:
        ipaddress.IPv4Address(args.host)
    except ValueError:
        parser.error(f"--host {args.host}: not an IPv4 address; allowed: e.g. {HOST} (default) or 0.0.0.0")
    for flag, port in (("--http-port", args.http_port), ("--grpc-port", args.grpc_port)):
        if not 1 <= port <= 65535:
            parser.error(f"{flag} {port}: not a port; allowed: 1 to 65535")
    if args.http_port == args.grpc_port:
        parser.error(f"--grpc-port {args.grpc_port}: the same as --http-port; allowed: two different ports")
    if not args.init.is_dir():
        parser.error(f"--init {args.init}: not a folder; allowed: the init stage's folder, e.g. artifacts/init")
    if args.max_body_bytes < 1024:
        parser.error(f"--max-body-bytes {args.max_body_bytes}: too small; allowed: 1024 or more")
    return args


def find_models(artifacts: Path, wanted: Sequence[str] | None, served_file: Path) -> dict[str, Path]:
    """Model name (the run folder's) -> run folder: every subfolder of `artifacts` holding `served_file`, sorted by
    name (or the `wanted` ones, in their order; a wanted name may be the folder's or its served name,
    text-transformer for text_transformer). SystemExit with one line when one is missing, or when a folder's name
    cannot be served (served_name) or two folders would be served under one name."""
    if not artifacts.is_dir():
        raise SystemExit(f"error: --artifacts {artifacts}: not a folder; allowed: a framework's artifacts folder, "
                         "e.g. artifacts/torch")
    found = {run.name: run for run in sorted(artifacts.iterdir()) if (run / served_file).exists()}
    if not found:
        raise SystemExit(f"error: --artifacts {artifacts}: no run folder holds {served_file}")
    chosen = []
    for name in wanted or ():
        folder = name if name in found else next((f for f in found if f.replace("_", "-") == name), None)
        if folder is None:
            raise SystemExit(f"error: --models {name}: {artifacts / name / served_file} is missing; allowed: "
                             f"{', '.join(found)}")
        chosen.append(folder)
    runs = {name: found[name] for name in chosen} if wanted else found
    names: dict[str, str] = {}
    for folder in runs:
        try:
            served = served_name(folder)
        except ValueError as error:
            raise SystemExit(f"error: --artifacts {artifacts}: {error}") from None
        if names.setdefault(served, folder) != folder:
            raise SystemExit(f"error: --artifacts {artifacts}: run folders {names[served]} and {folder} would both "
                             f"be served as {served!r}; allowed: one of them (--models)")
    return runs
