"""``TRITONSERVER_Parameter``: a named value passed to model loads and repository registration."""

from __future__ import annotations

import ctypes

from ._library import lib
from ._object import TritonObject
from .enums import TRITONSERVER_ParameterType

ParameterValue = str | int | bool | float | bytes


class TRITONSERVER_Parameter(TritonObject):
    """``TRITONSERVER_ParameterNew`` (str, int, bool, float) or ``TRITONSERVER_ParameterBytesNew`` (bytes).

    Triton copies every value except bytes, which it only points at: the wrapper keeps the bytes alive
    until the parameter is deleted.
    """

    _c_delete = "TRITONSERVER_ParameterDelete"

    def __init__(self, name: str, value: ParameterValue) -> None:
        self.name = name
        self.value = value
        self._keep: object = None
        library = lib()
        key = name.encode()
        if isinstance(value, bytes):
            self.type = TRITONSERVER_ParameterType.BYTES
            buffer = ctypes.create_string_buffer(value, len(value))
            self._keep = buffer
            pointer = library.TRITONSERVER_ParameterBytesNew(key, ctypes.addressof(buffer), len(value))
        else:
            self.type, c_value = _c_value(value)
            self._keep = c_value
            pointer = library.TRITONSERVER_ParameterNew(key, int(self.type), _address(c_value))
        super().__init__(pointer or 0)

    def __repr__(self) -> str:
        return f"<TRITONSERVER_Parameter {self.name}={self.value!r} ({self.type.name})>"


def _c_value(value: str | int | bool | float) -> tuple[TRITONSERVER_ParameterType, object]:
    if isinstance(value, bool):  # before int: bool is an int
        return TRITONSERVER_ParameterType.BOOL, ctypes.c_bool(value)
    if isinstance(value, int):
        return TRITONSERVER_ParameterType.INT, ctypes.c_int64(value)
    if isinstance(value, float):
        return TRITONSERVER_ParameterType.DOUBLE, ctypes.c_double(value)
    if isinstance(value, str):
        return TRITONSERVER_ParameterType.STRING, ctypes.create_string_buffer(value.encode())
    raise TypeError(f"a TRITONSERVER_Parameter holds str, int, bool, float or bytes, not {type(value).__name__}")


def _address(c_value: object) -> int:
    return ctypes.addressof(c_value)  # type: ignore[arg-type]


def parameter_array(parameters: list[TRITONSERVER_Parameter]) -> ctypes.Array[ctypes.c_void_p]:
    """A C array of the parameters' pointers (``const TRITONSERVER_Parameter**``)."""
    return (ctypes.c_void_p * len(parameters))(*(p._ptr() for p in parameters))
