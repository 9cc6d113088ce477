"""Exact rewrites of an ONNX graph that let ONNX Runtime run it faster; the one place such rewrites live.

MONAI's networks use PReLU with one slope for the whole tensor (``Act.PRELU``: ``nn.PReLU()``,
``num_parameters=1``), which ``torch.onnx.export`` writes as ``PRelu(X, slope)`` with a one-element slope.
ONNX Runtime runs ``PRelu`` as a broadcasting binary operator, a separate pass over every activation, and
fuses only ``Relu``, ``LeakyRelu``, ``Clip``, ``Sigmoid``, ``Tanh`` and ``HardSigmoid`` into the convolution
before them (``FusedConv``). A one-element slope is exactly ``LeakyRelu(X, alpha=slope)``: both give ``x``
for ``x >= 0`` and ``slope * x`` below, with the same float32 product, so the outputs are bit-identical.
On the zoo-sized UNet that took a 96^3 window from 553 to 431 ms (docs/onnx.md, "Where the time goes").

Rewritten: a top-level ``PRelu`` whose slope is a constant (an initializer that is not also a graph input, a
``Constant`` node, or an ``Identity`` of either) with one element whose value float32 holds exactly (the
``alpha`` attribute is a float32). Left alone: per-channel slopes, slopes fed at run time, and subgraphs.

Unless turned off (``norm_in_float64=False``; ``onnx_norm.py``, not free like the above: it costs time), each
top-level ``InstanceNormalization`` takes its mean and variance in float64, as torch does, so that switching
to ONNX does not change the labels (ONNX Runtime's own sums in float32 flip near-tied voxels).

Used by ``monai-triton convert --to onnx``, ``apps/brain_tissue_seg/export_onnx.py``, ``repo build`` (the
entry's copy, so the in-process ``triton`` runner and Triton's own onnxruntime backend get it too) and the
``onnx`` backend at load (on an in-memory copy; the user's file is never changed).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .onnx_norm import rewrite_instance_norms

if TYPE_CHECKING:
    import onnx

logger = logging.getLogger(__name__)


def rewrite_graph(model: onnx.ModelProto, *, norm_in_float64: bool = True) -> int:
    """Rewrite ``model`` in place (see the module docstring); returns how many nodes were rewritten.

    ``norm_in_float64=True`` also makes each instance norm take its statistics in float64 (``onnx_norm.py``):
    torch's labels, at some 10-18% of the sample UNet's time per study; ``False`` keeps ONNX Runtime's own.
    """
    prelus = _prelu_as_leaky_relu(model.graph)
    norms = rewrite_instance_norms(model) if norm_in_float64 else 0
    if prelus or norms:
        _drop_unused_initializers(model.graph)  # the slopes, scales and biases folded into attributes or copies
        logger.debug("%d PRelu node(s) with one slope run as LeakyRelu, %d InstanceNormalization(s) take their "
                     "statistics in float64", prelus, norms)  # fmt: skip
    return prelus + norms


def _prelu_as_leaky_relu(graph: Any) -> int:
    """Every top-level ``PRelu`` with one constant float32 slope made a ``LeakyRelu``; returns how many."""
    import onnx

    constants = _constants(graph)
    rewritten = 0
    for node in graph.node:
        if node.op_type != "PRelu" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        alpha = _single_float32(constants.get(node.input[1]))
        if alpha is None:
            continue
        leaky = onnx.helper.make_node("LeakyRelu", [node.input[0]], list(node.output), name=node.name, alpha=alpha)
        node.CopyFrom(leaky)  # in place: the graph keeps its order
        rewritten += 1
    return rewritten


def rewritten_bytes(path: str | Path, *, norm_in_float64: bool = True) -> bytes | None:
    """The ONNX file ``path`` rewritten and serialised, for an ``InferenceSession`` to load from memory.

    ``None`` when there is nothing to rewrite, or when the weights live in external files (ONNX Runtime finds
    those relative to the model's path, so such a model is loaded from its path as it is).
    """
    model, count = _load_rewritten(path, norm_in_float64)
    return bytes(model.SerializeToString()) if count else None


def rewrite_file(source: str | Path, target: str | Path, *, norm_in_float64: bool = True) -> int:
    """Write ``source`` rewritten to ``target`` (may be the same path); returns the nodes rewritten.

    Nothing to rewrite, or external weights: ``target`` gets an unchanged byte copy (nothing when it is
    ``source``).
    """
    model, count = _load_rewritten(source, norm_in_float64)
    if count:
        Path(target).write_bytes(model.SerializeToString())
    elif Path(target).resolve() != Path(source).resolve():
        shutil.copyfile(source, target)
    return count


def _load_rewritten(path: str | Path, norm_in_float64: bool = True) -> tuple[onnx.ModelProto, int]:
    """The model at ``path`` and how many of its nodes :func:`rewrite_graph` rewrote (0: left as it was)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    if _has_external_data(model):
        logger.debug("%s keeps its weights in external files; loaded as it is, without graph rewrites", path)
        return model, 0
    return model, rewrite_graph(model, norm_in_float64=norm_in_float64)


def _constants(graph: Any) -> dict[str, Any]:
    """Name -> numpy array of every one-element floating constant of ``graph`` (initializers that are not inputs,
    ``Constant`` nodes' ``value``, ``Identity`` of those); weights are not read."""
    inputs = {value.name for value in graph.input}  # an initializer listed as an input may be fed at run time
    found = {t.name: _scalar(t) for t in graph.initializer if t.name not in inputs}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attribute in node.attribute:
                if attribute.name == "value":
                    found[node.output[0]] = _scalar(attribute.t)
        elif node.op_type == "Identity" and node.input and node.input[0] in found:
            found[node.output[0]] = found[node.input[0]]
    return {name: array for name, array in found.items() if array is not None}


def _scalar(tensor: Any) -> Any:
    """A one-element floating tensor as a numpy array, else ``None`` (without converting anything larger)."""
    from math import prod

    from onnx import TensorProto, numpy_helper

    floating = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
    if tensor.data_type not in floating or prod(tensor.dims) != 1 or tensor.data_location == TensorProto.EXTERNAL:
        return None
    return numpy_helper.to_array(tensor)


def _single_float32(array: Any) -> float | None:
    """The value of a one-element floating array when float32 holds it exactly, else ``None``."""
    import numpy as np

    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    value = array.reshape(())
    as_float32 = np.float32(value)
    if not np.isfinite(as_float32) or float(as_float32) != float(value):
        return None
    return float(as_float32)


def _drop_unused_initializers(graph: Any) -> None:
    """Remove initializers no node reads any more (the slopes a rewrite replaced by an attribute)."""
    used = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    used |= {name for node in graph.node for a in node.attribute for g in _subgraphs(a) for name in _reads(g)}
    inputs = {value.name for value in graph.input}
    for tensor in [t for t in graph.initializer if t.name not in used and t.name not in inputs]:
        graph.initializer.remove(tensor)


def _subgraphs(attribute: Any) -> list[Any]:
    return [attribute.g] if attribute.HasField("g") else list(attribute.graphs)


def _reads(graph: Any) -> set[str]:
    """Every name a subgraph's nodes read (an outer initializer may be read from inside an If or a Loop)."""
    names = {name for node in graph.node for name in node.input}
    for node in graph.node:
        for attribute in node.attribute:
            for inner in _subgraphs(attribute):
                names |= _reads(inner)
    return names


def _has_external_data(model: Any) -> bool:
    from onnx.external_data_helper import uses_external_data

    return any(uses_external_data(tensor) for tensor in model.graph.initializer)
