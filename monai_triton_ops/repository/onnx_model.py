"""An ONNX model file -> what every part of this package needs to know about it, without running it.

One reader for the ``onnx`` backend, ``repo build/describe/check``, the Triton runner's checks and the
``convert`` command: the graph's inputs and outputs (names, Triton dtypes, dims with -1 for a symbolic
or unknown axis), its opset, and the MONAI metadata that an export stored in the model's
``metadata_props`` under ``monai_metadata`` (the same JSON as TorchScript's ``metadata.json``, and the
same key as the ``config.pbtxt`` parameter). Initializers that are also listed as graph inputs (old
exporters did so) are not inputs. A file that is not ONNX is a ``ModelLoadError`` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelLoadError, ModelNotFoundError
from ..signature import ModelSignature, TensorSpec
from .metadata import parse_metadata_text

#: The ``metadata_props`` key that holds MONAI's metadata JSON (also the ``config.pbtxt`` parameter's name).
METADATA_KEY = "monai_metadata"
ONNX_SUFFIX = ".onnx"
DEFAULT_ONNX_FILENAME = "model.onnx"
#: ONNX TensorProto element type -> Triton dtype name (types Triton cannot carry are absent).
_ONNX_TO_TRITON = {
    1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 8: "BYTES",
    9: "BOOL", 10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64", 16: "BF16",
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class OnnxModel:
    """What an ONNX file declares: its tensors (graph order), opset, producer and MONAI metadata."""

    path: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opset: int  # of the default ("ai.onnx") domain
    producer: str
    metadata: dict[str, Any] | None
    props: Mapping[str, str] = field(default_factory=dict)

    def signature(self, name: str, *, max_batch_size: int = 0, version: int | None = None) -> ModelSignature:
        """The model's signature as model ``name``: the graph's tensors, its metadata attached.

        ``max_batch_size > 0`` makes the leading axis the implicit batch: every tensor must have a dynamic
        one (a ``ConfigError`` names the first that does not).
        """
        inputs, outputs = self.inputs, self.outputs
        if max_batch_size > 0:
            fixed = [t for t in (*inputs, *outputs) if not t.shape or t.shape[0] != -1]
            if fixed:
                raise ConfigError(
                    f"model {name!r}: max_batch_size {max_batch_size} needs a dynamic leading (batch) axis on every "
                    f"tensor of {str(self.path)!r}; {fixed[0].name!r} has shape {list(fixed[0].shape)} "
                    "(export with dynamic_axes={..: {0: 'batch'}}, or use max_batch_size 0)"
                )
            inputs = tuple(TensorSpec(name=t.name, dtype=t.dtype, shape=t.shape[1:]) for t in inputs)
            outputs = tuple(TensorSpec(name=t.name, dtype=t.dtype, shape=t.shape[1:]) for t in outputs)
        return ModelSignature(
            name=name, inputs=inputs, outputs=outputs, max_batch_size=max_batch_size, version=version,
            metadata=dict(self.metadata or {}),
        )  # fmt: skip

    @property
    def batches(self) -> bool:
        """Whether every tensor's leading axis is dynamic, so a server may batch requests along it."""
        return all(t.shape and t.shape[0] == -1 for t in (*self.inputs, *self.outputs))


def is_onnx_file(path: str | Path) -> bool:
    """Whether ``path`` names an ONNX model by its suffix (the content is checked when it is read)."""
    return Path(path).suffix.lower() == ONNX_SUFFIX


def read_onnx(path: str | Path, name: str | None = None) -> OnnxModel:
    """Read the graph of the ONNX file ``path`` (weights in external files are not loaded)."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    where = f"model {name!r}: " if name is not None else ""
    if not path.is_file():
        raise ModelNotFoundError(f"{where}ONNX file {str(path)!r} does not exist")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise ModelLoadError(f"{where}{str(path)!r} is not an ONNX model (it does not parse as one): {exc}") from exc
    graph = proto.graph
    if not graph.output or not proto.opset_import:
        raise ModelLoadError(f"{where}{str(path)!r} is not an ONNX model (no graph outputs or opset)")
    label = name or path.stem
    initializers = {t.name for t in graph.initializer}
    inputs = tuple(_spec(label, "input", v) for v in graph.input if v.name not in initializers)
    outputs = tuple(_spec(label, "output", v) for v in graph.output)
    props = {p.key: p.value for p in proto.metadata_props}
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    meta = parse_metadata_text(props.get(METADATA_KEY, ""), source=str(path), what=f"metadata_props[{METADATA_KEY!r}]")
    return OnnxModel(
        path=path, inputs=inputs, outputs=outputs, opset=int(opset), producer=proto.producer_name,
        metadata=meta, props=props,
    )  # fmt: skip


def _spec(model: str, kind: str, value: Any) -> TensorSpec:
    tensor = value.type.tensor_type
    where = f"model {model!r} {kind} {value.name!r}"
    if not value.type.HasField("tensor_type"):
        raise ConfigError(f"{where}: only tensors can be served, got an ONNX {value.type.WhichOneof('value')}")
    dtype = _ONNX_TO_TRITON.get(tensor.elem_type)
    if dtype is None:
        raise ConfigError(f"{where}: ONNX element type {tensor.elem_type} has no Triton dtype")
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim)
    if not tensor.HasField("shape") or not dims:
        raise ConfigError(f"{where}: the graph gives no shape (rank); export it with shapes")
    return TensorSpec(name=value.name, dtype=dtype, shape=dims)


def graph_conflicts(signature: ModelSignature, model: OnnxModel) -> list[str]:
    """What in a declared signature (``config.pbtxt``) the graph does not have or cannot take, one line each."""
    graph = {t.name: t for t in (*model.inputs, *model.outputs)}
    problems = []
    for spec in (*signature.inputs, *signature.outputs):
        found = graph.get(spec.name)
        if found is None:
            problems.append(
                f"model {signature.name!r}: config.pbtxt declares tensor {spec.name!r}, which {str(model.path)!r} "
                f"does not have (graph tensors: {sorted(graph)})"
            )
            continue
        conflict = _conflict(found, spec, signature.max_batch_size)
        if conflict is not None:
            problems.append(f"model {signature.name!r} tensor {spec.name!r}: {conflict}")
    return problems


def _conflict(graph: TensorSpec, declared: TensorSpec, max_batch_size: int) -> str | None:
    """Why a declared tensor cannot feed the graph's, or ``None``: dtype, rank, fixed dims."""
    shape = declared.full_shape(max_batch_size)
    if graph.dtype != declared.dtype:
        return f"dtype: the graph has {graph.dtype}, the configuration {declared.dtype}"
    if len(graph.shape) != len(shape):
        return f"rank: the graph has {list(graph.shape)}, the configuration {list(shape)}"
    for axis, (want, got) in enumerate(zip(graph.shape, shape, strict=True)):
        if want != -1 and got != want:
            return f"dim {axis}: the graph fixes {want}, the configuration says {got} (shape {list(shape)})"
    return None
