"""The ONNX conventions every exporter meets, stated once: what a consumer of any Rosetta model.onnx can rely on.

- one input: "images", float32 (batch, height, width) in [0, 1], or, for a token model, "tokens", int64
  (batch, length) with a dynamic "length" too (rosetta_common.inputs);
- one output named "logits", float32 (batch, classes);
- the batch dimension is dynamic and named "batch" on both (the exporters' own names differ: torch.onnx
  "batch", jax2onnx whatever it is given, tf2onnx "unk__<n>" and an unnamed output dimension);
- the opset is pinned per exporter (below), so a converter upgrade cannot change it silently.

Works on an `onnx.ModelProto` without importing onnx (common has numpy-level dependencies only).
"""

from __future__ import annotations

from typing import Any

from rosetta_common.errors import ExportError

INPUT_NAME = "images"  # an image model's input (rosetta_common.inputs.InputSpec.name)
TOKENS_NAME = "tokens"  # a token model's input
OUTPUT_NAME = "logits"
BATCH_DIM = "batch"
LENGTH_DIM = "length"  # a token input's second, dynamic, dimension
INT64 = 7  # onnx.TensorProto.INT64, without importing onnx

# Opset policy, one per exporter. Each is the converter's own default or the newest it writes reliably, and
# all run in ONNX Runtime 1.32. They differ on purpose: forcing one opset through three converters would
# test the converters' down-conversion paths instead of their main ones; outputs are compared, not graphs.
OPSETS = {
    "torch": 20,  # torch.onnx (dynamo) default in torch 2.13
    "tf": 17,  # tf2onnx 1.17's default is 15; 17 adds LayerNormalization-era ops and runs everywhere we need
    "jax": 23,  # jax2onnx 0.17's default
}


def _dims(value_info: Any) -> list[Any]:
    return list(value_info.type.tensor_type.shape.dim)


def conform(model: Any, framework: str) -> Any:
    """Name the batch dimension "batch" on the input, the output and every intermediate that shares it,
    then check the conventions; returns the same (modified) ModelProto. Raises ExportError naming what is off."""
    graph = model.graph
    strip_source_paths(model)
    if len(graph.input) == 1 and _dims(graph.input[0]):
        names = [BATCH_DIM, LENGTH_DIM] if graph.input[0].name == TOKENS_NAME else [BATCH_DIM]
        for dim_index, name in enumerate(names):
            old = _dims(graph.input[0])[dim_index].dim_param
            if old and old != name:
                for info in (*graph.input, *graph.output, *graph.value_info):
                    for dim in _dims(info):
                        if dim.dim_param == old:
                            dim.dim_param = name
    for out in graph.output:  # tf2onnx leaves the output's batch unnamed (or names it apart from the input's)
        dims = _dims(out)
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_param = BATCH_DIM
    problems = violations(model, framework)
    if problems:
        raise ExportError(f"{framework} ONNX export: {'; '.join(problems)}")
    return model


def strip_source_paths(model: Any) -> Any:
    """Drop the debugging records that quote source files by absolute path (torch.onnx writes a Python stack trace
    into every node's metadata): they would put paths of this machine into an artifact and make its bytes depend on
    where the checkout lives. Op names, scopes and class hierarchies stay."""
    for node in model.graph.node:
        node.doc_string = ""
        kept = [entry for entry in node.metadata_props if "stack_trace" not in entry.key]
        if len(kept) != len(node.metadata_props):
            copies = [type(entry)() for entry in kept]
            for copy, entry in zip(copies, kept, strict=True):
                copy.CopyFrom(entry)
            del node.metadata_props[:]
            node.metadata_props.extend(copies)
    return model


