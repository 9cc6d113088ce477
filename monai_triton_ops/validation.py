"""Input checks against a ``ModelSignature``, run before any tensor leaves the process.

Every backend runs the same checks, so a wrong tensor fails the same way (and with the same
message) whether the model runs in-process or on a Triton fleet, and before any server sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InputValidationError
from .signature import ModelSignature, TensorSpec, dtype_of


def validate_inputs(signature: ModelSignature, inputs: Mapping[str, Any]) -> None:
    """Raise ``InputValidationError`` unless ``inputs`` match ``signature`` exactly.

    Checks names (none missing, none unknown), dtype (no silent casts), rank, every fixed dim,
    the batch size against ``max_batch_size``, and that all inputs share one batch size.
    """
    model = signature.name
    missing = [n for n in signature.input_names if n not in inputs]
    unknown = [n for n in inputs if n not in signature.input_names]
    if missing or unknown:
        raise InputValidationError(
            f"model {model!r}: expected inputs {list(signature.input_names)}, got {list(inputs)}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unknown {unknown})" if unknown else "")
        )
    batch_sizes = {}
    for spec in signature.inputs:
        _validate_tensor(signature, spec, inputs[spec.name])
        if signature.max_batch_size > 0:
            batch_sizes[spec.name] = next(iter(inputs[spec.name].shape))
    if len(set(batch_sizes.values())) > 1:
        raise InputValidationError(f"model {model!r}: inputs have different batch sizes {batch_sizes}")


def _validate_tensor(signature: ModelSignature, spec: TensorSpec, value: Any) -> None:
    where = f"model {signature.name!r} input {spec.name!r}"
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise InputValidationError(f"{where}: expected a numpy array or torch tensor, got {type(value).__name__}")
    actual_dtype = _dtype_name(value)
    if actual_dtype != spec.dtype:
        raise InputValidationError(f"{where}: expected dtype {spec.dtype}, got {actual_dtype}")
    expected = spec.full_shape(signature.max_batch_size)
    actual = tuple(int(d) for d in value.shape)
    if len(actual) != len(expected):
        raise InputValidationError(
            f"{where}: expected {len(expected)} dims {list(expected)}, got {len(actual)} dims {list(actual)}"
        )
    for axis, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if want != -1 and want != got:
            raise InputValidationError(
                f"{where}: expected shape {list(expected)}, got {list(actual)} (dim {axis}: expected {want}, got {got})"
            )
    if signature.max_batch_size > 0 and actual[0] > signature.max_batch_size:
        raise InputValidationError(f"{where}: batch size {actual[0]} exceeds max_batch_size {signature.max_batch_size}")


def _dtype_name(value: Any) -> str:
    try:
        return dtype_of(value)
    except ValueError:
        return str(value.dtype)
