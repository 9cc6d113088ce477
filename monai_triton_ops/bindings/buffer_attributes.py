"""``TRITONSERVER_BufferAttributes``: where a buffer lives (memory type, device, size, CUDA IPC handle)."""

from __future__ import annotations

import ctypes

from ._library import lib
from ._object import State, TritonObject
from .enums import TRITONSERVER_MemoryType

#: ``sizeof(cudaIpcMemHandle_t)``, what Triton copies from the pointer it is given.
CUDA_IPC_HANDLE_SIZE = 64


class TRITONSERVER_BufferAttributes(TritonObject):
    """Made by Python (``TRITONSERVER_BufferAttributesNew``) or borrowed in an allocator's attributes callback."""

    _c_delete = "TRITONSERVER_BufferAttributesDelete"

    def __init__(self, pointer: int | None = None, *, state: State = State.OWNED) -> None:
        if pointer is None:
            out = ctypes.c_void_p()
            lib().TRITONSERVER_BufferAttributesNew(ctypes.byref(out))
            pointer = out.value or 0
        super().__init__(pointer, state=state)

    @property
    def memory_type_id(self) -> int:
        value = ctypes.c_int64()
        lib().TRITONSERVER_BufferAttributesMemoryTypeId(self._ptr(), ctypes.byref(value))
        return value.value

    @memory_type_id.setter
    def memory_type_id(self, value: int) -> None:
        lib().TRITONSERVER_BufferAttributesSetMemoryTypeId(self._ptr(), int(value))

    @property
    def memory_type(self) -> TRITONSERVER_MemoryType:
        value = ctypes.c_int()
        lib().TRITONSERVER_BufferAttributesMemoryType(self._ptr(), ctypes.byref(value))
        return TRITONSERVER_MemoryType(value.value)

    @memory_type.setter
    def memory_type(self, value: TRITONSERVER_MemoryType) -> None:
        lib().TRITONSERVER_BufferAttributesSetMemoryType(self._ptr(), int(value))

    @property
    def cuda_ipc_handle(self) -> bytes | None:
        """The CUDA IPC handle (a ``cudaIpcMemHandle_t``, copied out), or ``None``."""
        value = ctypes.c_void_p()
        lib().TRITONSERVER_BufferAttributesCudaIpcHandle(self._ptr(), ctypes.byref(value))
        return ctypes.string_at(value.value, CUDA_IPC_HANDLE_SIZE) if value.value else None

    @cuda_ipc_handle.setter
    def cuda_ipc_handle(self, value: bytes) -> None:
        # Triton copies CUDA_IPC_HANDLE_SIZE bytes from the pointer: anything shorter reads past the buffer.
        if len(value) != CUDA_IPC_HANDLE_SIZE:
            raise ValueError(f"a CUDA IPC handle is {CUDA_IPC_HANDLE_SIZE} bytes, got {len(value)}")
        buffer = ctypes.create_string_buffer(bytes(value), CUDA_IPC_HANDLE_SIZE)
        lib().TRITONSERVER_BufferAttributesSetCudaIpcHandle(self._ptr(), ctypes.addressof(buffer))

    @property
    def byte_size(self) -> int:
        value = ctypes.c_size_t()
        lib().TRITONSERVER_BufferAttributesByteSize(self._ptr(), ctypes.byref(value))
        return value.value

    @byte_size.setter
    def byte_size(self, value: int) -> None:
        lib().TRITONSERVER_BufferAttributesSetByteSize(self._ptr(), int(value))
