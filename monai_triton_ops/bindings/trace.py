"""``TRITONSERVER_InferenceTrace``: activity timestamps (and optionally tensors) of one inference.

``infer_async(request, trace)`` lends the trace to Triton until its release callback returns it. Activity
callbacks receive a *borrowed* view of the trace (valid during the callback, so ``trace.model_name`` works
there). Triton 2.51 departs from the header's "unconditionally takes ownership" when ``infer_async`` fails:
a validation error returns before the trace is attached (no release callback), an enqueue error releases it
at once. Either way the wrapper is Python's again when ``infer_async`` raises, and it is deleted once.

A trace and the children spawned from it (by Python or by Triton) share one record: its callbacks, user
object and handle live as long as any trace of the family does.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any

from . import declarations
from ._library import lib
from ._object import State, TritonObject, drop_handle, handle_object, new_handle
from .enums import TRITONSERVER_DataType, TRITONSERVER_InferenceTraceActivity, TRITONSERVER_InferenceTraceLevel
from .enums import TRITONSERVER_MemoryType as MemoryType
from .error import OwnershipError
from .flight import Flight

logger = logging.getLogger(__name__)

#: activity_fn(trace (borrowed), activity, timestamp_ns, user_object)
ActivityFn = Callable[["TRITONSERVER_InferenceTrace", TRITONSERVER_InferenceTraceActivity, int, Any], None]
#: tensor_activity_fn(trace, activity, name, datatype, bytes (copied), shape, memory type, memory type id, user_object)
TensorActivityFn = Callable[
    [
        "TRITONSERVER_InferenceTrace",
        TRITONSERVER_InferenceTraceActivity,
        str,
        TRITONSERVER_DataType,
        bytes,
        tuple[int, ...],
        MemoryType,
        int,
        Any,
    ],
    None,
]
#: release_fn(trace (Python's again), user_object)
TraceReleaseFn = Callable[["TRITONSERVER_InferenceTrace", Any], None]


class _Family:
    """What every trace of one family shares; held by its handle while any of them is alive."""

    def __init__(
        self,
        activity_fn: ActivityFn,
        tensor_activity_fn: TensorActivityFn | None,
        release_fn: TraceReleaseFn | None,
        user_object: Any,
    ) -> None:
        self.activity_fn = activity_fn
        self.tensor_activity_fn = tensor_activity_fn
        self.release_fn = release_fn
        self.user_object = user_object
        self.alive = 0
        self.lent: dict[int, TRITONSERVER_InferenceTrace] = {}
        self.flight: Flight | None = None
        self.errors: list[BaseException] = []
        self.handle = new_handle(self)

    def failed(self, exc: BaseException) -> None:
        if self.flight is not None and not self.flight.future.done():
            self.flight.note(exc)
        else:
            self.errors.append(exc)
            logger.error("a trace callback raised after its inference completed: %r", exc)


class TRITONSERVER_InferenceTrace(TritonObject):
    """``TRITONSERVER_InferenceTraceNew`` (or ``...TensorNew`` when ``tensor_activity_fn`` is given)."""

    _c_delete = "TRITONSERVER_InferenceTraceDelete"

    def __init__(
        self,
        level: TRITONSERVER_InferenceTraceLevel,
        parent_id: int,
        activity_fn: ActivityFn,
        release_fn: TraceReleaseFn | None,
        user_object: Any = None,
        *,
        tensor_activity_fn: TensorActivityFn | None = None,
    ) -> None:
        family = _Family(activity_fn, tensor_activity_fn, release_fn, user_object)
        out = ctypes.c_void_p()
        try:
            if tensor_activity_fn is None:
                lib().TRITONSERVER_InferenceTraceNew(
                    ctypes.byref(out), int(level), parent_id, _ACTIVITY, _RELEASE, family.handle
                )
            else:
                lib().TRITONSERVER_InferenceTraceTensorNew(
                    ctypes.byref(out), int(level), parent_id, _ACTIVITY, _TENSOR_ACTIVITY, _RELEASE, family.handle
                )
        except BaseException:
            drop_handle(family.handle)
            raise
        self._init(out.value or 0, family, State.OWNED)

    @classmethod
    def _of_family(cls, pointer: int, family: _Family, state: State) -> TRITONSERVER_InferenceTrace:
        trace = cls.__new__(cls)
        trace._init(pointer, family, state)
        return trace

    def _init(self, pointer: int, family: _Family, state: State) -> None:
        TritonObject.__init__(self, pointer, state=state)
        self._family = family
        if state is not State.BORROWED:
            family.alive += 1

    # -- getters ----------------------------------------------------------------------------------------
    @property
    def id(self) -> int:
        value = ctypes.c_uint64()
        lib().TRITONSERVER_InferenceTraceId(self._ptr(), ctypes.byref(value))
        return value.value

    @property
    def parent_id(self) -> int:
        value = ctypes.c_uint64()
        lib().TRITONSERVER_InferenceTraceParentId(self._ptr(), ctypes.byref(value))
        return value.value

    @property
    def model_name(self) -> str:
        value = ctypes.c_char_p()
        lib().TRITONSERVER_InferenceTraceModelName(self._ptr(), ctypes.byref(value))
        return (value.value or b"").decode()

    @property
    def model_version(self) -> int:
        value = ctypes.c_int64()
        lib().TRITONSERVER_InferenceTraceModelVersion(self._ptr(), ctypes.byref(value))
        return value.value

    @property
    def request_id(self) -> str:
        value = ctypes.c_char_p()
        lib().TRITONSERVER_InferenceTraceRequestId(self._ptr(), ctypes.byref(value))
        return (value.value or b"").decode()

    @property
    def context(self) -> str:
        value = ctypes.c_char_p()
        lib().TRITONSERVER_InferenceTraceContext(self._ptr(), ctypes.byref(value))
        return (value.value or b"").decode()

    @context.setter
    def context(self, value: str) -> None:
        lib().TRITONSERVER_InferenceTraceSetContext(self._ptr(), value.encode())

    def report_activity(self, timestamp_ns: int, activity_name: str) -> None:
        """``TRITONSERVER_InferenceTraceReportActivity``: a custom activity (the activity callback sees it)."""
        lib().TRITONSERVER_InferenceTraceReportActivity(self._ptr(), timestamp_ns, activity_name.encode())

    def spawn_child_trace(self) -> TRITONSERVER_InferenceTrace:
        """A child trace sharing this trace's callbacks; the caller owns it."""
        out = ctypes.c_void_p()
        lib().TRITONSERVER_InferenceTraceSpawnChildTrace(self._ptr(), ctypes.byref(out))
        return TRITONSERVER_InferenceTrace._of_family(out.value or 0, self._family, State.OWNED)

    # -- ownership ----------------------------------------------------------------------------------------
    def _lend(self, flight: Flight) -> int:
        pointer = self._ptr()
        if self._state is not State.OWNED:
            raise OwnershipError("a borrowed TRITONSERVER_InferenceTrace cannot be passed to infer_async")
        self._family.lent[pointer] = self
        self._family.flight = flight
        self._state = State.LENT
        self._lent_by = "TRITONSERVER_ServerInferAsync"
        return pointer

    def _infer_failed(self) -> None:
        """``infer_async`` raised: Triton either released the trace already or never took it."""
        if self._family.lent.pop(self._pointer, None) is not None:
            self._state = State.OWNED

    def _before_delete(self) -> None:
        family = self._family
        family.alive -= 1
        if family.alive <= 0 and not family.lent:
            drop_handle(family.handle)


