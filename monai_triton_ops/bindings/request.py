"""``TRITONSERVER_InferenceRequest``: inputs, outputs, callbacks; lent to Triton by ``infer_async``.

Ownership, as the C API says and this wrapper enforces:

- ``TRITONSERVER_Server.infer_async(request)`` lends the request to Triton: from then on, every reference to
  the wrapper raises :class:`OwnershipError` on use, ``del`` of all of them frees nothing (the handle registry
  holds the wrapper), and Triton gives it back in the release callback. If ``infer_async`` fails, the caller
  keeps it (no release callback will come).
- Input buffers are held on the request from ``append_input_data`` until the input (or its data) is removed or
  the request is deleted: C reads them until the request is released, and a reused request reads them again.
- Callback objects are held for the whole flight: until the request is released *and* the FINAL response was
  delivered (they may come in either order, on Triton's threads, before ``infer_async`` returns).

``infer_async`` returns a future that completes at the end of that flight, with the first exception any
of the request's Python callbacks raised (an exception is never swallowed by ctypes); its traceback is kept
as a note, not as frames, so that it holds no response or buffer alive (``flight.detached``).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import declarations
from ._library import lib
from ._object import State, TritonObject, drop_handle, handle_object, reserve_handle, set_handle
from .buffer_attributes import TRITONSERVER_BufferAttributes
from .buffers import buffer_address
from .enums import (
    TRITONSERVER_DataType,
    TRITONSERVER_MemoryType,
    TRITONSERVER_RequestReleaseFlag,
    TRITONSERVER_ResponseCompleteFlag,
)
from .error import InvalidArgumentError, OwnershipError
from .flight import Flight, FlightServer

if TYPE_CHECKING:
    from .allocator import TRITONSERVER_ResponseAllocator
    from .response import TRITONSERVER_InferenceResponse

logger = logging.getLogger(__name__)

#: release_fn(request, flags, user_object): the request is Python's again when flags has ALL
ReleaseFn = Callable[["TRITONSERVER_InferenceRequest", TRITONSERVER_RequestReleaseFlag, Any], None]
#: response_fn(response or None, flags, user_object): the callee owns the response
ResponseFn = Callable[["TRITONSERVER_InferenceResponse | None", TRITONSERVER_ResponseCompleteFlag, Any], None]


class TRITONSERVER_InferenceRequest(TritonObject):
    """``TRITONSERVER_InferenceRequestNew(server, model_name, model_version)``; ``-1``: the model's policy."""

    _c_delete = "TRITONSERVER_InferenceRequestDelete"
    _lent_by = "TRITONSERVER_ServerInferAsync"

    def __init__(self, server: FlightServer, model_name: str, model_version: int = -1) -> None:
        server._refuse_if_stopping()
        out = ctypes.c_void_p()
        lib().TRITONSERVER_InferenceRequestNew(ctypes.byref(out), server._ptr(), model_name.encode(), model_version)
        super().__init__(out.value or 0)
        self.server = server
        self.model_name = model_name
        self._handle = reserve_handle()
        self._inputs: dict[str, list[object]] = {}
        self._allocator: TRITONSERVER_ResponseAllocator | None = None
        self._allocator_user_object: Any = None
        self._response_fn: ResponseFn | None = None
        self._response_user_object: Any = None
        self._release_fn: ReleaseFn | None = None
        self._release_user_object: Any = None
        self._flight: Flight | None = None
        lib().TRITONSERVER_InferenceRequestSetReleaseCallback(self._pointer, _RELEASE, self._handle)
        server._adopt(self)

    # -- trivial getters and setters ------------------------------------------------------------------
    @property
    def id(self) -> str:
        return _get_str(lib().TRITONSERVER_InferenceRequestId, self._ptr())

    @id.setter
    def id(self, value: str) -> None:
        lib().TRITONSERVER_InferenceRequestSetId(self._ptr(), value.encode())

    @property
    def flags(self) -> int:
        return _get(lib().TRITONSERVER_InferenceRequestFlags, self._ptr(), ctypes.c_uint32)

    @flags.setter
    def flags(self, value: int) -> None:
        lib().TRITONSERVER_InferenceRequestSetFlags(self._ptr(), int(value))

    @property
    def correlation_id(self) -> int:
        return _get(lib().TRITONSERVER_InferenceRequestCorrelationId, self._ptr(), ctypes.c_uint64)

    @correlation_id.setter
    def correlation_id(self, value: int) -> None:
        lib().TRITONSERVER_InferenceRequestSetCorrelationId(self._ptr(), int(value))

    @property
    def correlation_id_string(self) -> str:
        return _get_str(lib().TRITONSERVER_InferenceRequestCorrelationIdString, self._ptr())

    @correlation_id_string.setter
    def correlation_id_string(self, value: str) -> None:
        lib().TRITONSERVER_InferenceRequestSetCorrelationIdString(self._ptr(), value.encode())

    @property
    def priority(self) -> int:
        return _get(lib().TRITONSERVER_InferenceRequestPriority, self._ptr(), ctypes.c_uint32)

    @priority.setter
    def priority(self, value: int) -> None:
        lib().TRITONSERVER_InferenceRequestSetPriority(self._ptr(), int(value))

    @property
    def priority_uint64(self) -> int:
        return _get(lib().TRITONSERVER_InferenceRequestPriorityUInt64, self._ptr(), ctypes.c_uint64)

    @priority_uint64.setter
    def priority_uint64(self, value: int) -> None:
        lib().TRITONSERVER_InferenceRequestSetPriorityUInt64(self._ptr(), int(value))

    @property
    def timeout_microseconds(self) -> int:
        return _get(lib().TRITONSERVER_InferenceRequestTimeoutMicroseconds, self._ptr(), ctypes.c_uint64)

    @timeout_microseconds.setter
    def timeout_microseconds(self, value: int) -> None:
        lib().TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(self._ptr(), int(value))

    # -- cancellation: meaningful only while Triton owns the request, serialized with its release -----------
    def cancel(self) -> None:
        """``TRITONSERVER_InferenceRequestCancel``, best effort; a no-op once the request was released."""
        flight = self._flight
        if flight is None:
            self._ptr()
            return  # not in flight: Triton resets the flag at infer_async anyway
        with flight.lock:
            if not flight.released:
                lib().TRITONSERVER_InferenceRequestCancel(self._pointer)

    @property
    def is_cancelled(self) -> bool:
        flight = self._flight
        if flight is None:
            return bool(_get(lib().TRITONSERVER_InferenceRequestIsCancelled, self._ptr(), ctypes.c_bool))
        with flight.lock:
            pointer = self._pointer if not flight.released else self._ptr()
            return bool(_get(lib().TRITONSERVER_InferenceRequestIsCancelled, pointer, ctypes.c_bool))

    # -- inputs ---------------------------------------------------------------------------------------
    def add_input(self, name: str, datatype: TRITONSERVER_DataType, shape: Sequence[int]) -> None:
        dims = (ctypes.c_int64 * len(shape))(*shape)
        lib().TRITONSERVER_InferenceRequestAddInput(self._ptr(), name.encode(), int(datatype), dims, len(shape))

    def add_raw_input(self, name: str) -> None:
        lib().TRITONSERVER_InferenceRequestAddRawInput(self._ptr(), name.encode())

    def remove_input(self, name: str) -> None:
        lib().TRITONSERVER_InferenceRequestRemoveInput(self._ptr(), name.encode())
        self._inputs.pop(name, None)

    def remove_all_inputs(self) -> None:
        lib().TRITONSERVER_InferenceRequestRemoveAllInputs(self._ptr())
        self._inputs.clear()

    def append_input_data(
        self,
        name: str,
        data: Any,
        memory_type: TRITONSERVER_MemoryType = TRITONSERVER_MemoryType.CPU,
        memory_type_id: int = 0,
    ) -> None:
        """Append ``data`` (a C-contiguous numpy array, torch tensor or bytes-like object) to input ``name``.

        The request keeps ``data`` alive until the input is removed or the request is deleted.
        """
        address, size = buffer_address(data, name)
        lib().TRITONSERVER_InferenceRequestAppendInputData(
            self._ptr(), name.encode(), address, size, int(memory_type), memory_type_id
        )
        self._inputs.setdefault(name, []).append(data)

    def append_input_data_with_host_policy(
        self,
        name: str,
        data: Any,
        memory_type: TRITONSERVER_MemoryType,
        memory_type_id: int,
        host_policy_name: str,
    ) -> None:
        address, size = buffer_address(data, name)
        lib().TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy(
            self._ptr(), name.encode(), address, size, int(memory_type), memory_type_id, host_policy_name.encode()
        )
        self._inputs.setdefault(name, []).append(data)

    def append_input_data_with_buffer_attributes(
        self, name: str, data: Any, buffer_attributes: TRITONSERVER_BufferAttributes
    ) -> None:
        address, _ = buffer_address(data, name)
        lib().TRITONSERVER_InferenceRequestAppendInputDataWithBufferAttributes(
            self._ptr(), name.encode(), address, buffer_attributes._ptr()
        )
        self._inputs.setdefault(name, []).extend((data, buffer_attributes))

    def remove_all_input_data(self, name: str) -> None:
        lib().TRITONSERVER_InferenceRequestRemoveAllInputData(self._ptr(), name.encode())
        self._inputs.pop(name, None)

    # -- outputs, parameters ----------------------------------------------------------------------------
    def add_requested_output(self, name: str) -> None:
        lib().TRITONSERVER_InferenceRequestAddRequestedOutput(self._ptr(), name.encode())

    def remove_requested_output(self, name: str) -> None:
        lib().TRITONSERVER_InferenceRequestRemoveRequestedOutput(self._ptr(), name.encode())

    def remove_all_requested_outputs(self) -> None:
        lib().TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs(self._ptr())

    def set_string_parameter(self, key: str, value: str) -> None:
        lib().TRITONSERVER_InferenceRequestSetStringParameter(self._ptr(), key.encode(), value.encode())

    def set_int_parameter(self, key: str, value: int) -> None:
        lib().TRITONSERVER_InferenceRequestSetIntParameter(self._ptr(), key.encode(), int(value))

    def set_bool_parameter(self, key: str, value: bool) -> None:
        lib().TRITONSERVER_InferenceRequestSetBoolParameter(self._ptr(), key.encode(), bool(value))

    def set_double_parameter(self, key: str, value: float) -> None:
        lib().TRITONSERVER_InferenceRequestSetDoubleParameter(self._ptr(), key.encode(), float(value))

    # -- callbacks ------------------------------------------------------------------------------------
    def set_release_callback(self, release_fn: ReleaseFn | None, user_object: Any = None) -> None:
        """Called when Triton releases the request (the binding's own trampoline is always registered)."""
        lib().TRITONSERVER_InferenceRequestSetReleaseCallback(self._ptr(), _RELEASE, self._handle)
        self._release_fn, self._release_user_object = release_fn, user_object

    def set_response_callback(
        self,
        allocator: TRITONSERVER_ResponseAllocator,
        allocator_user_object: Any,
        response_fn: ResponseFn,
        response_user_object: Any = None,
    ) -> None:
        """``TRITONSERVER_InferenceRequestSetResponseCallback``; the request holds both objects for each flight."""
        allocator._use_for(self)
        lib().TRITONSERVER_InferenceRequestSetResponseCallback(
            self._ptr(), allocator._ptr(), self._handle, _RESPONSE, self._handle
        )
        self._allocator, self._allocator_user_object = allocator, allocator_user_object
        self._response_fn, self._response_user_object = response_fn, response_user_object

    # -- the flight (used by TRITONSERVER_Server.infer_async and the trampolines) --------------------------
    def _lend(self) -> Flight:
        pointer = self._ptr()
        if self._state is not State.OWNED:
            raise OwnershipError("a TRITONSERVER_InferenceRequest borrowed by a callback cannot be submitted")
        if self._flight is not None:
            raise OwnershipError(
                "TRITONSERVER_InferenceRequest: its previous inference has not delivered its FINAL response yet"
            )
        if self._response_fn is None:
            raise InvalidArgumentError("TRITONSERVER_InferenceRequest has no response callback: set_response_callback")
        del pointer
        flight = Flight(
            allocator=self._allocator,
            allocator_user_object=self._allocator_user_object,
            response_fn=self._response_fn,
            response_user_object=self._response_user_object,
            release_fn=self._release_fn,
            release_user_object=self._release_user_object,
        )
        self._flight = flight
        set_handle(self._handle, self)  # before the call: callbacks may come before infer_async returns
        self._state = State.LENT
        return flight

    def _unlend(self) -> None:
        """``infer_async`` failed: the caller keeps the request, no callback will come."""
        self._state = State.OWNED
        self._flight = None
        drop_handle(self._handle)

    def _allocation(self) -> tuple[TRITONSERVER_ResponseAllocator, Any]:
        flight = self._flight
        if flight is None or flight.allocator is None:
            raise OwnershipError("allocator called for a request that is not in flight")
        return flight.allocator, flight.allocator_user_object

    def _callback_failed(self, exc: BaseException) -> None:
        if self._flight is not None:
            self._flight.note(exc, allocation=True)

    def _finish(self, flight: Flight, *, released: bool = False, final: bool = False) -> Callable[[], None] | None:
        """Record release or FINAL; once both came, end the flight and return what completes its future.

        The trampoline drops its own references first and then calls it: by then an unreferenced request
        is deleted, so whoever waits on the future sees Triton done with it.
        """
        with flight.lock:
            flight.released = flight.released or released
            flight.final = flight.final or final
            done = flight.released and flight.final
            if done and self._flight is flight:
                self._flight = None
        if not done:
            return None
        self.server._landed(self._handle)
        drop_handle(self._handle)
        return flight.complete

    def _before_delete(self) -> None:
        self._inputs.clear()


