"""``InstanceNormalization`` with its statistics in float64: ONNX Runtime's own sums them in float32.

ONNX Runtime's CPU ``InstanceNormalization`` accumulates a channel's mean and variance in float32: over a 96^3
window (884,736 voxels) of a channel of mean 5, its output is 5.3e-5 from float64, torch's (which accumulates in
double) 5.7e-7. Through the sample UNet's last full-resolution norm that moves the logits by 6.9e-4 and flips 18
near-tied voxels of the sample MRI against ``torch`` (``benchmarks/onnx_near_ties.py``, docs/onnx.md).

Each rewritten node becomes, on ``X`` seen as ``(N, C, S)`` (a ``Reshape``, which ONNX Runtime does in place)::

    Xd   = Cast(X, double)                        the one float64 copy, read twice
    mean = ReduceMean(Xd, axis 2)                  (N, C, 1), float64; m = float(mean)
    var  = max(ReduceSumSquare(Xd, axis 2) / S - mean^2, 0)
    a    = scale / sqrt(var + epsilon)             float64, per (sample, channel)
    b    = B - (mean - m) * a                      the part of the mean float32 cannot hold, folded into B
    Y    = (X - m) * float(a) + float(b)           float32, reshaped back to X's shape

The float64 work on the whole tensor is one ``Cast`` and two reductions; the normalisation is three float32
passes. Centring before scaling keeps the output as exact as float32 allows even when a channel's mean is far
from zero in standard deviations (``X * a + (B - mean * a)``, torch's folded form, rounds two large terms that
cancel: 2.4e-4 off on a constant channel of 9.5). The one-pass variance loses ``mean^2 / var`` times float64's
precision (1e-16): below float32's until a mean is some 10^4 standard deviations from zero.

Rewritten: a top-level ``InstanceNormalization`` (default domain) whose ``scale`` and ``B`` are constant float32
vectors (initializers that are not graph inputs, ``Constant`` nodes, or an ``Identity`` of either), which the
ONNX type rules make ``X``'s type too. Left alone: other types, scale or bias fed at run time, and subgraphs.
Opset 17 and earlier take the reductions' axes as an attribute, 18 and later as an input: both are written.
"""

from __future__ import annotations

from typing import Any

#: The node rewritten, in the default ONNX domain.
OP_TYPE = "InstanceNormalization"


