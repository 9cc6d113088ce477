"""``TRITONSERVER_ResponseAllocator``: Python callables that give Triton the memory outputs are written to.

The C callbacks are static trampolines (created once, never collected). They find the Python side through
handles: the request's handle is the ``response_allocator_userp`` (see ``request.py``), and each buffer's
``buffer_userp`` is a handle to its record, held until ``release_fn``. An exception raised by a Python
callback becomes a ``TRITONSERVER_Error`` returned to Triton (never NULL-with-success: Triton would write
through an unset pointer), and the request remembers it so that the response's error is chained to it.
The buffers allocated before a failed allocation stay with the response Triton sends with that error:
the binding deletes that response after its callback, and Triton releases them through ``release_fn``.

An exception from ``release_fn`` belongs to the response whose buffers it releases: Triton calls it inside
``TRITONSERVER_InferenceResponseDelete``, on the thread deleting that response, which collects it
(:func:`collect_release_errors`). An explicit ``response.delete()`` raises it; a response dropped while its
inference is still in flight passes it to that request's future; otherwise it is logged, never raised by
an unrelated call.

:class:`ArrayAllocator` allocates a fresh numpy array (or torch tensor) per output; the response hands that
array out as it is, so outputs reach the caller without a copy and stay valid after the response is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from . import declarations
from ._library import lib, new_error
from ._object import State, TritonObject, drop_handle, handle_object, new_handle
from .buffer_attributes import TRITONSERVER_BufferAttributes
from .enums import TRITONSERVER_MemoryType
from .error import OwnershipError

logger = logging.getLogger(__name__)

MemoryType = TRITONSERVER_MemoryType
#: alloc_fn(allocator, tensor_name, byte_size, memory_type, memory_type_id, user_object)
#: -> (buffer address, buffer user object, actual memory type, actual memory type id)
AllocFn = Callable[["TRITONSERVER_ResponseAllocator", str, int, MemoryType, int, Any], tuple[int, Any, MemoryType, int]]
#: release_fn(allocator, buffer address, buffer user object, byte_size, memory_type, memory_type_id)
ReleaseFn = Callable[["TRITONSERVER_ResponseAllocator", int, Any, int, MemoryType, int], None]
#: start_fn(allocator, user_object)
StartFn = Callable[["TRITONSERVER_ResponseAllocator", Any], None]
#: buffer_attributes_fn(allocator, tensor_name, buffer_attributes (borrowed: fill it), user_object, buffer user object)
BufferAttributesFn = Callable[["TRITONSERVER_ResponseAllocator", str, TRITONSERVER_BufferAttributes, Any, Any], None]
#: query_fn(allocator, user_object, tensor_name | None, byte_size | None, memory_type, memory_type_id)
#: -> (memory type, memory type id)
QueryFn = Callable[
    ["TRITONSERVER_ResponseAllocator", Any, str | None, int | None, MemoryType, int], tuple[MemoryType, int]
]


class Flight(Protocol):
    """The inference a buffer was allocated for (``flight.Flight``): where its callbacks' exceptions go."""

    @property
    def completed(self) -> bool: ...

    def note(self, exc: BaseException) -> None: ...


class AllocationContext(Protocol):
    """What an allocator callback's ``userp`` handle stands for: an in-flight request."""

    @property
    def _flight(self) -> Flight | None: ...

    def _allocation(self) -> tuple[TRITONSERVER_ResponseAllocator, Any]: ...

    def _callback_failed(self, exc: BaseException) -> None: ...


@dataclass
class _Buffer:
    allocator: TRITONSERVER_ResponseAllocator
    user_object: Any
    flight: Flight | None
    """The inference whose response holds the buffer."""


