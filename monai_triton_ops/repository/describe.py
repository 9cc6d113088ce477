"""A model file -> its ``ModelSignature``, from the best source there is.

The order, most authoritative first:

1. MONAI ``metadata.json`` inside the model file (TorchScript extra files, or a ``.pt2`` archive);
2. a MONAI bundle's ``configs/metadata.json`` given by the caller;
3. probing: running the model on example inputs of the shapes the caller gives.

Metadata is never trusted blindly: when it (or the caller) implies a concrete input shape, one small
run checks it against the model, so a wrong channel count, output count or dtype fails here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ..errors import ConfigError
from ..signature import ModelSignature, dtype_of
from .metadata import example_shapes, network_format, output_names, read_bundle_metadata, signature_from_metadata
from .onnx_model import is_onnx_file, read_onnx
from .probe import LoadedModel, Shape, check_input_count, load_model, probe_signature, verify_signature

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

#: Values tried for the symbols of "16*n"-style metadata shapes when checking metadata against the model.
_SYMBOL_VALUES = (1, 2, 4)
#: Larger candidates are skipped beyond this many input elements (64**3), to keep checks quick on a CPU.
_PROBE_ELEMENTS = 64**3


@dataclass(frozen=True, kw_only=True)
class ModelDescription:
    """A model's signature, where it came from, and whether a run confirmed it."""

    signature: ModelSignature
    source: str  # "model metadata", "bundle metadata" or "probe"
    model_format: str  # "torchscript", "pt2" or "onnx"
    argument_names: tuple[str, ...]  # forward() arguments: the names libtorch accepts for inputs
    verified: bool  # the model ran on a concrete shape and matched the signature
    returns_dict: bool = False  # forward() is declared to return a dict (libtorch cannot serve it)


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """A model file and what the caller says about it: one object for every description step.

    ``input_shapes`` are full example shapes, batch dim first (e.g. ``(1, 1, 96, 96, 96)``), one per
    ``forward`` argument; ``input_dtypes`` default to float32. Both are needed only when there is
    no metadata, and are checked against the metadata when there is.
    """

    path: Path
    name: str
    input_shapes: Sequence[Sequence[int]] | None = None
    input_dtypes: Sequence[str] | None = None
    bundle_metadata: str | Path | None = None
    max_batch_size: int = 0
    version: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if self.max_batch_size < 0:
            raise ConfigError(f"model {self.name!r}: max_batch_size must be >= 0, got {self.max_batch_size}")


class ExampleKeywords(TypedDict, total=False):
    """What the caller says about a model file, as keyword arguments of the convenience functions."""

    input_shapes: Sequence[Sequence[int]] | None
    input_dtypes: Sequence[str] | None
    bundle_metadata: str | Path | None


class SourceKeywords(ExampleKeywords, total=False):
    """``ModelSource``'s fields past path and name."""

    max_batch_size: int
    version: int | None


def describe_model(model_path: str | Path, name: str, **keywords: Unpack[SourceKeywords]) -> ModelDescription:
    """Describe the model in ``model_path`` (TorchScript or ``.pt2``) under the model name ``name``."""
    return describe(ModelSource(path=Path(model_path), name=name, **keywords))


def describe(given: ModelSource) -> ModelDescription:
    """The signature of ``given``'s model, where it came from, and whether a run confirmed it."""
    name = given.name
    if is_onnx_file(given.path):
        return _describe_onnx(given)
    model = load_model(given.path, name)
    shapes = _shapes(name, given.input_shapes)
    dtypes = _dtypes(name, given.input_dtypes, shapes)
    meta, origin = _metadata(model, name, given.bundle_metadata)
    if meta is None:
        return _probe(model, given, shapes, dtypes)
    signature = signature_from_metadata(
        name, meta, schema_names=model.argument_names, version=given.version, max_batch_size=given.max_batch_size
    )
    check_input_count(model, name, len(signature.inputs), origin)
    if dtypes is not None:
        _check_dtypes(signature, dtypes)
    candidates = [_check_shapes(signature, shapes)] if shapes is not None else _candidates(name, meta)
    verified = bool(candidates)
    if candidates:
        where = "--input-shape" if shapes is not None else f"the {origin}"
        signature = verify_signature(model, signature, candidates, where)
    else:
        logger.warning(
            "model %r: the %s implies no concrete input shape, so it was not checked against the model; "
            "pass input shapes (--input-shape) to check it",
            name,
            origin,
        )
        if model.returns_dict:  # unchecked dict outputs: the metadata's output keys are the best names
            signature = _renamed_outputs(signature, list(network_format(name, meta)["outputs"]))
    return ModelDescription(
        signature=signature, source=origin, model_format=model.format,
        argument_names=model.argument_names, verified=verified, returns_dict=model.returns_dict,
    )  # fmt: skip


def _describe_onnx(given: ModelSource) -> ModelDescription:
    """An ONNX graph declares its tensors: names, dtypes and dims (-1 for dynamic axes) come from it.

    MONAI metadata comes from the file's ``metadata_props``, else from the bundle's; given shapes and dtypes
    are checked against the graph's.
    """
    model = read_onnx(given.path, given.name)
    signature = model.signature(given.name, max_batch_size=given.max_batch_size, version=given.version)
    meta, origin = model.metadata, "model graph"
    if meta is None and given.bundle_metadata is not None:
        meta, origin = read_bundle_metadata(given.bundle_metadata), "model graph and bundle metadata"
        signature = replace(signature, metadata=meta)
    shapes = _shapes(given.name, given.input_shapes)
    if shapes is not None:
        _check_shapes(signature, shapes)
    dtypes = _dtypes(given.name, given.input_dtypes, shapes)
    if dtypes is not None:
        _check_dtypes(signature, dtypes)
    names = tuple(t.name for t in signature.inputs)
    return ModelDescription(
        signature=signature, source=origin, model_format="onnx", argument_names=names, verified=False
    )


