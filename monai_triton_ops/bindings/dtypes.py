"""numpy <-> Triton data types, for the fixed-size types (BYTES and BF16 have no fixed-size numpy dtype)."""

from __future__ import annotations

import numpy as np

from .enums import TRITONSERVER_DataType
from .error import UnsupportedError

# -- numpy <-> Triton dtypes (BYTES and BF16 have no fixed-size numpy dtype) ----------------------------
_NUMPY: dict[TRITONSERVER_DataType, np.dtype[np.generic]] = {
    TRITONSERVER_DataType.BOOL: np.dtype(np.bool_),
    TRITONSERVER_DataType.UINT8: np.dtype(np.uint8),
    TRITONSERVER_DataType.UINT16: np.dtype(np.uint16),
    TRITONSERVER_DataType.UINT32: np.dtype(np.uint32),
    TRITONSERVER_DataType.UINT64: np.dtype(np.uint64),
    TRITONSERVER_DataType.INT8: np.dtype(np.int8),
    TRITONSERVER_DataType.INT16: np.dtype(np.int16),
    TRITONSERVER_DataType.INT32: np.dtype(np.int32),
    TRITONSERVER_DataType.INT64: np.dtype(np.int64),
    TRITONSERVER_DataType.FP16: np.dtype(np.float16),
    TRITONSERVER_DataType.FP32: np.dtype(np.float32),
    TRITONSERVER_DataType.FP64: np.dtype(np.float64),
}
_FROM_NUMPY = {dtype: triton for triton, dtype in _NUMPY.items()}


def numpy_dtype(datatype: TRITONSERVER_DataType) -> np.dtype[np.generic]:
    """The numpy dtype of a fixed-size Triton data type.

    Raises:
        UnsupportedError: BYTES, BF16 or INVALID.
    """
    try:
        return _NUMPY[datatype]
    except KeyError:
        raise UnsupportedError(f"Triton data type {datatype.name} has no numpy dtype") from None


def triton_dtype(dtype: np.dtype[np.generic] | type[np.generic]) -> TRITONSERVER_DataType:
    """The Triton data type of a numpy dtype.

    Raises:
        UnsupportedError: a dtype Triton has no fixed-size type for.
    """
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise UnsupportedError(f"numpy dtype {np.dtype(dtype)} has no Triton data type") from None
