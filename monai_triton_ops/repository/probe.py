"""Learn a model's signature by running it, and check metadata against the model.

A model without metadata is run on an example input per argument (shapes the user gives); output
count, names, dtypes and shapes are read from the result. Which dims are dynamic is found by running
a second, larger size: every probed dim doubled at once (doubling keeps any divisibility a UNet needs),
and when that fails, one axis at a time. Dims that accept the larger size are -1, as are output dims
that change with it. The channel axis (1) is never probed; the batch axis (0) is probed when
``max_batch_size == 0`` and is implicit otherwise.

Metadata is checked by running the model on a concrete shape it implies (the smallest that runs,
and a batch of 2 when it will be served with batching): a model whose first conv wants two channels,
or that returns another number of outputs or another dtype, fails here with a ``ConfigError``
rather than on the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..signature import ModelSignature, TensorSpec, dtype_of, dtype_to_torch
from .metadata import (
    archive_format,
    input_names,
    load_exported_program,
    load_torchscript,
    output_names,
    read_torchscript_metadata,
)

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]
#: One probe result: ``(dict key or None, tensor)`` per output, in the model's order.
Outputs = list[tuple[Any, torch.Tensor]]


@dataclass(frozen=True, kw_only=True, eq=False)
class LoadedModel:
    """A model file loaded on the CPU, with what its file says about it."""

    path: Path
    format: str  # "torchscript" or "pt2"
    module: Callable[..., Any]
    argument_names: tuple[str, ...]  # forward() arguments, without self
    required_inputs: int  # arguments without a default value
    metadata: dict[str, Any] | None  # MONAI metadata.json inside the file
    returns_dict: bool  # forward() is declared to return a dict (TorchScript only)


@dataclass(frozen=True, kw_only=True, eq=False)
class Trial:
    """A model under test with named example inputs: what probing and checks hand from step to step."""

    model: LoadedModel
    name: str
    in_names: tuple[str, ...]
    shapes: tuple[Shape, ...]
    dtypes: tuple[str, ...]

    def run(self, source: str = "the example shapes") -> Outputs:
        """Run on example inputs; a failure is a ``ConfigError`` naming the inputs it was given."""
        try:
            return _run(self.model, self.name, example_inputs(self.shapes, self.dtypes))
        except ConfigError:
            raise
        except Exception as exc:  # a model can raise anything; the message is what the user needs
            given = ", ".join(
                f"{n} {list(s)} {d}" for n, s, d in zip(self.in_names, self.shapes, self.dtypes, strict=True)
            )
            raise ConfigError(
                f"model {self.name!r} fails on inputs {given} (shapes from {source}): {_reason(exc)}"
            ) from exc

    def attempt(self, shapes: Sequence[Shape]) -> Outputs | None:
        """Run on other shapes; ``None`` when the model rejects them (that size is fixed)."""
        try:
            return _run(self.model, self.name, example_inputs(shapes, self.dtypes))
        except ConfigError:
            raise
        except Exception as exc:  # a size the model rejects: that dim is fixed
            logger.debug("model %r rejects input shapes %s: %s", self.name, shapes, exc)
            return None


def load_model(path: str | Path, name: str) -> LoadedModel:
    """Load a TorchScript or ``.pt2`` file; anything else is a ``ModelLoadError``."""
    path = Path(path)
    if archive_format(path, name) == "pt2":
        program, meta = load_exported_program(path)
        names = tuple(s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT")
        return LoadedModel(
            path=path, format="pt2", module=program.module(), argument_names=names,
            required_inputs=len(names), metadata=meta, returns_dict=False,
        )  # fmt: skip
    module = load_torchscript(path, name)
    schema = module.forward.schema  # type: ignore[attr-defined]
    arguments = [a for a in schema.arguments if a.name != "self"]
    returns = schema.returns
    return LoadedModel(
        path=path,
        format="torchscript",
        module=module,
        argument_names=tuple(a.name for a in arguments),
        required_inputs=sum(1 for a in arguments if not a.has_default_value()),
        metadata=read_torchscript_metadata(path),
        returns_dict=len(returns) == 1 and returns[0].type.kind() == "DictType",
    )


def check_input_count(model: LoadedModel, name: str, count: int, source: str) -> None:
    """Raise unless ``count`` tensors can be passed to ``forward`` positionally."""
    if not model.required_inputs <= count <= len(model.argument_names):
        raise ConfigError(
            f"model {name!r}: {source} gives {count} input(s), forward() takes "
            f"{model.required_inputs}..{len(model.argument_names)} {list(model.argument_names)}"
        )


def example_inputs(shapes: Sequence[Shape], dtypes: Sequence[str]) -> list[torch.Tensor]:
    """Seeded random floats (zeros for integer and bool inputs, which are often indices or masks)."""
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for shape, dtype in zip(shapes, dtypes, strict=True):
        torch_dtype = dtype_to_torch(dtype)
        if torch_dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=generator).to(torch_dtype))
        else:
            tensors.append(torch.zeros(shape, dtype=torch_dtype))
    return tensors


def probe_signature(
    model: LoadedModel,
    name: str,
    shapes: Sequence[Shape],
    dtypes: Sequence[str],
    *,
    max_batch_size: int = 0,
    version: int | None = None,
) -> ModelSignature:
    """The signature of a model without metadata, learned by running it (see the module docstring)."""
    in_names = input_names(len(shapes), model.argument_names)
    trial = Trial(model=model, name=name, in_names=tuple(in_names), shapes=tuple(shapes), dtypes=tuple(dtypes))
    base = trial.run()
    if max_batch_size > 0:
        _check_batching(trial, base, max_batch_size)
    axes = [_probed_axes(len(shape), max_batch_size) for shape in shapes]
    in_dynamic, out_dynamic = _dynamic_axes(trial, base, axes)
    out_names = output_names(len(base), [key for key, _ in base])
    inputs = tuple(
        TensorSpec(name=n, dtype=d, shape=_dims(s, dyn, max_batch_size))
        for n, d, s, dyn in zip(in_names, dtypes, shapes, in_dynamic, strict=True)
    )
    outputs = tuple(
        TensorSpec(name=n, dtype=_dtype(name, n, t), shape=_dims(tuple(t.shape), dyn, max_batch_size))
        for n, (_, t), dyn in zip(out_names, base, out_dynamic, strict=True)
    )
    return ModelSignature(name=name, inputs=inputs, outputs=outputs, max_batch_size=max_batch_size, version=version)


def verify_signature(
    model: LoadedModel, signature: ModelSignature, candidates: Sequence[Sequence[Shape]], source: str
) -> ModelSignature:
    """Run on the first candidate input shapes the model accepts and check its outputs against ``signature``.

    Candidates go from small to larger (an honest "2*n" may still be too small for a deep UNet);
    failing on all of them, or returning outputs that contradict ``signature``, is a ``ConfigError``.
    Returns the signature with dict keys as output names when the model returns a dict.
    """
    name = signature.name
    dtypes = [s.dtype for s in signature.inputs]
    errors: list[ConfigError] = []
    for shapes in candidates:
        trial = Trial(
            model=model, name=name, in_names=signature.input_names, shapes=tuple(shapes), dtypes=tuple(dtypes)
        )
        try:
            base = trial.run(source)
        except ConfigError as exc:
            errors.append(exc)
            continue
        _check_outputs(signature, base, shapes)
        if signature.max_batch_size > 0:
            _check_batching(trial, base, signature.max_batch_size)
        names = output_names(len(base), [key for key, _ in base])
        outputs = tuple(replace(spec, name=n) for spec, n in zip(signature.outputs, names, strict=True))
        return replace(signature, outputs=outputs)
    if not errors:
        raise ConfigError(f"model {name!r}: no input shapes to check the {source} with")
    if len(errors) == 1:
        raise errors[0]
    larger = [[list(s) for s in shapes] for shapes in candidates[1:]]
    raise ConfigError(f"{errors[0]} (larger shapes {larger} fail too)") from errors[0]


def _check_outputs(signature: ModelSignature, base: Outputs, shapes: Sequence[Shape]) -> None:
    if len(base) != len(signature.outputs):
        raise ConfigError(
            f"model {signature.name!r}: metadata declares {len(signature.outputs)} output(s) "
            f"{list(signature.output_names)}, the model returns {len(base)}"
        )
    for spec, (_, tensor) in zip(signature.outputs, base, strict=True):
        _check_output(signature, spec, tensor, shapes)


def _run(model: LoadedModel, name: str, tensors: Sequence[torch.Tensor]) -> Outputs:
    with torch.inference_mode():
        result = model.module(*tensors)
    if isinstance(result, torch.Tensor):
        items: Outputs = [(None, result)]
    elif isinstance(result, Mapping) and all(isinstance(v, torch.Tensor) for v in result.values()):
        items = list(result.items())
    elif isinstance(result, Mapping | tuple | list):  # a tuple, or nested: its leaves in the runner's order
        items = [(None, value) for value in _leaves(result)]
    else:
        raise ConfigError(f"model {name!r} returns {type(result).__name__}; expected a tensor, tuple or dict")
    for position, (_, value) in enumerate(items):
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            kind = "a 0-d tensor" if isinstance(value, torch.Tensor) else f"of type {type(value).__name__}"
            raise ConfigError(f"model {name!r} output {position} is {kind}; only tensors with dims can be served")
    return items


def _leaves(result: Any) -> list[Any]:
    """The values of nested dicts, tuples and lists depth-first, in the order the runner names them
    (``runner.model.flatten_result``); anything else is a leaf, reported by the caller if not a tensor."""
    if isinstance(result, Mapping):
        return [leaf for value in result.values() for leaf in _leaves(value)]
    if isinstance(result, tuple | list):
        return [leaf for value in result for leaf in _leaves(value)]
    return [result]


def _reason(exc: Exception) -> str:
    """The last line of an error: TorchScript puts its whole interpreter traceback before it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _probed_axes(rank: int, max_batch_size: int) -> set[int]:
    """Batch (0) when it is explicit, and every axis after the channel axis (1)."""
    return ({0} if max_batch_size == 0 else set()) | set(range(2, rank))