def _get(function: Any, pointer: int, c_type: Any) -> int:
    value = c_type()
    function(pointer, ctypes.byref(value))
    return int(value.value)


def _get_str(function: Any, pointer: int) -> str:
    value = ctypes.c_char_p()
    function(pointer, ctypes.byref(value))
    return (value.value or b"").decode()


# -- trampolines --------------------------------------------------------------------------------------
def _on_release(_request: int | None, flags: int, userp: int | None) -> None:
    request: TRITONSERVER_InferenceRequest | None = handle_object(userp)
    flight = request._flight if request is not None else None
    if request is None or flight is None:
        logger.error("release callback for a request that is not in flight (handle %s)", userp)
        return
    release_flags = TRITONSERVER_RequestReleaseFlag(flags)
    try:
        if release_flags & TRITONSERVER_RequestReleaseFlag.ALL:
            with flight.lock:
                request._state = State.OWNED
        if flight.release_fn is not None:
            flight.release_fn(request, release_flags, flight.release_user_object)
    except BaseException as exc:  # carried to the flight's future
        flight.note(exc)
    if release_flags & TRITONSERVER_RequestReleaseFlag.ALL:
        complete = request._finish(flight, released=True)
        del request  # an unreferenced request is deleted before the future completes
        if complete is not None:
            complete()


