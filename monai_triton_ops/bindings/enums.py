"""The C API's enums as Python enum classes without the repeated prefix.

``TRITONSERVER_TYPE_FP32`` is ``TRITONSERVER_DataType.FP32``, ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` is
``TRITONSERVER_ResponseCompleteFlag.FINAL``. Values are the header's; flags are :class:`enum.IntFlag`.
"""

from __future__ import annotations

import enum


class TRITONSERVER_DataType(enum.IntEnum):
    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


class TRITONSERVER_MemoryType(enum.IntEnum):
    CPU = 0
    CPU_PINNED = 1
    GPU = 2


class TRITONSERVER_ParameterType(enum.IntEnum):
    STRING = 0
    INT = 1
    BOOL = 2
    DOUBLE = 3
    BYTES = 4


class TRITONSERVER_InstanceGroupKind(enum.IntEnum):
    AUTO = 0
    CPU = 1
    GPU = 2
    MODEL = 3


class TRITONSERVER_LogLevel(enum.IntEnum):
    INFO = 0
    WARN = 1
    ERROR = 2
    VERBOSE = 3


class TRITONSERVER_LogFormat(enum.IntEnum):
    DEFAULT = 0
    ISO8601 = 1


class TRITONSERVER_Error_Code(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TRITONSERVER_MetricFormat(enum.IntEnum):
    PROMETHEUS = 0


class TRITONSERVER_InferenceTraceLevel(enum.IntFlag):
    DISABLED = 0
    MIN = 1
    MAX = 2
    TIMESTAMPS = 0x4
    TENSORS = 0x8


class TRITONSERVER_InferenceTraceActivity(enum.IntEnum):
    REQUEST_START = 0
    QUEUE_START = 1
    COMPUTE_START = 2
    COMPUTE_INPUT_END = 3
    COMPUTE_OUTPUT_START = 4
    COMPUTE_END = 5
    REQUEST_END = 6
    TENSOR_QUEUE_INPUT = 7
    TENSOR_BACKEND_INPUT = 8
    TENSOR_BACKEND_OUTPUT = 9
    CUSTOM_ACTIVITY = 10


class TRITONSERVER_RequestFlag(enum.IntFlag):
    SEQUENCE_START = 1
    SEQUENCE_END = 2


class TRITONSERVER_RequestReleaseFlag(enum.IntFlag):
    ALL = 1
    RESCHEDULE = 2


class TRITONSERVER_ResponseCompleteFlag(enum.IntFlag):
    FINAL = 1


class TRITONSERVER_ModelControlMode(enum.IntEnum):
    NONE = 0
    POLL = 1
    EXPLICIT = 2


class TRITONSERVER_RateLimitMode(enum.IntEnum):
    OFF = 0
    EXEC_COUNT = 1


class TRITONSERVER_ModelBatchFlag(enum.IntFlag):
    UNKNOWN = 1
    FIRST_DIM = 2


class TRITONSERVER_ModelIndexFlag(enum.IntFlag):
    READY = 1


class TRITONSERVER_ModelTxnPropertyFlag(enum.IntFlag):
    ONE_TO_ONE = 1
    DECOUPLED = 2
