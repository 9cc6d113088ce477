"""Tensor names: the ones a user chooses, and what Triton's libtorch backend makes of them.

TorchScript keeps no output names and the libtorch backend cannot read a config's names off the
model, so it maps them by one of three conventions (pytorch_backend ``libtorch.cc``, 24.10):

``FORWARD_ARGUMENT``        inputs only: every input name is a ``forward()`` argument name
``NAMED_INDEX``             every name is ``<stem>__<i>`` (``INPUT__0``); ``i`` is the position
``STRICT_CONFIG_ORDERING``  anything else (``INPUT_0``): tensors are taken in config order

The last one works, by position, which is how the App SDK's ``INPUT_0``/``OUTPUT_0`` configs run on
NGC containers; it is a warning here, not an error. ``NAMED_INDEX`` names whose index is not their
position are refused: libtorch would map them by index while the python runner and the in-process
backends map by position, so the same repository would answer differently on each.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from ..errors import ConfigError
from ..signature import TENSOR_NAME, ModelSignature

#: libtorch's ``<stem>__<index>``: Triton splits at the first ``__`` and wants digits after it.
_NAMED_INDEX = re.compile(r"^(?P<stem>(?:(?!__).)*)__(?P<index>\d+)$")


def named_index(name: str) -> int | None:
    """The ``i`` of ``<stem>__<i>`` as the libtorch backend reads it, else ``None``."""
    match = _NAMED_INDEX.match(name)
    return int(match["index"]) if match else None


def libtorch_naming(signature: ModelSignature, forward_names: Sequence[str] | None = None) -> list[str]:
    """Warnings for tensors the libtorch backend maps by config order; a ``ConfigError`` for a wrong mapping.

    ``forward_names`` are the TorchScript ``forward()`` argument names when the model file is at
    hand; without them, input names that are not ``<stem>__<i>`` may be argument names and are
    only noted as unverified.
    """
    model = signature.name
    warnings = []
    outputs = signature.output_names
    _refuse_misplaced(model, "output", outputs)
    if not all(named_index(n) is not None for n in outputs):
        warnings.append(
            f"model {model!r}: the libtorch backend maps outputs {list(outputs)} by their order in config.pbtxt, "
            f"not by name (names OUTPUT__0..OUTPUT__{len(outputs) - 1} map by name)"
        )
    inputs = signature.input_names
    if forward_names is not None and set(inputs) <= set(forward_names):
        return warnings
    _refuse_misplaced(model, "input", inputs)
    if all(named_index(n) is not None for n in inputs):
        return warnings
    if forward_names is None:
        warnings.append(
            f"model {model!r}: the libtorch backend maps inputs {list(inputs)} by name if they are forward() "
            "argument names, else by their order in config.pbtxt"
        )
    else:
        warnings.append(
            f"model {model!r}: the libtorch backend maps inputs {list(inputs)} by their order in config.pbtxt "
            f"(they are neither forward() argument names {list(forward_names)} nor INPUT__0..INPUT__{len(inputs) - 1})"
        )
    return warnings


def _refuse_misplaced(model: str, kind: str, names: Sequence[str]) -> None:
    """All ``<stem>__<i>``, but some ``i`` is not the position: libtorch would route tensors by ``i``."""
    indices = [named_index(n) for n in names]
    if None in indices or indices == list(range(len(names))):
        return
    upper = kind.upper()
    raise ConfigError(
        f"model {model!r}: the libtorch backend maps {kind} names {list(names)} by the number after '__', "
        f"which must be each {kind}'s position (expected {upper}__0..{upper}__{len(names) - 1} in order)"
    )


def rename(
    signature: ModelSignature, input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None
) -> ModelSignature:
    """``signature`` with the inputs and/or outputs renamed, in order; one name per tensor."""
    model = signature.name
    if input_names:
        _check_names(model, "input", signature.input_names, input_names)
        signature = replace(
            signature,
            inputs=tuple(replace(s, name=n) for s, n in zip(signature.inputs, input_names, strict=True)),
        )
    if output_names:
        _check_names(model, "output", signature.output_names, output_names)
        signature = replace(
            signature,
            outputs=tuple(replace(s, name=n) for s, n in zip(signature.outputs, output_names, strict=True)),
        )
    return signature


def _check_names(model: str, kind: str, current: Sequence[str], wanted: Sequence[str]) -> None:
    if len(wanted) != len(current):
        raise ConfigError(
            f"model {model!r} has {len(current)} {kind}(s) {list(current)}, got {len(wanted)} {kind} name(s) "
            f"{list(wanted)} (--{kind}-name once per {kind}, in order)"
        )
    bad = [n for n in wanted if not TENSOR_NAME.match(n)]
    if bad:
        raise ConfigError(
            f"model {model!r}: {kind} names {bad} are not valid tensor names (letters, digits, '_', "
            "not starting with a digit)"
        )
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f"model {model!r}: {kind} names {list(wanted)} repeat a name")
