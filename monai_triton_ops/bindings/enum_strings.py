"""The C API's ``*String`` functions of its enums, and ``TRITONSERVER_StringToDataType`` / ``DataTypeByteSize``."""

from __future__ import annotations

from ._library import lib
from .enums import (
    TRITONSERVER_DataType,
    TRITONSERVER_InferenceTraceActivity,
    TRITONSERVER_InferenceTraceLevel,
    TRITONSERVER_InstanceGroupKind,
    TRITONSERVER_MemoryType,
    TRITONSERVER_ParameterType,
)


# -- the C API's string functions ---------------------------------------------------------------------
def _string(function: str, value: int) -> str:
    text = getattr(lib(), function)(int(value))
    return "" if text is None else str(text.decode())


def TRITONSERVER_DataTypeString(datatype: TRITONSERVER_DataType) -> str:
    return _string("TRITONSERVER_DataTypeString", datatype)


def TRITONSERVER_StringToDataType(dtype: str) -> TRITONSERVER_DataType:
    return TRITONSERVER_DataType(lib().TRITONSERVER_StringToDataType(dtype.encode()))


def TRITONSERVER_DataTypeByteSize(datatype: TRITONSERVER_DataType) -> int:
    return int(lib().TRITONSERVER_DataTypeByteSize(int(datatype)))


def TRITONSERVER_MemoryTypeString(memtype: TRITONSERVER_MemoryType) -> str:
    return _string("TRITONSERVER_MemoryTypeString", memtype)


def TRITONSERVER_ParameterTypeString(paramtype: TRITONSERVER_ParameterType) -> str:
    return _string("TRITONSERVER_ParameterTypeString", paramtype)


def TRITONSERVER_InstanceGroupKindString(kind: TRITONSERVER_InstanceGroupKind) -> str:
    return _string("TRITONSERVER_InstanceGroupKindString", kind)


def TRITONSERVER_InferenceTraceLevelString(level: TRITONSERVER_InferenceTraceLevel) -> str:
    return _string("TRITONSERVER_InferenceTraceLevelString", level)


def TRITONSERVER_InferenceTraceActivityString(activity: TRITONSERVER_InferenceTraceActivity) -> str:
    return _string("TRITONSERVER_InferenceTraceActivityString", activity)