def rewrite_instance_norms(model: Any) -> int:
    """Rewrite ``model``'s top-level instance norms in place (module docstring); returns how many."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    wanted = {name for node in graph.node if _is_instance_norm(node) for name in node.input[1:]}
    constants = _constant_arrays(graph, wanted)
    nodes: list[Any] = []
    rewritten = 0
    for node in graph.node:
        affine = _affine(node, constants) if _is_instance_norm(node) else None
        if affine is None:
            nodes.append(node)
            continue
        new_nodes, initializers = _float64_norm(node, *affine, opset=opset)
        nodes.extend(new_nodes)
        graph.initializer.extend(initializers)
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)  # in the old order: each replacement stands where its node stood
        _drop_unused_constant_nodes(graph)
    return rewritten


def _is_instance_norm(node: Any) -> bool:
    return node.op_type == OP_TYPE and node.domain in ("", "ai.onnx") and len(node.input) == 3


def _affine(node: Any, constants: dict[str, Any]) -> tuple[Any, Any, float] | None:
    """``(scale, B, epsilon)`` of an instance norm whose scale and bias are constant float32 vectors of one
    length, else ``None``."""
    import numpy as np

    scale, bias = constants.get(node.input[1]), constants.get(node.input[2])
    if scale is None or bias is None:
        return None
    if scale.dtype != np.float32 or bias.dtype != np.float32 or scale.ndim != 1 or scale.shape != bias.shape:
        return None
    epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)  # the operator's default
    return scale, bias, float(np.float32(epsilon))  # a float32 attribute, as ONNX Runtime reads it


def _float64_norm(node: Any, scale: Any, bias: Any, epsilon: float, *, opset: int) -> tuple[list[Any], list[Any]]:
    """The nodes (in order) and initializers that replace instance norm ``node`` (module docstring)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    x, y = node.input[0], node.output[0]
    p = f"{y}/norm64/"  # output names are unique in a graph, so these are too
    constants = {
        "flat": np.array([0, 0, -1], np.int64),  # (N, C, S); 0 keeps the dimension
        "spatial": np.array(2, np.int64),
        "scale": scale.astype(np.float64).reshape(-1, 1),  # (C, 1), broadcast against (N, C, 1)
        "bias": bias.astype(np.float64).reshape(-1, 1),
        "eps": np.array(epsilon, np.float64),
        "zero": np.array(0.0, np.float64),
    }
    initializers = [numpy_helper.from_array(value, p + name) for name, value in constants.items()]
    axes: dict[str, Any] = {}
    mean_inputs, square_inputs = [p + "xd"], [p + "xd"]
    if opset >= 18:  # the reductions take their axes as an input
        initializers.append(numpy_helper.from_array(np.array([2], np.int64), p + "axes"))
        mean_inputs.append(p + "axes")
        square_inputs.append(p + "axes")
    else:
        axes = {"axes": [2]}
    make = helper.make_node
    nodes = [
        make("Reshape", [x, p + "flat"], [p + "x"]),
        make("Cast", [p + "x"], [p + "xd"], to=TensorProto.DOUBLE),
        make("ReduceMean", mean_inputs, [p + "mean"], keepdims=1, **axes),
        make("ReduceSumSquare", square_inputs, [p + "sumsq"], keepdims=1, **axes),
        make("Shape", [p + "x"], [p + "shape3"]),
        make("Gather", [p + "shape3", p + "spatial"], [p + "count"], axis=0),
        make("Cast", [p + "count"], [p + "countd"], to=TensorProto.DOUBLE),
        make("Div", [p + "sumsq", p + "countd"], [p + "meansq"]),
        make("Mul", [p + "mean", p + "mean"], [p + "mean2"]),
        make("Sub", [p + "meansq", p + "mean2"], [p + "var_raw"]),
        make("Max", [p + "var_raw", p + "zero"], [p + "var"]),  # rounding may leave a constant channel below 0
        make("Add", [p + "var", p + "eps"], [p + "var_eps"]),
        make("Sqrt", [p + "var_eps"], [p + "std"]),
        make("Div", [p + "scale", p + "std"], [p + "a"]),
        make("Cast", [p + "mean"], [p + "mean32"], to=TensorProto.FLOAT),
        make("Cast", [p + "mean32"], [p + "mean32d"], to=TensorProto.DOUBLE),
        make("Sub", [p + "mean", p + "mean32d"], [p + "residue"]),  # what float32 could not hold of the mean
        make("Mul", [p + "residue", p + "a"], [p + "residue_a"]),
        make("Sub", [p + "bias", p + "residue_a"], [p + "b"]),
        make("Cast", [p + "a"], [p + "a32"], to=TensorProto.FLOAT),
        make("Cast", [p + "b"], [p + "b32"], to=TensorProto.FLOAT),
        make("Sub", [p + "x", p + "mean32"], [p + "centred"]),
        make("Mul", [p + "centred", p + "a32"], [p + "scaled"]),
        make("Add", [p + "scaled", p + "b32"], [p + "y"]),
        make("Shape", [x], [p + "shape"]),
        make("Reshape", [p + "y", p + "shape"], [y], name=node.name),
    ]
    return nodes, initializers


def _constant_arrays(graph: Any, names: set[str]) -> dict[str, Any]:
    """Name -> numpy array of those of ``names`` that are constants of ``graph``: initializers that are not graph
    inputs (those may be fed at run time), ``Constant`` nodes' ``value``, and ``Identity`` of those."""
    from onnx import TensorProto, numpy_helper

    inputs = {value.name for value in graph.input}
    sources: dict[str, Any] = {t.name: t for t in graph.initializer if t.name not in inputs}
    aliases: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attribute in node.attribute:
                if attribute.name == "value":
                    sources[node.output[0]] = attribute.t
        elif node.op_type == "Identity" and node.input and node.input[0] in sources | aliases:
            aliases[node.output[0]] = aliases.get(node.input[0], node.input[0])
    found = {}
    for name in names:
        tensor = sources.get(aliases.get(name, name))
        if tensor is not None and tensor.data_location != TensorProto.EXTERNAL:
            found[name] = numpy_helper.to_array(tensor)
    return found


def _drop_unused_constant_nodes(graph: Any) -> None:
    """Remove ``Constant`` nodes no node or graph output reads any more (the scales and biases folded in).

    Constants a subgraph might read are kept: only a name no node of the whole model reads is dropped.
    """
    used = {value.name for value in graph.output} | _reads(graph)
    for node in [n for n in graph.node if n.op_type == "Constant" and not set(n.output) & used]:
        graph.node.remove(node)


def _reads(graph: Any) -> set[str]:
    """Every name the nodes of ``graph`` and of its subgraphs read."""
    names = {name for node in graph.node for name in node.input}
    for node in graph.node:
        for attribute in node.attribute:
            for inner in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                names |= _reads(inner)
    return names