def _on_response(response: int | None, flags: int, userp: int | None) -> None:
    from .response import TRITONSERVER_InferenceResponse

    request: TRITONSERVER_InferenceRequest | None = handle_object(userp)
    flight = request._flight if request is not None else None
    if request is None or flight is None:
        logger.error("response for a request that is not in flight (handle %s)", userp)
        if response:
            lib().TRITONSERVER_InferenceResponseDelete(response)
        return
    complete = TRITONSERVER_ResponseCompleteFlag(flags)
    wrapped: TRITONSERVER_InferenceResponse | None = None
    raised = False
    try:
        wrapped = TRITONSERVER_InferenceResponse(response, request.server, flight) if response else None
        if flight.response_fn is not None:
            flight.response_fn(wrapped, complete, flight.response_user_object)
    except BaseException as exc:  # carried to the flight's future
        flight.note(exc)
        raised = True
    if wrapped is not None:
        wrapped._after_callback(raised=raised)  # deletes it if the callee may not keep it
    wrapped = None  # the callee owns the response now: drop ours
    if complete & TRITONSERVER_ResponseCompleteFlag.FINAL:
        done = request._finish(flight, final=True)
        del request
        if done is not None:
            done()


_RELEASE = declarations.REQUEST_RELEASE_FN(_on_release)
_RESPONSE = declarations.RESPONSE_COMPLETE_FN(_on_response)
