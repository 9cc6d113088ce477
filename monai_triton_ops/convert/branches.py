"""Control flow a conversion kept, and the inputs that probe each way it can go.

TorchScript made by ``torch.jit.script`` keeps an ``if`` or a loop on a tensor's value (``prim::If``,
``prim::Loop``), which the ONNX exporter writes as ``If`` / ``Loop``; a ``.pt2`` keeps ``torch.cond`` and
``while_loop``. Such a model runs the branch the data picks, so the one probe ``convert`` checks takes one
branch only. When the converted model holds control flow, it is also checked against the source on
variants of the probe (``VARIANTS``: negated, zeros, shifted, scaled), and for ONNX the condition of each
top-level ``If`` is read back (as an extra output) to tell how many were seen going both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import onnx

#: ONNX operators that hold a subgraph run as the data decides: ``If``'s branches, ``Loop``'s and ``Scan``'s bodies.
ONNX_CONTROL_FLOW = ("If", "Loop", "Scan")
#: ``torch.export`` higher-order operators of the same kind.
PROGRAM_CONTROL_FLOW = ("cond", "while_loop", "map", "scan")
#: Variants of a floating-point probe input, meant to send a condition on its values the other way.
VARIANTS: tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor]], ...] = (
    ("negated", torch.neg),
    ("zeros", torch.zeros_like),
    ("shifted +4", lambda t: t + 4.0),
    ("shifted -4", lambda t: t - 4.0),
    ("scaled x10", lambda t: t * 10.0),
)


@dataclass(frozen=True)
class ControlFlow:
    """The control-flow operators a converted model holds whose branch or trip count depends on the input's
    values (``ops``), and of its top-level ``If`` nodes how many the probes saw take both branches
    (``None``: not read, as for a ``.pt2``). Loops over shapes (InstanceNorm's, MONAI's padding) are left out."""

    ops: tuple[str, ...]
    conditions: int = 0
    both_ways: int | None = None

    def describe(self) -> str:
        """One line for the CLI, e.g. ``control flow on the data kept (If x1), checked on ...``."""
        if not self.ops:
            return ""
        counts = ", ".join(f"{op} x{self.ops.count(op)}" for op in dict.fromkeys(self.ops))
        text = f"control flow on the data kept ({counts}), checked on the probe and {len(VARIANTS)} variants of it"
        if self.both_ways is None or not self.conditions:
            return text
        return f"{text}; {self.both_ways} of {self.conditions} top-level If seen taking both branches"


def variants(probe: Sequence[torch.Tensor]) -> Iterator[tuple[str, list[torch.Tensor]]]:
    """``(label, inputs)`` per variant: floating-point inputs changed by it, the others as they are."""
    for label, change in VARIANTS:
        yield label, [change(t) if t.is_floating_point() else t for t in probe]


def onnx_control_flow(graph: onnx.GraphProto) -> list[str]:
    """The op types of the ``If``/``Loop`` nodes whose condition or trip count depends on the values of the
    graph's inputs (through any node but ``Shape``/``Size``), and of every control-flow node inside a subgraph
    (its dependence is not followed)."""
    import onnx

    producers = {output: node for node in graph.node for output in node.output}
    inputs = {i.name for i in graph.input} - {i.name for i in graph.initializer}
    found = []
    for node in graph.node:
        steering = node.input[:2] if node.op_type == "Loop" else node.input[:1] if node.op_type == "If" else []
        if any(name and _on_values(name, producers, inputs) for name in steering):
            found.append(node.op_type)
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            found += [n.op_type for sub in subgraphs for n in _all_nodes(sub) if n.op_type in ONNX_CONTROL_FLOW]
    return found


def _on_values(name: str, producers: dict[str, onnx.NodeProto], inputs: set[str]) -> bool:
    """Whether tensor ``name`` is computed from an input's values (not only from shapes and constants)."""
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        if current in inputs:
            return True
        node = producers.get(current)
        if current in seen or node is None or node.op_type in ("Shape", "Size"):
            continue
        seen.add(current)
        stack += [i for i in node.input if i]
    return False


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    import onnx

    for node in graph.node:
        yield node
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for sub in subgraphs:
                yield from _all_nodes(sub)


def with_conditions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of an ONNX model whose top-level ``If`` conditions are extra outputs, and those outputs' names.

    A condition that is a graph input or initializer is left out: it is no branch the data takes.
    """
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    fixed = {i.name for i in graph.initializer} | {o.name for o in graph.output}
    names = list(dict.fromkeys(n.input[0] for n in graph.node if n.op_type == "If" and n.input[0] not in fixed))
    for name in names:
        graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.BOOL, None))
    return copy, names


def program_control_flow(module: torch.nn.Module) -> list[str]:
    """The higher-order control-flow operators (``cond``, ``while_loop``...) of a program's graph module."""
    graph = getattr(module, "graph", None)
    if graph is None:
        return []
    return [str(n.target) for n in graph.nodes if n.op == "call_function" and str(n.target) in PROGRAM_CONTROL_FLOW]