class TRITONSERVER_ResponseAllocator(TritonObject):
    """``TRITONSERVER_ResponseAllocatorNew`` with Python callables (signatures above).

    The C allocator is deleted only when no request set with it and no buffer it allocated is alive:
    ``delete()`` refuses earlier (a response released later would call through freed memory).
    """

    _c_delete = "TRITONSERVER_ResponseAllocatorDelete"

    def __init__(self, alloc_fn: AllocFn, release_fn: ReleaseFn | None, start_fn: StartFn | None = None) -> None:
        self._alloc_fn = alloc_fn
        self._release_fn = release_fn
        self._start_fn = start_fn
        self._buffer_attributes_fn: BufferAttributesFn | None = None
        self._query_fn: QueryFn | None = None
        self._buffers: set[int] = set()
        self._requests: weakref.WeakSet[Any] = weakref.WeakSet()
        out = ctypes.c_void_p()
        start = _START if start_fn is not None else declarations.START_FN()
        lib().TRITONSERVER_ResponseAllocatorNew(ctypes.byref(out), _ALLOC, _RELEASE, start)
        super().__init__(out.value or 0)

    def set_buffer_attributes_function(self, fn: BufferAttributesFn) -> None:
        """``TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction``."""
        self._buffer_attributes_fn = fn
        lib().TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction(self._ptr(), _BUFFER_ATTRIBUTES)

    def set_query_function(self, fn: QueryFn) -> None:
        """``TRITONSERVER_ResponseAllocatorSetQueryFunction``."""
        self._query_fn = fn
        lib().TRITONSERVER_ResponseAllocatorSetQueryFunction(self._ptr(), _QUERY)

    @property
    def buffers_in_use(self) -> int:
        """Buffers allocated and not yet released (their responses are alive)."""
        return len(self._buffers)

    def delete(self) -> None:
        """Delete the C allocator.

        Raises:
            OwnershipError: a request still refers to it or a buffer it allocated is still held by a response.
        """
        requests = [r for r in list(self._requests) if r.owner_state is not State.DELETED]
        if self._state is State.OWNED and (self._buffers or requests):
            raise OwnershipError(
                f"TRITONSERVER_ResponseAllocator is still in use by {len(requests)} request(s) and "
                f"{len(self._buffers)} output buffer(s); delete them (or their responses) first"
            )
        super().delete()

    def _use_for(self, request: Any) -> None:
        self._ptr()
        self._requests.add(request)


# -- where a release_fn exception goes -----------------------------------------------------------------
_deleting = threading.local()


@contextlib.contextmanager
def collect_release_errors() -> Iterator[list[BaseException]]:
    """Around a ``TRITONSERVER_InferenceResponseDelete``: the exceptions its ``release_fn`` calls raise.

    Triton releases the buffers synchronously, on the deleting thread; nested deletions (a ``release_fn`` that
    drops another response) collect into their own list.
    """
    stack: list[list[BaseException]] | None = getattr(_deleting, "stack", None)
    if stack is None:
        stack = _deleting.stack = []
    errors: list[BaseException] = []
    stack.append(errors)
    try:
        yield errors
    finally:
        stack.pop()


def deliver_release_error(exc: BaseException, flight: Flight | None) -> None:
    """A ``release_fn`` exception no deletion collects: to its inference's future, or the log if that completed."""
    if flight is not None and not flight.completed:
        flight.note(exc)
    else:
        logger.error("a release_fn raised after its inference had completed (nothing left to raise it to): %r", exc)


# -- trampolines --------------------------------------------------------------------------------------


def _context(userp: int | None) -> AllocationContext:
    context: AllocationContext | None = handle_object(userp)
    if context is None:
        raise OwnershipError("allocator called for a request that is not in flight")
    return context


