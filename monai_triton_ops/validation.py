"""Input checks against a ``ModelSignature``, run before any tensor leaves the process; output checks after.

Every backend runs the same checks, so a wrong tensor fails the same way (and with the same
message) whether the model runs in-process or on a Triton fleet, and before any server sees it.
A batch larger than ``max_batch_size`` is not an error: the base backend splits it into requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import InferenceError, InputValidationError
from .signature import ModelSignature, TensorSpec, dtype_of


def validate_inputs(signature: ModelSignature, inputs: Mapping[str, Any]) -> None:
    """Raise ``InputValidationError`` unless ``inputs`` match ``signature``.

    Checks names (none missing, none unknown), dtype (no silent casts), rank, every fixed dim,
    and that all inputs share one batch size when the model has a batch axis.
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
        if signature.batch_axis == 0:
            batch_sizes[spec.name] = int(inputs[spec.name].shape[0])
    if len(set(batch_sizes.values())) > 1:
        raise InputValidationError(f"model {model!r}: inputs have different batch sizes {batch_sizes}")


class InputChecks:
    """``validate_inputs`` for one signature, remembering what it accepted.

    The checks depend only on the inputs' names, dtypes and shapes, and a caller sends the same few again
    and again (a sliding window: one shape), so an accepted combination is looked up, not checked anew
    (the lookup costs a tenth of the checks). Thread-safe: a lost race only means checking again.
    """

    def __init__(self, signature: ModelSignature) -> None:
        self.signature = signature
        self._accepted: set[tuple[Any, ...]] = set()

    def __call__(self, inputs: Mapping[str, Any]) -> None:
        try:
            key = tuple((name, value.dtype, value.shape) for name, value in inputs.items())
            if key in self._accepted:
                return
        except (AttributeError, TypeError):  # not an array, or an unhashable shape: the checks say what is wrong
            key = None
        validate_inputs(self.signature, inputs)
        if key is not None:
            if len(self._accepted) >= _ACCEPTED:
                self._accepted.clear()
            self._accepted.add(key)


#: Input combinations remembered per signature (shapes can vary without end).
_ACCEPTED = 256


def check_outputs(
    signature: ModelSignature, requested: Sequence[str], outputs: Mapping[str, Any], *, batch: int | None
) -> None:
    """Raise ``InferenceError`` unless a backend returned exactly the ``requested`` outputs with the signature's
    dtypes and, for one part of a split batch, ``batch`` rows each."""
    model = signature.name
    if outputs.keys() != set(requested):
        raise InferenceError(f"model {model!r} returned outputs {sorted(outputs)}, requested {list(requested)}")
    for name in requested:
        value, expected = outputs[name], signature.output(name).dtype
        actual = dtype_name(value)
        if actual != expected:
            raise InferenceError(f"model {model!r} output {name!r}: expected dtype {expected}, got {actual}")
        if batch is not None and (len(value.shape) == 0 or int(value.shape[0]) != batch):
            raise InferenceError(
                f"model {model!r} output {name!r}: expected a batch of {batch}, got shape {list(value.shape)}"
            )


def dtype_name(value: Any) -> str:
    """The Triton dtype name of an array, or its own dtype text when there is none (for messages)."""
    try:
        return dtype_of(value)
    except ValueError:
        return str(getattr(value, "dtype", type(value).__name__))


def _validate_tensor(signature: ModelSignature, spec: TensorSpec, value: Any) -> None:
    where = f"model {signature.name!r} input {spec.name!r}"
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise InputValidationError(f"{where}: expected a numpy array or torch tensor, got {type(value).__name__}")
    actual_dtype = dtype_name(value)
    if actual_dtype != spec.dtype:
        raise InputValidationError(f"{where}: expected dtype {spec.dtype}, got {actual_dtype}")
    mismatch = spec.shape_mismatch(value.shape, signature.max_batch_size)
    if mismatch is not None:
        raise InputValidationError(f"{where}: {mismatch}")