def _grow(shapes: Sequence[Shape], axes: Sequence[set[int]]) -> list[Shape]:
    return [tuple(d * 2 if i in grow else d for i, d in enumerate(s)) for s, grow in zip(shapes, axes, strict=True)]


def _dynamic_axes(trial: Trial, base: Outputs, axes: list[set[int]]) -> tuple[list[set[int]], list[set[int]]]:
    """Per input and per output, the axes whose size may change (all at once, else axis by axis)."""
    in_dynamic: list[set[int]] = [set() for _ in trial.shapes]
    out_dynamic: list[set[int]] = [set() for _ in base]
    if not any(axes):
        return in_dynamic, out_dynamic
    grown = trial.attempt(_grow(trial.shapes, axes))
    if grown is not None:
        return [set(a) for a in axes], _changed(trial.name, base, grown)
    for axis in sorted(set().union(*axes)):
        subset = [a & {axis} for a in axes]
        grown = trial.attempt(_grow(trial.shapes, subset))
        if grown is None:
            logger.info("model %r: axis %d of %s keeps its example size", trial.name, axis, list(trial.in_names))
            continue
        for dynamic, grew in zip(in_dynamic, subset, strict=True):
            dynamic |= grew
        for dynamic, changed in zip(out_dynamic, _changed(trial.name, base, grown), strict=True):
            dynamic |= changed
    return in_dynamic, out_dynamic


