"""A network -> an ONNX file or a ``.pt2`` program, dynamic along batch and the spatial axes the metadata allows.

ONNX goes through the TorchScript-based exporter (``dynamo=False``, opset 17, ``dynamic_axes``), which
exports a TorchScript module as it is and traces a Python one; the MONAI metadata goes into the model's
``metadata_props`` (``monai_metadata``), and the graph gets the exact rewrites of ``repository/onnx_rewrite.py``
(PReLU with one slope as ``LeakyRelu``, which ONNX Runtime fuses into the convolution). ``.pt2`` goes
through ``torch.export`` (non-strict) with ``Dim.AUTO`` on those axes, and the metadata into the archive's
``metadata.json`` extra file.
A trace that depends on the data (a Python ``if`` on a tensor's value) is refused: the file would
hold one branch only.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.jit._trace import TracerWarning

from ..errors import ConversionError
from ..repository.metadata import METADATA_FILE
from ..repository.onnx_model import METADATA_KEY
from ..repository.onnx_rewrite import rewrite_graph

logger = logging.getLogger(__name__)

OPSET = 17
#: The logger whose "Unable to find user code" warning precedes a data-dependent torch.export failure.
_SYMBOLIC_SHAPES = "torch.fx.experimental.symbolic_shapes"
#: Tracer warnings that mean the graph took a branch or a count from the probe's values.
_DATA_DEPENDENT = ("Python boolean", "Python index", "Python number", "iterating over a tensor")


def dynamic_axes(shape: Sequence[int], fixed: Sequence[int] | None) -> list[int]:
    """The axes left dynamic: the batch, and every spatial axis the metadata does not fix (``-1`` in ``fixed``)."""
    if fixed is None:
        return [0, *range(2, len(shape))]
    return [0, *(axis for axis in range(2, len(shape)) if axis < len(fixed) and fixed[axis] == -1)]


def export_onnx(
    module: torch.nn.Module, name: str, probe: Sequence[torch.Tensor], target: Path, *,
    inputs: Sequence[str], outputs: Sequence[str], axes: Mapping[str, Sequence[int]],
    metadata: Mapping[str, Any] | None,
) -> None:  # fmt: skip
    """Write ``module`` as ONNX to ``target`` with named tensors, dynamic ``axes`` and ``metadata``."""
    import onnx

    named = {tensor: {axis: f"{tensor}_{axis}" for axis in dims} for tensor, dims in axes.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.onnx.export(
                module, tuple(probe), str(target), dynamo=False, opset_version=OPSET,
                input_names=list(inputs), output_names=list(outputs), dynamic_axes=named,
            )  # fmt: skip
        except Exception as exc:  # the exporter raises many kinds for what it cannot express
            raise ConversionError(f"model {name!r} cannot be exported to ONNX: {first_line(exc)}") from exc
    _refuse_data_dependence(name, "torch.onnx.export", caught)
    model = onnx.load(str(target))
    rewrite_graph(model)  # exact (PReLU with one slope -> LeakyRelu); the numeric check runs the rewritten file
    if metadata is not None:
        model.metadata_props.add(key=METADATA_KEY, value=json.dumps(dict(metadata)))
    onnx.save(model, str(target))


def export_pt2(
    module: torch.nn.Module, name: str, probe: Sequence[torch.Tensor], target: Path, *,
    axes: Sequence[Sequence[int]], metadata: Mapping[str, Any] | None,
) -> None:  # fmt: skip
    """Write ``module`` as a ``torch.export`` program to ``target``; ``axes``: the dynamic axes of each input."""
    from torch.export import Dim

    shapes: tuple[Any, ...] = tuple(dict.fromkeys(dims, Dim.AUTO) for dims in axes)
    if _takes_varargs(module):  # a .pt2 source's ProgramCall: forward(*args), whose one argument is the tuple
        shapes = (shapes,)
    quiet = io.StringIO()  # torch.export prints the partial graph of a failed trace to stderr, and logs a warning
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(quiet), _quiet_logger(_SYMBOLIC_SHAPES):
            warnings.simplefilter("ignore")
            program = torch.export.export(module, tuple(probe), dynamic_shapes=shapes, strict=False)
    except Exception as exc:  # torch._dynamo's UserError, GuardOnDataDependentSymNode and the like
        logger.debug("torch.export of model %r failed; what it printed:\n%s", name, quiet.getvalue())
        raise ConversionError(
            f"model {name!r} cannot be exported with torch.export (control flow that depends on the data, or "
            f"an operation it cannot trace): {first_line(exc)}"
        ) from exc
    extra = {METADATA_FILE: json.dumps(dict(metadata))} if metadata is not None else {}
    torch.export.save(program, str(target), extra_files=extra)


def _takes_varargs(module: torch.nn.Module) -> bool:
    parameters = inspect.signature(module.forward).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    """``name``'s records below ERROR dropped for the block (torch's handlers write them to stderr directly)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _refuse_data_dependence(name: str, tool: str, caught: Sequence[warnings.WarningMessage]) -> None:
    """Raise for a tracer warning from the network's own code; torch's (an exported program's shape guards,
    instance norm's size checks) test shapes, which stay fixed in the trace only where no axis is dynamic."""
    torch_code = str(Path(torch.__file__).parent)
    for warning in caught:
        text = str(warning.message)
        if warning.filename.startswith(torch_code):
            continue
        if issubclass(warning.category, TracerWarning) and any(k in text for k in _DATA_DEPENDENT):
            raise ConversionError(
                f"model {name!r} cannot be exported by {tool}: its control flow depends on the data, so the trace "
                f"would keep one branch only ({text.splitlines()[0]} at {Path(warning.filename).name}:"
                f"{warning.lineno}); script the branch (torch.jit.script) or remove it"
            )


def first_line(exc: BaseException) -> str:
    """An exception's kind and the first line of its text, for an error that quotes it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