# -- trampolines --------------------------------------------------------------------------------------
def _borrow(pointer: int | None, family: _Family) -> TRITONSERVER_InferenceTrace:
    return TRITONSERVER_InferenceTrace._of_family(pointer or 0, family, State.BORROWED)


def _on_activity(trace: int | None, activity: int, timestamp_ns: int, userp: int | None) -> None:
    family: _Family | None = handle_object(userp)
    if family is None:
        return
    view = _borrow(trace, family)
    try:
        family.activity_fn(view, TRITONSERVER_InferenceTraceActivity(activity), timestamp_ns, family.user_object)
    except BaseException as exc:
        family.failed(exc)
    finally:
        view._expire()


def _on_tensor_activity(
    trace: int | None,
    activity: int,
    name: bytes | None,
    datatype: int,
    base: int | None,
    byte_size: int,
    shape: Any,
    dim_count: int,
    memory_type: int,
    memory_type_id: int,
    userp: int | None,
) -> None:
    family: _Family | None = handle_object(userp)
    if family is None or family.tensor_activity_fn is None:
        return
    view = _borrow(trace, family)
    try:
        kind = MemoryType(memory_type)
        data = ctypes.string_at(base, byte_size) if base and byte_size and kind is not MemoryType.GPU else b""
        family.tensor_activity_fn(
            view,
            TRITONSERVER_InferenceTraceActivity(activity),
            (name or b"").decode(),
            TRITONSERVER_DataType(datatype),
            data,
            tuple(shape[i] for i in range(dim_count)),
            kind,
            memory_type_id,
            family.user_object,
        )
    except BaseException as exc:
        family.failed(exc)
    finally:
        view._expire()


def _on_release(trace: int | None, userp: int | None) -> None:
    family: _Family | None = handle_object(userp)
    if family is None or not trace:
        logger.error("release of an unknown trace (handle %s)", userp)
        return
    wrapper = family.lent.pop(trace, None)
    if wrapper is None:  # a child Triton spawned itself: now ours to delete
        wrapper = TRITONSERVER_InferenceTrace._of_family(trace, family, State.OWNED)
    else:
        wrapper._state = State.OWNED
    try:
        if family.release_fn is not None:
            family.release_fn(wrapper, family.user_object)
    except BaseException as exc:
        family.failed(exc)


_ACTIVITY = declarations.TRACE_ACTIVITY_FN(_on_activity)
_TENSOR_ACTIVITY = declarations.TRACE_TENSOR_ACTIVITY_FN(_on_tensor_activity)
_RELEASE = declarations.TRACE_RELEASE_FN(_on_release)
