"""What an ONNX file holds, read with `onnx` alone: size, opsets, producer, nodes and op histogram, I/O."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import GraphProto, TensorProto


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: list[str]  # a fixed size as digits, a symbolic one by its name ("batch", "B", "unk__12"), "?" if none

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(self.shape)}]"


@dataclass
class OnnxSummary:
    path: str
    bytes: int
    ir_version: int
    producer: str
    opsets: dict[str, int]  # domain ("" is the default ai.onnx) -> version
    nodes: int  # every node, subgraphs and local functions included
    ops: Counter[str] = field(default_factory=Counter)  # op type ("domain:Op" outside ai.onnx) -> count
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)
    initializers: int = 0
    initializer_values: int = 0  # total elements: comparable with the model's parameter count
    functions: int = 0

    @property
    def opset(self) -> int | None:
        return self.opsets.get("", self.opsets.get("ai.onnx"))


def _dim(dim: onnx.TensorShapeProto.Dimension) -> str:
    if dim.HasField("dim_value"):
        return str(dim.dim_value)
    return dim.dim_param or "?"


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    tensor = value.type.tensor_type
    dtype = TensorProto.DataType.Name(tensor.elem_type).lower() if tensor.elem_type else "?"
    shape = [_dim(d) for d in tensor.shape.dim] if tensor.HasField("shape") else ["?"]
    return TensorInfo(value.name, dtype, shape)


def _op_name(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def _count(graph: GraphProto, ops: Counter[str]) -> None:
    """Count nodes, descending into control-flow subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        ops[_op_name(node)] += 1
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _count(attribute.g, ops)
            for sub in attribute.graphs:
                _count(sub, ops)


def summarize(path: Path, display_path: str | None = None) -> OnnxSummary:
    # External data is not needed to read the graph, and may be large.
    model = onnx.load(str(path), load_external_data=False)
    ops: Counter[str] = Counter()
    _count(model.graph, ops)
    for function in model.functions:
        for node in function.node:
            ops[_op_name(node)] += 1
    # Initializers that are also listed as graph inputs (old exporters) are weights, not inputs.
    weights = {init.name for init in model.graph.initializer}
    producer = " ".join(filter(None, [model.producer_name, model.producer_version])) or "unknown"
    return OnnxSummary(
        path=display_path or str(path),
        bytes=path.stat().st_size,
        ir_version=model.ir_version,
        producer=producer,
        opsets={imp.domain: imp.version for imp in model.opset_import},
        nodes=sum(ops.values()),
        ops=ops,
        inputs=[_tensor_info(v) for v in model.graph.input if v.name not in weights],
        outputs=[_tensor_info(v) for v in model.graph.output],
        initializers=len(model.graph.initializer),
        initializer_values=sum(int(np.prod(init.dims)) for init in model.graph.initializer),
        functions=len(model.functions),
    )
