"""What the four model servers share, written once: rosetta_torch.serve, rosetta_tf.serve, rosetta_jax.serve and
pipelines.serving.onnx serve the same models over the same protocols (KServe's ModelServer: V1 and V2 REST, V2
gRPC), each in its own environment, and add only how their export is loaded and run.

    names       the names a model is served under, the native format each server runs, a batch's hash
    requests    a request read and checked, the model metadata, the answer checked before it is sent
    cli         the command line every server takes
    init_twins  <model>-init: the canonical init weights, loaded and built as train_export builds them
    server      KServe's ModelServer as Rosetta runs it, the served model, the entry point (imports kserve)

It lives in rosetta_common because that is the one package all four can import: the framework packages never
import `pipelines`, and the ONNX server's environment has no framework. No module but `server` imports kserve, so
the orchestrator and the validator import them freely; a client that needs kserve's stubs imports it through
`import_kserve`. The served names are the package's own too (`from rosetta_common.serving import served_name`).
"""

from __future__ import annotations

import sys
from types import ModuleType

from rosetta_common.serving.names import (
    DNS_1123_LABEL,
    INIT_SUFFIX,
    SERVED_FORMAT,
    batch_kind,
    batch_sha256,
    init_name,
    served_models,
    served_name,
)

__all__ = ["DNS_1123_LABEL", "INIT_SUFFIX", "SERVED_FORMAT", "batch_kind", "batch_sha256", "import_kserve",
           "init_name", "served_models", "served_name"]


def import_kserve() -> ModuleType:
    """kserve, imported with this process's command line hidden from it. kserve.model_server parses sys.argv when
    it is first imported (argparse's parse_known_args, which ignores flags it does not know but still exits on an
    abbreviation of its own: `--grpc` of pipelines.serving.client's command line matched three of its flags), so
    every module of ours that uses kserve imports it through here, first."""
    if "kserve.model_server" not in sys.modules:
        argv, sys.argv = sys.argv, sys.argv[:1]
        try:
            import kserve.model_server
        finally:
            sys.argv = argv
    import kserve

    return kserve