def _changed(name: str, base: Outputs, trial: Outputs) -> list[set[int]]:
    """Per output, the axes whose size differs between two runs."""
    if [k for k, _ in base] != [k for k, _ in trial]:
        raise ConfigError(f"model {name!r} returns different outputs for different input sizes")
    changed = []
    for position, ((_, a), (_, b)) in enumerate(zip(base, trial, strict=True)):
        if a.dim() != b.dim():
            raise ConfigError(
                f"model {name!r} output {position}: rank changes with the input size "
                f"(shape {list(a.shape)}, then {list(b.shape)}); Triton needs a fixed rank"
            )
        changed.append({i for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if x != y})
    return changed


def _check_batching(trial: Trial, base: Outputs, max_batch_size: int) -> None:
    """With ``max_batch_size > 0`` every input and output leads with the same batch dim."""
    name, shapes = trial.name, trial.shapes
    batch = {s[0] for s in shapes if s}
    if len(batch) != 1 or any(len(s) < 2 for s in shapes):
        raise ConfigError(
            f"model {name!r}: with max_batch_size {max_batch_size} every input needs a leading batch dim and "
            f"one more dim, all with one batch size; got {dict(zip(trial.in_names, map(list, shapes), strict=True))}"
        )
    if shapes[0][0] > max_batch_size:
        raise ConfigError(f"model {name!r}: example batch size {shapes[0][0]} exceeds max_batch_size {max_batch_size}")
    checks = [(shapes[0][0], base)]
    if max_batch_size >= 2 and shapes[0][0] != 2:
        doubled = trial.attempt([(2, *s[1:]) for s in shapes])
        if doubled is None:
            raise ConfigError(f"model {name!r} fails on a batch of 2; serve it with max_batch_size 0 or 1")
        checks.append((2, doubled))
    for size, outputs in checks:
        for position, (_, tensor) in enumerate(outputs):
            if tensor.dim() < 2 or tensor.shape[0] != size:
                raise ConfigError(
                    f"model {name!r} output {position}: expected a leading batch dim of {size} and one more dim "
                    f"(max_batch_size {max_batch_size}), got shape {list(tensor.shape)}; use max_batch_size 0"
                )


def _dims(shape: Shape, dynamic: set[int], max_batch_size: int) -> Shape:
    dims = tuple(-1 if i in dynamic else d for i, d in enumerate(shape))
    return dims[1:] if max_batch_size > 0 else dims


def _dtype(model: str, tensor_name: str, tensor: torch.Tensor) -> str:
    try:
        return dtype_of(tensor)
    except ConfigError as exc:
        raise ConfigError(f"model {model!r} output {tensor_name!r}: {exc}") from exc


def _check_output(signature: ModelSignature, spec: TensorSpec, tensor: torch.Tensor, shapes: Sequence[Shape]) -> None:
    where = f"model {signature.name!r} output {spec.name!r}"
    actual_dtype = _dtype(signature.name, spec.name, tensor)
    if actual_dtype != spec.dtype:
        raise ConfigError(f"{where}: metadata says dtype {spec.dtype}, the model returns {actual_dtype}")
    if spec.shape_mismatch(tensor.shape, signature.max_batch_size) is not None:
        raise ConfigError(
            f"{where}: metadata says shape {list(spec.full_shape(signature.max_batch_size))}, the model returns "
            f"{list(tensor.shape)} for inputs {[list(s) for s in shapes]}"
        )
