"""The converted model loaded back and made callable for the check against its source.

An ONNX file runs in ONNX Runtime (CPU), with the conditions of its top-level ``If`` nodes as extra outputs
when it has any whose condition the data decides (``branches.with_conditions``; not for a file whose weights
lie beside it, over protobuf's 2 GB); a ``.pt2`` runs its program's module. A graph ONNX Runtime
refuses to load or run is a ``ConversionError`` naming the model: the exporter wrote something that
cannot serve, and nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConversionError
from .branches import ControlFlow, onnx_control_flow, program_control_flow, with_conditions
from .export import first_line

#: inputs -> (the model's outputs, the values of the top-level ``If`` conditions read back)
Runner = Callable[[list[torch.Tensor]], tuple[list[torch.Tensor], list[bool]]]


def converted_runner(name: str, model: Path, to: str, names: Sequence[str], outputs: int) -> tuple[Runner, ControlFlow]:
    """The converted file at ``model`` as a ``Runner``, and the control flow it holds."""
    if to == "onnx":
        return _onnx_runner(name, model, names, outputs)
    program = torch.export.load(str(model)).module()

    def run(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[bool]]:
        with torch.inference_mode():
            return tensors(program(*inputs)), []

    return run, ControlFlow(tuple(program_control_flow(program)))


def _onnx_runner(name: str, model: Path, names: Sequence[str], outputs: int) -> tuple[Runner, ControlFlow]:
    import onnx
    import onnxruntime

    proto = onnx.load(str(model), load_external_data=False)  # the graph only: weights may live beside it
    ops = onnx_control_flow(proto.graph)
    conditions: list[str] = []
    source: str | bytes = str(model)
    if "If" in ops and not any(onnx.external_data_helper.uses_external_data(t) for t in proto.graph.initializer):
        instrumented, conditions = with_conditions(proto)
        source = instrumented.SerializeToString()
    try:
        session = onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own error kinds (InvalidGraph, Fail...) share no public base
        raise ConversionError(
            f"model {name!r}: the exported ONNX graph does not load in ONNX Runtime ({first_line(exc)}); "
            "nothing was written"
        ) from exc

    def run(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[bool]]:
        feeds = {n: t.numpy() for n, t in zip(names, inputs, strict=True)}
        try:
            results = session.run(None, feeds)
        except Exception as exc:  # as above
            raise ConversionError(
                f"model {name!r}: the exported ONNX model fails in ONNX Runtime on inputs of shapes "
                f"{[list(t.shape) for t in inputs]} ({first_line(exc)}); nothing was written"
            ) from exc
        values = [bool(np.asarray(c).reshape(-1)[0]) for c in results[outputs:]]
        return [torch.from_numpy(np.asarray(a)) for a in results[:outputs]], values

    return run, ControlFlow(tuple(ops), conditions=len(conditions))


def tensors(result: Any) -> list[torch.Tensor]:
    """A model's result (a tensor, a tuple or list, or a dict) as a list of tensors."""
    if isinstance(result, torch.Tensor):
        return [result]
    values = list(result.values()) if isinstance(result, dict) else list(result)
    return [torch.as_tensor(v) for v in values]
