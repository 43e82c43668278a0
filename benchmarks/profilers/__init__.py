"""Each framework's own profiler behind the same two names, for benchmarks/step_profile.py.

One module per framework (`torch`, `tf`, `jax`), each with `sync(model)` (wait until the steps dispatched so far
are done), `start(folder)` (begin recording, the trace written under `folder` where the profiler writes one) and
`stop(folder) -> list[OpTime]` (end recording; the time spent in each operation the framework ran, summed by its
name). What an operation is, is the framework's: an ATen operator's
self time (torch.profiler), an XLA-compiled HLO instruction's run (the events carrying `hlo_op` in the XSpace that
TF's and JAX's profilers write: TF's Keras step and JAX's step are XLA programs on a CPU). Each module is imported
only inside its framework's environment (through the runner): nothing here imports a framework at package level.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class OpTime:
    name: str  # the operator's name (aten::mm) or the compiled instruction's (fusion.3, MatMul.8, ynn_fusion)
    seconds: float  # summed over its calls, on whichever thread ran it
    calls: int
    module: str = ""  # the compiled program (HLO module) the instruction belongs to; "" for an operator


def summed(events: Iterable[tuple[str, str, float]]) -> list[OpTime]:
    """(module, name, seconds) events summed by module and name, the longest first."""
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    for module, name, duration in events:
        seconds[module, name] += duration
        calls[module, name] += 1
    ops = [OpTime(name, seconds[module, name], calls[module, name], module) for module, name in seconds]
    return sorted(ops, key=lambda op: -op.seconds)


# A torch operator that multiplies matrices or convolves (its self time is the BLAS or oneDNN call).
TORCH_MATMUL = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|_?convolution.*|mkldnn_convolution|linear)$")
COMPUTATION = re.compile(r"^(?:ENTRY )?%([^\s(]+) \(")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([^\s=]+) = (.*)$")
OPCODE = re.compile(r"\b([a-z][a-z0-9_-]*)\(")
CALLS = re.compile(r"\bcalls=%([^\s,}]+)")
OP_NAME = re.compile(r'op_name="([^"]*)"')
CONTROL_FLOW = ("while", "conditional", "call")


Instruction = tuple[str, str, str | None, str]  # name, opcode, the computation it calls, its op_name


def computations(text: str) -> dict[str, list[Instruction]]:
    """An HLO module's text: each computation's instructions."""
    found: dict[str, list[Instruction]] = {}
    current: list[Instruction] = []
    for line in text.splitlines():
        if header := COMPUTATION.match(line):
            current = found.setdefault(header.group(1), [])
        elif instruction := INSTRUCTION.match(line):
            rest = instruction.group(2)
            opcode, calls, op_name = OPCODE.search(rest), CALLS.search(rest), OP_NAME.search(rest)
            current.append((instruction.group(1), opcode.group(1) if opcode else "", calls.group(1) if calls else None,
                            op_name.group(1) if op_name else ""))
    return found


def dot_in(module: dict[str, list[Instruction]], computation: str, seen: frozenset[str] = frozenset()) -> str | None:
    """The op_name of a dot or convolution in `computation` or in what it calls, or None."""
    for _, opcode, calls, op_name in module.get(computation, []):
        if opcode in ("dot", "convolution"):
            return op_name or opcode
        if calls and calls not in seen and (found := dot_in(module, calls, seen | {computation})) is not None:
            return found
    return None


def compiled_kinds(dump: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(module, instruction) -> (kind, source) for every instruction of the optimized HLO that XLA dumped
    (`--xla_dump_to=dump --xla_dump_hlo_as_text`). Kind "matmul": a dot or convolution, or a fusion holding one;
    "control flow": a loop, branch or call (its run holds its body's); else "other". Source: the framework op it
    came from (its metadata's op_name; the dot's, for a fusion holding one)."""
    kinds: dict[tuple[str, str], tuple[str, str]] = {}
    for path in sorted(dump.glob("*after_optimizations.txt")):
        text = path.read_text()
        name = text.split(",", 1)[0].removeprefix("HloModule ").strip()
        module = computations(text)
        for instructions in module.values():
            for instruction, opcode, calls, op_name in instructions:
                if opcode in CONTROL_FLOW:
                    kinds[name, instruction] = ("control flow", op_name or opcode)
                    continue
                dot = op_name if opcode in ("dot", "convolution") else dot_in(module, calls) if calls else None
                kinds[name, instruction] = ("matmul", dot) if dot is not None else ("other", op_name or opcode)
    return kinds


def kind_of(op: OpTime, kinds: dict[tuple[str, str], tuple[str, str]]) -> tuple[str, str]:
    """An operator's or compiled instruction's kind and source (compiled_kinds; a torch operator by its name)."""
    if not op.module:
        return ("matmul" if TORCH_MATMUL.match(op.name) else "other"), op.name
    return kinds.get((op.module, op.name), ("other", "?"))