def _alloc(
    _allocator: int | None,
    tensor_name: bytes | None,
    byte_size: int,
    memory_type: int,
    memory_type_id: int,
    userp: int | None,
    buffer: Any,
    buffer_userp: Any,
    actual_memory_type: Any,
    actual_memory_type_id: Any,
) -> int | None:
    context: AllocationContext | None = None
    try:
        context = _context(userp)
        allocator, user_object = context._allocation()
        name = (tensor_name or b"").decode()
        address, buffer_object, actual_type, actual_id = allocator._alloc_fn(
            allocator, name, byte_size, TRITONSERVER_MemoryType(memory_type), memory_type_id, user_object
        )
        if byte_size and not address:
            raise MemoryError(f"allocator returned no buffer for {byte_size} bytes of output {name!r}")
        handle = new_handle(_Buffer(allocator, buffer_object, context._flight)) if address else None
        if handle is not None:
            allocator._buffers.add(handle)
        buffer[0] = address or None
        buffer_userp[0] = handle
        actual_memory_type[0] = int(actual_type)
        actual_memory_type_id[0] = int(actual_id)
        return None
    except BaseException as exc:
        if context is not None:
            context._callback_failed(exc)
        return new_error(exc)


def _release(
    _allocator: int | None, buffer: int | None, buffer_userp: int | None, byte_size: int, memory_type: int, type_id: int
) -> int | None:
    record: _Buffer | None = None
    try:
        record = drop_handle(buffer_userp)
        if record is None:
            return None
        record.allocator._buffers.discard(buffer_userp or 0)
        if record.allocator._release_fn is not None:
            record.allocator._release_fn(
                record.allocator,
                buffer or 0,
                record.user_object,
                byte_size,
                TRITONSERVER_MemoryType(memory_type),
                type_id,
            )
        return None
    except BaseException as exc:
        stack: list[list[BaseException]] | None = getattr(_deleting, "stack", None)
        if stack:
            stack[-1].append(exc)  # the response being deleted on this thread decides
        else:
            deliver_release_error(exc, record.flight if record is not None else None)
        return new_error(exc)


def _start(_allocator: int | None, userp: int | None) -> int | None:
    context: AllocationContext | None = None
    try:
        context = _context(userp)
        allocator, user_object = context._allocation()
        if allocator._start_fn is not None:
            allocator._start_fn(allocator, user_object)
        return None
    except BaseException as exc:
        if context is not None:
            context._callback_failed(exc)
        return new_error(exc)


def _query(
    _allocator: int | None,
    userp: int | None,
    tensor_name: bytes | None,
    byte_size: Any,
    memory_type: Any,
    memory_type_id: Any,
) -> int | None:
    context: AllocationContext | None = None
    try:
        context = _context(userp)
        allocator, user_object = context._allocation()
        if allocator._query_fn is None:
            return None
        name = tensor_name.decode() if tensor_name is not None else None
        size = byte_size[0] if byte_size else None
        kind, device = allocator._query_fn(
            allocator, user_object, name, size, TRITONSERVER_MemoryType(memory_type[0]), int(memory_type_id[0])
        )
        memory_type[0], memory_type_id[0] = int(kind), int(device)
        return None
    except BaseException as exc:
        if context is not None:
            context._callback_failed(exc)
        return new_error(exc)


def _buffer_attributes(
    _allocator: int | None,
    tensor_name: bytes | None,
    attributes: int | None,
    userp: int | None,
    buffer_userp: int | None,
) -> int | None:
    context: AllocationContext | None = None
    try:
        context = _context(userp)
        allocator, user_object = context._allocation()
        record: _Buffer | None = handle_object(buffer_userp)
        if allocator._buffer_attributes_fn is None:
            return None
        view = TRITONSERVER_BufferAttributes(attributes or 0, state=State.BORROWED)
        try:
            name = (tensor_name or b"").decode()
            allocator._buffer_attributes_fn(allocator, name, view, user_object, record.user_object if record else None)
        finally:
            view._expire()
        return None
    except BaseException as exc:
        if context is not None:
            context._callback_failed(exc)
        return new_error(exc)


_ALLOC = declarations.ALLOC_FN(_alloc)
_RELEASE = declarations.BUFFER_RELEASE_FN(_release)
_START = declarations.START_FN(_start)
_QUERY = declarations.QUERY_FN(_query)
_BUFFER_ATTRIBUTES = declarations.BUFFER_ATTRIBUTES_FN(_buffer_attributes)


