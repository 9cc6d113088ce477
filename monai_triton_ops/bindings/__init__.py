"""A Python binding of the Triton server C API (``tritonserver.h``, API 1.34), with enforced ownership.

One wrapper class per C struct, named as in C; enums without their prefix; out-parameters returned;
errors raised by code; see ``docs/binding.md`` for the conventions, the ownership rules and a full
inference written against this package alone. No policy lives here: the in-process backend builds on it.
"""

from ._library import check_api_version as check_api_version
from ._library import load_library as load_library
from ._library import loaded_library as loaded_library
from ._object import State as State
from ._object import live_handles as live_handles
from .allocator import ArrayAllocator as ArrayAllocator
from .allocator import TRITONSERVER_ResponseAllocator as TRITONSERVER_ResponseAllocator
from .buffer_attributes import TRITONSERVER_BufferAttributes as TRITONSERVER_BufferAttributes
from .declarations import API_VERSION as API_VERSION
from .dtypes import numpy_dtype as numpy_dtype
from .dtypes import triton_dtype as triton_dtype
from .enum_strings import TRITONSERVER_DataTypeByteSize as TRITONSERVER_DataTypeByteSize
from .enum_strings import TRITONSERVER_DataTypeString as TRITONSERVER_DataTypeString
from .enum_strings import TRITONSERVER_InferenceTraceActivityString as TRITONSERVER_InferenceTraceActivityString
from .enum_strings import TRITONSERVER_InferenceTraceLevelString as TRITONSERVER_InferenceTraceLevelString
from .enum_strings import TRITONSERVER_InstanceGroupKindString as TRITONSERVER_InstanceGroupKindString
from .enum_strings import TRITONSERVER_MemoryTypeString as TRITONSERVER_MemoryTypeString
from .enum_strings import TRITONSERVER_ParameterTypeString as TRITONSERVER_ParameterTypeString
from .enum_strings import TRITONSERVER_StringToDataType as TRITONSERVER_StringToDataType
from .enums import TRITONSERVER_DataType as TRITONSERVER_DataType
from .enums import TRITONSERVER_Error_Code as TRITONSERVER_Error_Code
from .enums import TRITONSERVER_InferenceTraceActivity as TRITONSERVER_InferenceTraceActivity
from .enums import TRITONSERVER_InferenceTraceLevel as TRITONSERVER_InferenceTraceLevel
from .enums import TRITONSERVER_InstanceGroupKind as TRITONSERVER_InstanceGroupKind
from .enums import TRITONSERVER_LogFormat as TRITONSERVER_LogFormat
from .enums import TRITONSERVER_LogLevel as TRITONSERVER_LogLevel
from .enums import TRITONSERVER_MemoryType as TRITONSERVER_MemoryType
from .enums import TRITONSERVER_MetricFormat as TRITONSERVER_MetricFormat
from .enums import TRITONSERVER_ModelBatchFlag as TRITONSERVER_ModelBatchFlag
from .enums import TRITONSERVER_ModelControlMode as TRITONSERVER_ModelControlMode
from .enums import TRITONSERVER_ModelIndexFlag as TRITONSERVER_ModelIndexFlag
from .enums import TRITONSERVER_ModelTxnPropertyFlag as TRITONSERVER_ModelTxnPropertyFlag
from .enums import TRITONSERVER_ParameterType as TRITONSERVER_ParameterType
from .enums import TRITONSERVER_RateLimitMode as TRITONSERVER_RateLimitMode
from .enums import TRITONSERVER_RequestFlag as TRITONSERVER_RequestFlag
from .enums import TRITONSERVER_RequestReleaseFlag as TRITONSERVER_RequestReleaseFlag
from .enums import TRITONSERVER_ResponseCompleteFlag as TRITONSERVER_ResponseCompleteFlag
from .error import AlreadyExistsError as AlreadyExistsError
from .error import CancelledError as CancelledError
from .error import InternalError as InternalError
from .error import InvalidArgumentError as InvalidArgumentError
from .error import NotFoundError as NotFoundError
from .error import OwnershipError as OwnershipError
from .error import TritonError as TritonError
from .error import TritonLibraryError as TritonLibraryError
from .error import UnavailableError as UnavailableError
from .error import UnknownError as UnknownError
from .error import UnsupportedError as UnsupportedError
from .log import TRITONSERVER_LogIsEnabled as TRITONSERVER_LogIsEnabled
from .log import TRITONSERVER_LogMessage as TRITONSERVER_LogMessage
from .message import TRITONSERVER_Message as TRITONSERVER_Message
from .metrics import TRITONSERVER_Metrics as TRITONSERVER_Metrics
from .options import TRITONSERVER_ServerOptions as TRITONSERVER_ServerOptions
from .parameter import TRITONSERVER_Parameter as TRITONSERVER_Parameter
from .request import TRITONSERVER_InferenceRequest as TRITONSERVER_InferenceRequest
from .response import ResponseOutput as ResponseOutput
from .response import TRITONSERVER_InferenceResponse as TRITONSERVER_InferenceResponse
from .server import TRITONSERVER_Server as TRITONSERVER_Server
from .trace import TRITONSERVER_InferenceTrace as TRITONSERVER_InferenceTrace

__all__ = [
    # loading
    "API_VERSION",
    "check_api_version",
    "load_library",
    "loaded_library",
    # structs
    "TRITONSERVER_BufferAttributes",
    "TRITONSERVER_InferenceRequest",
    "TRITONSERVER_InferenceResponse",
    "TRITONSERVER_InferenceTrace",
    "TRITONSERVER_Message",
    "TRITONSERVER_Metrics",
    "TRITONSERVER_Parameter",
    "TRITONSERVER_ResponseAllocator",
    "TRITONSERVER_Server",
    "TRITONSERVER_ServerOptions",
    "ArrayAllocator",
    "ResponseOutput",
    "State",
    "live_handles",
    # enums and their string functions
    "TRITONSERVER_DataType",
    "TRITONSERVER_Error_Code",
    "TRITONSERVER_InferenceTraceActivity",
    "TRITONSERVER_InferenceTraceLevel",
    "TRITONSERVER_InstanceGroupKind",
    "TRITONSERVER_LogFormat",
    "TRITONSERVER_LogLevel",
    "TRITONSERVER_MemoryType",
    "TRITONSERVER_MetricFormat",
    "TRITONSERVER_ModelBatchFlag",
    "TRITONSERVER_ModelControlMode",
    "TRITONSERVER_ModelIndexFlag",
    "TRITONSERVER_ModelTxnPropertyFlag",
    "TRITONSERVER_ParameterType",
    "TRITONSERVER_RateLimitMode",
    "TRITONSERVER_RequestFlag",
    "TRITONSERVER_RequestReleaseFlag",
    "TRITONSERVER_ResponseCompleteFlag",
    "TRITONSERVER_DataTypeByteSize",
    "TRITONSERVER_DataTypeString",
    "TRITONSERVER_InferenceTraceActivityString",
    "TRITONSERVER_InferenceTraceLevelString",
    "TRITONSERVER_InstanceGroupKindString",
    "TRITONSERVER_MemoryTypeString",
    "TRITONSERVER_ParameterTypeString",
    "TRITONSERVER_StringToDataType",
    "TRITONSERVER_LogIsEnabled",
    "TRITONSERVER_LogMessage",
    "numpy_dtype",
    "triton_dtype",
    # errors
    "AlreadyExistsError",
    "CancelledError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "OwnershipError",
    "TritonError",
    "TritonLibraryError",
    "UnavailableError",
    "UnknownError",
    "UnsupportedError",
]
