"""Running Rosetta's model servers from the pipeline: everything about serving that lives outside the packages.

    servers     start the four servers (torch, tf, jax, onnx) as processes on loopback, wait until ready, stop
    client      one batch through V1 REST, V2 REST and V2 gRPC, the logits back as numpy arrays
    containers  the same servers as containers on an internal network of their own (ROSETTA_RUNTIME=container)
    probe       one readiness look from inside a server's container
    onnx        the ONNX Runtime model server (the validation environment has no framework package)

`python -m pipelines.serving` runs servers.main (`make serve`). What the servers themselves share, the protocols
and the command line, is rosetta_common.serving; the serve stage (pipelines/stages/serve.py) builds on these.
"""