# -- the allocator the binding ships: fresh arrays per output --------------------------------------------
ArrayKind = Literal["numpy", "torch"]


class ArrayAllocator(TRITONSERVER_ResponseAllocator):
    """Each output lands in a fresh array that the caller keeps: numpy (CPU) or torch (CPU, or GPU on request),
    or in a numpy buffer from ``buffers`` (the caller's own pool).

    ``TRITONSERVER_InferenceResponse.output_array`` / ``output_tensor`` return that very array, viewed with the
    output's dtype and shape: no copy, and no memory the allocator reuses. ``kind="torch"`` with
    ``gpu=True`` allocates on ``cuda:<memory_type_id>`` when Triton prefers GPU memory (designed for the
    NGC image with CUDA; not exercised on a CPU-only machine); otherwise outputs are CPU memory and the
    actual memory type reported to Triton is CPU whatever it preferred.
    """

    def __init__(
        self, kind: ArrayKind = "numpy", *, gpu: bool = False, buffers: Callable[[int], np.ndarray] | None = None
    ) -> None:
        if kind not in ("numpy", "torch"):
            raise ValueError(f"ArrayAllocator kind must be 'numpy' or 'torch', got {kind!r}")
        if gpu and kind != "torch":
            raise ValueError("ArrayAllocator(gpu=True) needs kind='torch'")
        if buffers is not None and kind != "numpy":
            raise ValueError("ArrayAllocator(buffers=...) hands out numpy arrays: it needs kind='numpy'")
        self.kind: ArrayKind = kind
        self.gpu = gpu
        self.buffers = buffers
        """``buffers(byte_size)``: where numpy outputs go instead of a fresh ``np.empty`` (a contiguous uint8
        array of at least ``byte_size`` bytes that nobody else writes while the output lives, e.g. a pool)."""
        super().__init__(_alloc_array, None)
        self.set_query_function(_query_array)


def _alloc_array(
    allocator: TRITONSERVER_ResponseAllocator,
    _name: str,
    byte_size: int,
    memory_type: MemoryType,
    type_id: int,
    _u: Any,
) -> tuple[int, Any, MemoryType, int]:
    if byte_size == 0:
        return 0, None, TRITONSERVER_MemoryType.CPU, 0
    assert isinstance(allocator, ArrayAllocator)  # noqa: S101 - only ArrayAllocator registers this function
    if allocator.kind == "numpy":
        array = np.empty(byte_size, dtype=np.uint8) if allocator.buffers is None else allocator.buffers(byte_size)
        if array.dtype != np.uint8 or array.nbytes < byte_size or not array.flags.c_contiguous:
            raise ValueError(f"buffers({byte_size}) gave {array.dtype} {array.shape}: not a contiguous uint8 buffer")
        return int(array.ctypes.data), array, TRITONSERVER_MemoryType.CPU, 0
    import torch

    if allocator.gpu and memory_type is TRITONSERVER_MemoryType.GPU:
        tensor = torch.empty(byte_size, dtype=torch.uint8, device=f"cuda:{type_id}")
        return int(tensor.data_ptr()), tensor, TRITONSERVER_MemoryType.GPU, type_id
    tensor = torch.empty(byte_size, dtype=torch.uint8)
    return int(tensor.data_ptr()), tensor, TRITONSERVER_MemoryType.CPU, 0


def _query_array(
    allocator: TRITONSERVER_ResponseAllocator,
    _u: Any,
    _name: str | None,
    _size: int | None,
    kind: MemoryType,
    device: int,
) -> tuple[MemoryType, int]:
    if isinstance(allocator, ArrayAllocator) and allocator.gpu and kind is TRITONSERVER_MemoryType.GPU:
        return kind, device
    return TRITONSERVER_MemoryType.CPU, 0
