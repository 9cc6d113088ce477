"""The one tensor codec of the transports: an array as the wire takes it, and wire bytes as numpy.

The Open Inference Protocol carries a tensor as ``datatype``, ``shape`` and raw little-endian bytes in row-major
order (``raw_input_contents`` / ``raw_output_contents`` over gRPC, the binary tensor extension over HTTP; a
BYTES element is a 4-byte length and its bytes). Inputs come as C-contiguous numpy arrays (the remote backend
makes them with ``backends/arrays.py``'s ``to_numpy``): a request body is joined from the flat byte view
:func:`tensor_bytes` gives of one (``grpc_wire.py``, ``http_wire.py``), and a shared memory slot copies from one.
Outputs come back as raw bytes in a response body and are read with this package's one dtype table
(``signature.dtype_to_numpy``: ``BF16`` as raw 16-bit words, numpy having no bfloat16) by :func:`decode` (a
slot's outputs are views with the same table, ``backends/remote/exchange.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor


def tensor_bytes(array: np.ndarray, datatype: str) -> Any:
    """A body input's wire bytes: the array's own memory (flat, C order, no copy), or BYTES elements serialized
    (a 4-byte length and the bytes of each, what tritonclient sends)."""
    if datatype == "BYTES":
        serialized = serialize_byte_tensor(array)
        return serialized.item() if serialized.size > 0 else b""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def decode(data: Any, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor whose wire bytes are ``data`` (bytes-like): a view for every datatype but BYTES, whose elements
    are decoded. Raises ``ValueError`` when the bytes do not fill ``shape``."""
    if datatype == "BYTES":
        values = deserialize_bytes_tensor(data) if data else np.empty(0, dtype=np.object_)
        return np.asarray(values).reshape(shape)
    from ...signature import dtype_to_numpy  # here: signature imports torch, which a control call never needs

    return np.frombuffer(data, dtype=dtype_to_numpy(datatype)).reshape(shape)
