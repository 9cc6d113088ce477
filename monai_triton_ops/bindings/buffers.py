"""Where a Python buffer's bytes are, for C: the address and size of an input Triton reads.

Triton reads an input's bytes in place, so the buffer must be contiguous; a strided view is refused with
the call that makes it contiguous rather than copied behind the caller's back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .error import InvalidArgumentError


def buffer_address(data: Any, name: str) -> tuple[int, int]:
    """``(address, byte size)`` of a contiguous buffer: numpy array, torch tensor, or bytes-like object."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise InvalidArgumentError(
                f"input {name!r}: the array is not C-contiguous (shape {data.shape}, strides {data.strides}); "
                "pass np.ascontiguousarray(array)"
            )
        return int(data.ctypes.data), int(data.nbytes)
    if hasattr(data, "data_ptr") and hasattr(data, "is_contiguous"):  # torch.Tensor, on any device
        if not data.is_contiguous():
            raise InvalidArgumentError(f"input {name!r}: the tensor is not contiguous; pass tensor.contiguous()")
        return int(data.data_ptr()), int(data.numel() * data.element_size())
    view = memoryview(data)
    if not view.c_contiguous:
        raise InvalidArgumentError(f"input {name!r}: the buffer is not C-contiguous")
    array = np.frombuffer(view.cast("B"), dtype=np.uint8)
    return (int(array.ctypes.data) if array.size else 0), int(array.nbytes)