def violations(model: Any, framework: str) -> list[str]:
    """Every way `model` breaks the conventions (empty when it meets them)."""
    graph, problems = model.graph, []
    inputs = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    outputs = [o.name for o in graph.output]
    if inputs not in ([INPUT_NAME], [TOKENS_NAME]):
        problems.append(f"inputs {inputs}, expected [{INPUT_NAME!r}] or [{TOKENS_NAME!r}]")
    elif inputs == [TOKENS_NAME]:
        tokens = graph.input[0]
        dims = _dims(tokens)
        if tokens.type.tensor_type.elem_type != INT64:
            found = tokens.type.tensor_type.elem_type
            problems.append(f"{TOKENS_NAME}: element type {found}, expected int64 ({INT64})")
        if len(dims) != 2 or dims[1].dim_param != LENGTH_DIM:
            second = (dims[1].dim_param or dims[1].dim_value) if len(dims) > 1 else None
            problems.append(f"{TOKENS_NAME}: length dimension {second!r}, expected dynamic {LENGTH_DIM!r}")
    if outputs != [OUTPUT_NAME]:
        problems.append(f"outputs {outputs}, expected [{OUTPUT_NAME!r}]")
    for info in (*graph.input[:1], *graph.output[:1]):
        dims = _dims(info)
        if len(dims) < 2 or dims[0].dim_param != BATCH_DIM:
            first = (dims[0].dim_param or dims[0].dim_value) if dims else None
            problems.append(f"{info.name}: batch dimension {first!r}, expected dynamic {BATCH_DIM!r}")
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None)
    if framework in OPSETS and opset != OPSETS[framework]:
        problems.append(f"opset {opset}, the policy for {framework} is {OPSETS[framework]}")
    return problems


def canonical_names(model: Any) -> Any:
    """Put the graph in a canonical form: nodes in a deterministic topological order, and every internal tensor and
    node renamed by its position, so that a converter's process-global state cannot change the file's bytes.
    tf2onnx numbers the names it makes with one counter for the whole process, and listed the same nodes and
    initializers in different orders in two runs of the same conversion. Graph inputs and outputs keep their
    names. A graph with subgraphs (Loop, Scan, If) is left as it is: its inner names refer to outer ones.
    Returns the same (modified) ModelProto."""
    import hashlib

    graph = model.graph
    if any(attr.g.node or attr.graphs for node in graph.node for attr in node.attribute):
        return model
    keep = {i.name for i in graph.input} | {o.name for o in graph.output}
    constants = {}
    for tensor in graph.initializer:
        anonymous = type(tensor)()
        anonymous.CopyFrom(tensor)
        anonymous.name = ""
        constants[tensor.name] = hashlib.sha256(anonymous.SerializeToString()).hexdigest()
    renamed: dict[str, str] = {}

    def new(name: str) -> str:
        if name in keep or name == "":
            return name
        if name not in renamed:
            renamed[name] = f"t{len(renamed)}"
        return renamed[name]

    def identity(name: str) -> tuple[str, str]:
        """What an input is, independent of the converter's names: a placed node's output by its new name, a graph
        input by its name, an initializer by its content."""
        if name in renamed:
            return ("tensor", renamed[name])
        if name in constants:
            return ("constant", constants[name])
        return ("input", name)

    def key(node: Any) -> tuple[Any, ...]:
        attributes = b"".join(a.SerializeToString() for a in node.attribute)
        return (node.op_type, node.domain, attributes, tuple(identity(n) for n in node.input))

    # Kahn's algorithm, always taking the ready node with the smallest key: the same graph gives the same order.
    available = set(keep) | set(constants) | {""}
    pending, order = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            return model  # not a plain DAG of known names: leave it untouched rather than guess
        node = min(ready, key=key)
        pending.remove(node)
        available.update(node.output)  # later nodes still name their inputs the converter's way
        node.input[:] = [new(n) for n in node.input]  # constants get their names at first use
        node.output[:] = [new(n) for n in node.output]
        node.name = f"{node.op_type}_{len(order)}"
        copy = type(node)()
        copy.CopyFrom(node)
        order.append(copy)
    del graph.node[:]
    graph.node.extend(order)
    for tensor in sorted((t for t in graph.initializer if t.name not in renamed), key=lambda t: constants[t.name]):
        new(tensor.name)  # initializers no node reads: named last, in the order of their contents
    for tensor in graph.initializer:
        tensor.name = renamed.get(tensor.name, tensor.name)
    position = {name: i for i, name in enumerate(renamed.values())}
    tensors = sorted(graph.initializer, key=lambda t: position.get(t.name, len(position)))
    copies = [type(t)() for t in tensors]
    for copy, tensor in zip(copies, tensors, strict=True):
        copy.CopyFrom(tensor)
    del graph.initializer[:]
    graph.initializer.extend(copies)
    for info in graph.value_info:
        info.name = renamed.get(info.name, info.name)
    return model
