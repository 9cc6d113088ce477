"""Every C function the binding calls, declared from ``tritonserver.h`` (core ``r24.10``, API 1.34).

Every function gets ``restype`` and ``argtypes``: without them ctypes truncates pointers and ``size_t`` values to
32 bits. A function returning ``TRITONSERVER_Error*`` is marked :data:`ERR`: the loader gives it an ``errcheck``
that turns the error into the exception of its code. The callback types are the header's typedefs; the wrappers
make their C trampolines from them. Pure data: nothing here loads the library.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_bool, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint, c_uint32, c_uint64, c_void_p
from typing import Any

#: The API version these declarations were written against.
API_VERSION = (1, 34)

_P = c_void_p  # every opaque TRITONSERVER_* pointer
_PP = POINTER(c_void_p)
_S = c_char_p
#: marks functions returning TRITONSERVER_Error*
ERR = "error"

# -- callback types (tritonserver.h typedefs) ---------------------------------------------------------
ALLOC_FN = ctypes.CFUNCTYPE(c_void_p, _P, _S, c_size_t, c_int, c_int64, _P, _PP, _PP, POINTER(c_int), POINTER(c_int64))
BUFFER_ATTRIBUTES_FN = ctypes.CFUNCTYPE(c_void_p, _P, _S, _P, _P, _P)
QUERY_FN = ctypes.CFUNCTYPE(c_void_p, _P, _P, _S, POINTER(c_size_t), POINTER(c_int), POINTER(c_int64))
BUFFER_RELEASE_FN = ctypes.CFUNCTYPE(c_void_p, _P, _P, _P, c_size_t, c_int, c_int64)
START_FN = ctypes.CFUNCTYPE(c_void_p, _P, _P)
TRACE_ACTIVITY_FN = ctypes.CFUNCTYPE(None, _P, c_int, c_uint64, _P)
TRACE_TENSOR_ACTIVITY_FN = ctypes.CFUNCTYPE(
    None, _P, c_int, _S, c_int, _P, c_size_t, POINTER(c_int64), c_uint64, c_int, c_int64, _P
)
TRACE_RELEASE_FN = ctypes.CFUNCTYPE(None, _P, _P)
REQUEST_RELEASE_FN = ctypes.CFUNCTYPE(None, _P, c_uint32, _P)
RESPONSE_COMPLETE_FN = ctypes.CFUNCTYPE(None, _P, c_uint32, _P)

# -- declarations: name -> (restype, argtypes) ---------------------------------------------------------
_E = ERR
DECLARATIONS: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "TRITONSERVER_ApiVersion": (_E, (POINTER(c_uint32), POINTER(c_uint32))),
    # enums as strings
    "TRITONSERVER_DataTypeString": (_S, (c_int,)),
    "TRITONSERVER_StringToDataType": (c_int, (_S,)),
    "TRITONSERVER_DataTypeByteSize": (c_uint32, (c_int,)),
    "TRITONSERVER_MemoryTypeString": (_S, (c_int,)),
    "TRITONSERVER_ParameterTypeString": (_S, (c_int,)),
    "TRITONSERVER_InstanceGroupKindString": (_S, (c_int,)),
    "TRITONSERVER_InferenceTraceLevelString": (_S, (c_int,)),
    "TRITONSERVER_InferenceTraceActivityString": (_S, (c_int,)),
    # logging
    "TRITONSERVER_LogIsEnabled": (c_bool, (c_int,)),
    "TRITONSERVER_LogMessage": (_E, (c_int, _S, c_int, _S)),
    # errors (never errcheck'ed: they are how errors are read)
    "TRITONSERVER_ErrorNew": (_P, (c_int, _S)),
    "TRITONSERVER_ErrorDelete": (None, (_P,)),
    "TRITONSERVER_ErrorCode": (c_int, (_P,)),
    "TRITONSERVER_ErrorCodeString": (_S, (_P,)),
    "TRITONSERVER_ErrorMessage": (_S, (_P,)),
    # parameter
    "TRITONSERVER_ParameterNew": (_P, (_S, c_int, _P)),
    "TRITONSERVER_ParameterBytesNew": (_P, (_S, _P, c_uint64)),
    "TRITONSERVER_ParameterDelete": (None, (_P,)),
    # buffer attributes
    "TRITONSERVER_BufferAttributesNew": (_E, (_PP,)),
    "TRITONSERVER_BufferAttributesDelete": (_E, (_P,)),
    "TRITONSERVER_BufferAttributesSetMemoryTypeId": (_E, (_P, c_int64)),
    "TRITONSERVER_BufferAttributesSetMemoryType": (_E, (_P, c_int)),
    "TRITONSERVER_BufferAttributesSetCudaIpcHandle": (_E, (_P, _P)),
    "TRITONSERVER_BufferAttributesSetByteSize": (_E, (_P, c_size_t)),
    "TRITONSERVER_BufferAttributesMemoryTypeId": (_E, (_P, POINTER(c_int64))),
    "TRITONSERVER_BufferAttributesMemoryType": (_E, (_P, POINTER(c_int))),
    "TRITONSERVER_BufferAttributesCudaIpcHandle": (_E, (_P, _PP)),
    "TRITONSERVER_BufferAttributesByteSize": (_E, (_P, POINTER(c_size_t))),
    # response allocator
    "TRITONSERVER_ResponseAllocatorNew": (_E, (_PP, ALLOC_FN, BUFFER_RELEASE_FN, START_FN)),
    "TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction": (_E, (_P, BUFFER_ATTRIBUTES_FN)),
    "TRITONSERVER_ResponseAllocatorSetQueryFunction": (_E, (_P, QUERY_FN)),
    "TRITONSERVER_ResponseAllocatorDelete": (_E, (_P,)),
    # message
    "TRITONSERVER_MessageNewFromSerializedJson": (_E, (_PP, _S, c_size_t)),
    "TRITONSERVER_MessageDelete": (_E, (_P,)),
    "TRITONSERVER_MessageSerializeToJson": (_E, (_P, POINTER(c_void_p), POINTER(c_size_t))),
    # metrics
    "TRITONSERVER_MetricsDelete": (_E, (_P,)),
    "TRITONSERVER_MetricsFormatted": (_E, (_P, c_int, POINTER(c_void_p), POINTER(c_size_t))),
    # trace
    "TRITONSERVER_InferenceTraceNew": (_E, (_PP, c_int, c_uint64, TRACE_ACTIVITY_FN, TRACE_RELEASE_FN, _P)),
    "TRITONSERVER_InferenceTraceTensorNew": (
        _E,
        (_PP, c_int, c_uint64, TRACE_ACTIVITY_FN, TRACE_TENSOR_ACTIVITY_FN, TRACE_RELEASE_FN, _P),
    ),
    "TRITONSERVER_InferenceTraceReportActivity": (_E, (_P, c_uint64, _S)),
    "TRITONSERVER_InferenceTraceDelete": (_E, (_P,)),
    "TRITONSERVER_InferenceTraceId": (_E, (_P, POINTER(c_uint64))),
    "TRITONSERVER_InferenceTraceParentId": (_E, (_P, POINTER(c_uint64))),
    "TRITONSERVER_InferenceTraceModelName": (_E, (_P, POINTER(c_char_p))),
    "TRITONSERVER_InferenceTraceModelVersion": (_E, (_P, POINTER(c_int64))),
    "TRITONSERVER_InferenceTraceRequestId": (_E, (_P, POINTER(c_char_p))),
    "TRITONSERVER_InferenceTraceSpawnChildTrace": (_E, (_P, _PP)),
    "TRITONSERVER_InferenceTraceSetContext": (_E, (_P, _S)),
    "TRITONSERVER_InferenceTraceContext": (_E, (_P, POINTER(c_char_p))),
    # inference request
    "TRITONSERVER_InferenceRequestNew": (_E, (_PP, _P, _S, c_int64)),
    "TRITONSERVER_InferenceRequestDelete": (_E, (_P,)),
    "TRITONSERVER_InferenceRequestId": (_E, (_P, POINTER(c_char_p))),
    "TRITONSERVER_InferenceRequestSetId": (_E, (_P, _S)),
    "TRITONSERVER_InferenceRequestFlags": (_E, (_P, POINTER(c_uint32))),
    "TRITONSERVER_InferenceRequestSetFlags": (_E, (_P, c_uint32)),
    "TRITONSERVER_InferenceRequestCorrelationId": (_E, (_P, POINTER(c_uint64))),
    "TRITONSERVER_InferenceRequestCorrelationIdString": (_E, (_P, POINTER(c_char_p))),
    "TRITONSERVER_InferenceRequestSetCorrelationId": (_E, (_P, c_uint64)),
    "TRITONSERVER_InferenceRequestSetCorrelationIdString": (_E, (_P, _S)),
    "TRITONSERVER_InferenceRequestCancel": (_E, (_P,)),
    "TRITONSERVER_InferenceRequestIsCancelled": (_E, (_P, POINTER(c_bool))),
    "TRITONSERVER_InferenceRequestPriority": (_E, (_P, POINTER(c_uint32))),
    "TRITONSERVER_InferenceRequestPriorityUInt64": (_E, (_P, POINTER(c_uint64))),
    "TRITONSERVER_InferenceRequestSetPriority": (_E, (_P, c_uint32)),
    "TRITONSERVER_InferenceRequestSetPriorityUInt64": (_E, (_P, c_uint64)),
    "TRITONSERVER_InferenceRequestTimeoutMicroseconds": (_E, (_P, POINTER(c_uint64))),
    "TRITONSERVER_InferenceRequestSetTimeoutMicroseconds": (_E, (_P, c_uint64)),
    "TRITONSERVER_InferenceRequestAddInput": (_E, (_P, _S, c_int, POINTER(c_int64), c_uint64)),
    "TRITONSERVER_InferenceRequestAddRawInput": (_E, (_P, _S)),
    "TRITONSERVER_InferenceRequestRemoveInput": (_E, (_P, _S)),
    "TRITONSERVER_InferenceRequestRemoveAllInputs": (_E, (_P,)),
    "TRITONSERVER_InferenceRequestAppendInputData": (_E, (_P, _S, _P, c_size_t, c_int, c_int64)),
    "TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy": (_E, (_P, _S, _P, c_size_t, c_int, c_int64, _S)),
    "TRITONSERVER_InferenceRequestAppendInputDataWithBufferAttributes": (_E, (_P, _S, _P, _P)),
    "TRITONSERVER_InferenceRequestRemoveAllInputData": (_E, (_P, _S)),
    "TRITONSERVER_InferenceRequestAddRequestedOutput": (_E, (_P, _S)),
    "TRITONSERVER_InferenceRequestRemoveRequestedOutput": (_E, (_P, _S)),
    "TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs": (_E, (_P,)),
    "TRITONSERVER_InferenceRequestSetReleaseCallback": (_E, (_P, REQUEST_RELEASE_FN, _P)),
    "TRITONSERVER_InferenceRequestSetResponseCallback": (_E, (_P, _P, _P, RESPONSE_COMPLETE_FN, _P)),
    "TRITONSERVER_InferenceRequestSetStringParameter": (_E, (_P, _S, _S)),
    "TRITONSERVER_InferenceRequestSetIntParameter": (_E, (_P, _S, c_int64)),
    "TRITONSERVER_InferenceRequestSetBoolParameter": (_E, (_P, _S, c_bool)),
    "TRITONSERVER_InferenceRequestSetDoubleParameter": (_E, (_P, _S, c_double)),
    # inference response (InferenceResponseError returns an error the response owns: never errcheck'ed)
    "TRITONSERVER_InferenceResponseDelete": (_E, (_P,)),
    "TRITONSERVER_InferenceResponseError": (_P, (_P,)),
    "TRITONSERVER_InferenceResponseModel": (_E, (_P, POINTER(c_char_p), POINTER(c_int64))),
    "TRITONSERVER_InferenceResponseId": (_E, (_P, POINTER(c_char_p))),
    "TRITONSERVER_InferenceResponseParameterCount": (_E, (_P, POINTER(c_uint32))),
    "TRITONSERVER_InferenceResponseParameter": (_E, (_P, c_uint32, POINTER(c_char_p), POINTER(c_int), _PP)),
    "TRITONSERVER_InferenceResponseOutputCount": (_E, (_P, POINTER(c_uint32))),
    "TRITONSERVER_InferenceResponseOutput": (
        _E,
        (
            _P,
            c_uint32,
            POINTER(c_char_p),
            POINTER(c_int),
            POINTER(POINTER(c_int64)),
            POINTER(c_uint64),
            _PP,
            POINTER(c_size_t),
            POINTER(c_int),
            POINTER(c_int64),
            _PP,
        ),
    ),
    "TRITONSERVER_InferenceResponseOutputClassificationLabel": (_E, (_P, c_uint32, c_size_t, POINTER(c_char_p))),
    # server options
    "TRITONSERVER_ServerOptionsNew": (_E, (_PP,)),
    "TRITONSERVER_ServerOptionsDelete": (_E, (_P,)),
    "TRITONSERVER_ServerOptionsSetServerId": (_E, (_P, _S)),
    "TRITONSERVER_ServerOptionsSetModelRepositoryPath": (_E, (_P, _S)),
    "TRITONSERVER_ServerOptionsSetModelControlMode": (_E, (_P, c_int)),
    "TRITONSERVER_ServerOptionsSetStartupModel": (_E, (_P, _S)),
    "TRITONSERVER_ServerOptionsSetStrictModelConfig": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetModelConfigName": (_E, (_P, _S)),
    "TRITONSERVER_ServerOptionsSetRateLimiterMode": (_E, (_P, c_int)),
    "TRITONSERVER_ServerOptionsAddRateLimiterResource": (_E, (_P, _S, c_size_t, c_int)),
    "TRITONSERVER_ServerOptionsSetPinnedMemoryPoolByteSize": (_E, (_P, c_uint64)),
    "TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize": (_E, (_P, c_int, c_uint64)),
    "TRITONSERVER_ServerOptionsSetCudaVirtualAddressSize": (_E, (_P, c_int, c_size_t)),
    "TRITONSERVER_ServerOptionsSetResponseCacheByteSize": (_E, (_P, c_uint64)),
    "TRITONSERVER_ServerOptionsSetCacheConfig": (_E, (_P, _S, _S)),
    "TRITONSERVER_ServerOptionsSetCacheDirectory": (_E, (_P, _S)),
    "TRITONSERVER_ServerOptionsSetMinSupportedComputeCapability": (_E, (_P, c_double)),
    "TRITONSERVER_ServerOptionsSetExitOnError": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetStrictReadiness": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetExitTimeout": (_E, (_P, c_uint)),
    "TRITONSERVER_ServerOptionsSetBufferManagerThreadCount": (_E, (_P, c_uint)),
    "TRITONSERVER_ServerOptionsSetModelLoadThreadCount": (_E, (_P, c_uint)),
    "TRITONSERVER_ServerOptionsSetModelLoadRetryCount": (_E, (_P, c_uint)),
    "TRITONSERVER_ServerOptionsSetModelNamespacing": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetEnablePeerAccess": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetLogFile": (_E, (_P, _S)),
    "TRITONSERVER_ServerOptionsSetLogInfo": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetLogWarn": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetLogError": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetLogFormat": (_E, (_P, c_int)),
    "TRITONSERVER_ServerOptionsSetLogVerbose": (_E, (_P, c_int)),
    "TRITONSERVER_ServerOptionsSetMetrics": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetGpuMetrics": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetCpuMetrics": (_E, (_P, c_bool)),
    "TRITONSERVER_ServerOptionsSetMetricsInterval": (_E, (_P, c_uint64)),
    "TRITONSERVER_ServerOptionsSetBackendDirectory": (_E, (_P, _S)),
    "TRITONSERVER_ServerOptionsSetRepoAgentDirectory": (_E, (_P, _S)),
    "TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit": (_E, (_P, c_int, c_int, c_double)),
    "TRITONSERVER_ServerOptionsSetBackendConfig": (_E, (_P, _S, _S, _S)),
    "TRITONSERVER_ServerOptionsSetHostPolicy": (_E, (_P, _S, _S, _S)),
    "TRITONSERVER_ServerOptionsSetMetricsConfig": (_E, (_P, _S, _S, _S)),
    # server
    "TRITONSERVER_ServerNew": (_E, (_PP, _P)),
    "TRITONSERVER_ServerDelete": (_E, (_P,)),
    "TRITONSERVER_ServerStop": (_E, (_P,)),
    "TRITONSERVER_ServerSetExitTimeout": (_E, (_P, c_uint)),
    "TRITONSERVER_ServerRegisterModelRepository": (_E, (_P, _S, _PP, c_uint32)),
    "TRITONSERVER_ServerUnregisterModelRepository": (_E, (_P, _S)),
    "TRITONSERVER_ServerPollModelRepository": (_E, (_P,)),
    "TRITONSERVER_ServerIsLive": (_E, (_P, POINTER(c_bool))),
    "TRITONSERVER_ServerIsReady": (_E, (_P, POINTER(c_bool))),
    "TRITONSERVER_ServerModelIsReady": (_E, (_P, _S, c_int64, POINTER(c_bool))),
    "TRITONSERVER_ServerModelBatchProperties": (_E, (_P, _S, c_int64, POINTER(c_uint32), _PP)),
    "TRITONSERVER_ServerModelTransactionProperties": (_E, (_P, _S, c_int64, POINTER(c_uint32), _PP)),
    "TRITONSERVER_ServerMetadata": (_E, (_P, _PP)),
    "TRITONSERVER_ServerModelMetadata": (_E, (_P, _S, c_int64, _PP)),
    "TRITONSERVER_ServerModelStatistics": (_E, (_P, _S, c_int64, _PP)),
    "TRITONSERVER_ServerModelConfig": (_E, (_P, _S, c_int64, c_uint32, _PP)),
    "TRITONSERVER_ServerModelIndex": (_E, (_P, c_uint32, _PP)),
    "TRITONSERVER_ServerLoadModel": (_E, (_P, _S)),
    "TRITONSERVER_ServerLoadModelWithParameters": (_E, (_P, _S, _PP, c_uint64)),
    "TRITONSERVER_ServerUnloadModel": (_E, (_P, _S)),
    "TRITONSERVER_ServerUnloadModelAndDependents": (_E, (_P, _S)),
    "TRITONSERVER_ServerMetrics": (_E, (_P, _PP)),
    "TRITONSERVER_ServerInferAsync": (_E, (_P, _P, _P)),
}