def _renamed_outputs(signature: ModelSignature, keys: list[Any]) -> ModelSignature:
    names = output_names(len(signature.outputs), keys)
    return replace(signature, outputs=tuple(replace(o, name=n) for o, n in zip(signature.outputs, names, strict=True)))


def _candidates(name: str, meta: dict[str, Any]) -> list[list[Shape]]:
    """Input shapes the metadata implies, smallest first, within a probe budget (the first always)."""
    candidates: list[list[Shape]] = []
    for symbol in _SYMBOL_VALUES:
        shapes = example_shapes(name, meta, symbol)
        if shapes is None:
            return []
        if shapes not in candidates and (not candidates or sum(math.prod(s) for s in shapes) <= _PROBE_ELEMENTS):
            candidates.append(shapes)
    return candidates


def _probe(
    model: LoadedModel, given: ModelSource, shapes: list[Shape] | None, dtypes: list[str] | None
) -> ModelDescription:
    name = given.name
    if shapes is None:
        raise ConfigError(
            f"model {name!r}: {str(model.path)!r} carries no MONAI metadata and no bundle metadata was given; "
            "pass --input-shape (one per forward() argument, batch first, e.g. --input-shape 1,1,96,96,96) "
            "so the model can be probed"
        )
    check_input_count(model, name, len(shapes), "--input-shape")
    dtypes = dtypes or ["FP32"] * len(shapes)
    signature = probe_signature(model, name, shapes, dtypes, max_batch_size=given.max_batch_size, version=given.version)
    logger.info("model %r: signature probed from example inputs %s", name, shapes)
    return ModelDescription(
        signature=signature, source="probe", model_format=model.format,
        argument_names=model.argument_names, verified=True, returns_dict=model.returns_dict,
    )  # fmt: skip


def _metadata(model: LoadedModel, name: str, bundle_metadata: str | Path | None) -> tuple[dict[str, Any] | None, str]:
    """The model file's metadata, else the bundle's; both given and different is an error."""
    bundle = read_bundle_metadata(bundle_metadata) if bundle_metadata is not None else None
    if model.metadata is not None and bundle is not None:
        if network_format(name, model.metadata) != network_format(name, bundle):
            raise ConfigError(
                f"model {name!r}: the network_data_format inside {str(model.path)!r} differs from the one in "
                f"bundle metadata {str(bundle_metadata)!r}; fix one, or drop the bundle metadata option"
            )
        logger.info("model %r: bundle metadata matches the metadata inside the model file", name)
    if model.metadata is not None:
        return model.metadata, "model metadata"
    if bundle is not None:
        return bundle, "bundle metadata"
    return None, "probe"


def _shapes(name: str, input_shapes: Sequence[Sequence[int]] | None) -> list[Shape] | None:
    if input_shapes is None or len(input_shapes) == 0:
        return None
    shapes = []
    for position, shape in enumerate(input_shapes):
        dims = tuple(int(d) for d in shape)
        if not dims or any(d < 1 for d in dims):
            raise ConfigError(f"model {name!r}: input shape {position} must be positive sizes, got {list(dims)}")
        shapes.append(dims)
    return shapes


def _dtypes(name: str, input_dtypes: Sequence[str] | None, shapes: list[Shape] | None) -> list[str] | None:
    if not input_dtypes:
        return None
    if shapes is not None and len(input_dtypes) != len(shapes):
        raise ConfigError(
            f"model {name!r}: expected one input dtype per input shape ({len(shapes)}), got {len(input_dtypes)}"
        )
    return [dtype_of(d) for d in input_dtypes]


def _check_dtypes(signature: ModelSignature, dtypes: Sequence[str]) -> None:
    if len(dtypes) != len(signature.inputs):
        raise ConfigError(
            f"model {signature.name!r}: metadata declares {len(signature.inputs)} input(s), "
            f"got {len(dtypes)} input dtype(s)"
        )
    for spec, dtype in zip(signature.inputs, dtypes, strict=True):
        if spec.dtype != dtype:
            raise ConfigError(
                f"model {signature.name!r} input {spec.name!r}: metadata says dtype {spec.dtype}, got {dtype}"
            )


def _check_shapes(signature: ModelSignature, shapes: Sequence[Shape]) -> list[Shape]:
    """The caller's example shapes, when they fit the metadata's (rank and every fixed dim)."""
    if len(shapes) != len(signature.inputs):
        raise ConfigError(
            f"model {signature.name!r}: metadata declares {len(signature.inputs)} input(s) "
            f"{list(signature.input_names)}, got {len(shapes)} input shape(s)"
        )
    for spec, shape in zip(signature.inputs, shapes, strict=True):
        if spec.shape_mismatch(shape, signature.max_batch_size) is not None:
            raise ConfigError(
                f"model {signature.name!r} input {spec.name!r}: metadata says shape "
                f"{list(spec.full_shape(signature.max_batch_size))}, got input shape {list(shape)}"
            )
    return list(shapes)
