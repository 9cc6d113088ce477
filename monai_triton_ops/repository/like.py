"""``--like CONFIG``: a new repository entry shaped like an existing ``config.pbtxt``.

An app written against a Triton model already has its configuration: the App SDK's remote example
keeps a client-side ``models_client_side/spleen_ct/config.pbtxt`` (``INPUT_0``/``OUTPUT_0``,
``max_batch_size: 16``, ``KIND_GPU``, ``DISABLE_OPTIMIZED_EXECUTION``). ``repo build --like`` takes
from it the tensor names, dtypes and dims, ``max_batch_size``, dynamic batching, instance groups,
version policy, parameters, ``default_model_filename`` and every other top-level field, so the
served model answers that app's client unchanged. The model file is still the authority on what it
computes: its signature (metadata or probe, checked by a run on the template's shapes when they are
concrete) must agree with the template's, tensor by tensor, or the build fails naming both.

Sub-fields this package does not model inside a modelled section (an input's ``reshape``, an
instance group's ``gpus``, the batcher's queue policy) are listed in a warning, not carried.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..signature import ModelSignature, TensorSpec
from . import layout
from .config import FLAVORS, ConfigOptions, options_from_config, read_config, signature_from_config

logger = logging.getLogger(__name__)

#: Sub-fields of modelled sections that are carried over; any other one set in a template is reported.
_CARRIED = {
    "input": {"name", "data_type", "dims"},
    "output": {"name", "data_type", "dims"},
    "instance_group": {"kind", "count"},
    "dynamic_batching": {"preferred_batch_size", "max_queue_delay_microseconds"},
}


@dataclass(frozen=True, kw_only=True, eq=False)
class Template:
    """An existing ``config.pbtxt`` that a new entry is shaped like."""

    path: Path
    config: Any  # tritonclient's ModelConfig message (untyped)

    @property
    def name(self) -> str:
        """The template's model name, or its folder's when it names none (as the App SDK's does)."""
        return str(self.config.name)

    @property
    def flavor(self) -> str | None:
        """``python`` or ``libtorch`` when the template is for one of this package's flavours, else ``None``."""
        if self.config.platform == "pytorch_libtorch" or self.config.backend == "pytorch":
            return "libtorch"
        return "python" if self.config.backend == "python" else None

    @property
    def max_batch_size(self) -> int:
        return int(self.config.max_batch_size)

    def signature(self) -> ModelSignature:
        """The tensors the template declares (names, dtypes, dims) and its batching."""
        return signature_from_config(self.config)

    def options(self, flavor: str | None) -> ConfigOptions:
        """Everything but the tensors, served as ``flavor`` (default: the template's own)."""
        chosen = flavor or self.flavor
        if chosen is None:
            found = self.config.platform or self.config.backend or "none"
            raise ConfigError(
                f"--like {str(self.path)!r}: it is a configuration for platform/backend {found!r}; "
                f"choose how to serve the TorchScript model with --flavor ({' or '.join(FLAVORS)})"
            )
        return options_from_config(self.config, flavor=chosen)

    def example_shapes(self, max_batch_size: int) -> list[tuple[int, ...]] | None:
        """One concrete input shape per input (batch 1) when every other dim is fixed; ``None`` otherwise."""
        signature = _rebatched(self.signature(), max_batch_size, str(self.path))
        shapes = []
        for spec in signature.inputs:
            shape = spec.full_shape(max_batch_size)
            concrete = (1, *shape[1:]) if shape and shape[0] == -1 else shape
            if any(d < 1 for d in concrete):
                return None
            shapes.append(tuple(concrete))
        return shapes

    def input_dtypes(self) -> list[str]:
        return [spec.dtype for spec in self.signature().inputs]

    def dropped(self) -> list[str]:
        """Sub-fields set in the template that the new entry will not have."""
        found = []
        for section, carried in _CARRIED.items():
            value = getattr(self.config, section)
            items = list(value) if section != "dynamic_batching" else [value]
            for position, item in enumerate(items):
                label = _label(section, item, position)
                found += [f"{label}.{field.name}" for field, _ in item.ListFields() if field.name not in carried]
        return found

    def apply(self, described: ModelSignature) -> ModelSignature:
        """The template's tensors for ``described``'s model, once every tensor agrees with the model file."""
        declared = _rebatched(self.signature(), described.max_batch_size, str(self.path))
        model = described.name
        inputs = _merge(model, "input", declared.inputs, described.inputs, str(self.path))
        outputs = _merge(model, "output", declared.outputs, described.outputs, str(self.path))
        metadata = described.metadata or declared.metadata
        return ModelSignature(
            name=model, inputs=inputs, outputs=outputs, max_batch_size=declared.max_batch_size, metadata=metadata
        )


def read_template(path: str | Path) -> Template:
    """The template at ``path``: a ``config.pbtxt``, or a model folder holding one."""
    file = Path(path)
    if file.is_dir():
        file = file / layout.CONFIG_FILENAME
    config = read_config(file, default_name=file.parent.name or None)
    template = Template(path=file, config=config)
    dropped = template.dropped()
    if dropped:
        logger.warning(
            "--like %s: these fields are not carried over (edit the written config.pbtxt to add them): %s",
            file,
            ", ".join(dropped),
        )
    return template


def _rebatched(signature: ModelSignature, max_batch_size: int, where: str) -> ModelSignature:
    """The template's tensors for another ``max_batch_size`` (an explicit option overrides the template's)."""
    if (signature.max_batch_size > 0) == (max_batch_size > 0):
        return replace(signature, max_batch_size=max_batch_size)
    if max_batch_size == 0:  # the batch dim becomes explicit: the first dim of every tensor
        grow = [replace(s, shape=(-1, *s.shape)) for s in (*signature.inputs, *signature.outputs)]
    else:
        leading = [s.name for s in (*signature.inputs, *signature.outputs) if not s.shape or s.shape[0] != -1]
        if leading:
            raise ConfigError(
                f"--like {where}: with max_batch_size {max_batch_size} the first dim becomes the batch, but "
                f"tensors {leading} do not start with -1"
            )
        grow = [replace(s, shape=s.shape[1:]) for s in (*signature.inputs, *signature.outputs)]
    count = len(signature.inputs)
    return replace(signature, inputs=tuple(grow[:count]), outputs=tuple(grow[count:]), max_batch_size=max_batch_size)


def _label(section: str, item: Any, position: int) -> str:
    if section in ("input", "output"):
        return f"{section} {item.name!r}"
    return section if section == "dynamic_batching" else f"{section}[{position}]"


def _merge(
    model: str, kind: str, declared: Sequence[TensorSpec], described: Sequence[TensorSpec], where: str
) -> tuple[TensorSpec, ...]:
    """The declared specs, checked against the model's: count, dtype, rank, and every dim."""
    if len(declared) != len(described):
        raise ConfigError(
            f"model {model!r}: {where} declares {len(declared)} {kind}(s) {[s.name for s in declared]}, "
            f"the model file has {len(described)} {[s.name for s in described]}"
        )
    for position, (ours, theirs) in enumerate(zip(declared, described, strict=True)):
        problem = _disagreement(ours, theirs)
        if problem:
            raise ConfigError(
                f"model {model!r} {kind} {position} ({ours.name}): {where} says {ours.dtype} {list(ours.shape)}, "
                f"the model file {theirs.dtype} {list(theirs.shape)} ({problem})"
            )
    return tuple(declared)


def _disagreement(declared: TensorSpec, described: TensorSpec) -> str | None:
    """Why the template's spec cannot describe the model's; a fixed size may narrow a dynamic one."""
    if declared.dtype != described.dtype:
        return "different dtypes"
    if len(declared.shape) != len(described.shape):
        return "different ranks"
    for axis, (ours, theirs) in enumerate(zip(declared.shape, described.shape, strict=True)):
        if ours == -1 and theirs != -1:
            return f"dim {axis}: the config allows any size, the model takes only {theirs}"
        if theirs not in (-1, ours):
            return f"dim {axis}: {ours} against {theirs}"
    return None
