"""``TRITONSERVER_Server``: the in-process server, its models, and ``infer_async``.

The binding holds no policy: no thread, no timer, no exit hook, no ``__del__`` that deletes the server.
``stop()`` and ``delete()`` are ``TRITONSERVER_ServerStop`` / ``TRITONSERVER_ServerDelete``; the waiting,
deadlines and process exit belong to whoever owns the server (the in-process backend's
``backends/inprocess/server.py``). What it adds is the ownership rules, enforced:

- A response or request left alive by Python pins its model, and ``TRITONSERVER_ServerStop`` would wait the
  whole exit timeout for it. ``stop()`` and ``delete()`` first delete every Python-owned request and response of
  this server (using one afterwards raises "deleted (its server was stopped)"), and refuse new requests.
- A request lent to Triton belongs to the server: ``delete()`` refuses (``OwnershipError``, no C call) while
  one is in flight. Triton 2.51's own check is not enough: when its exit timeout expires, ``ServerDelete``
  returns an error without deleting, and deleting again once the requests land frees the server under a
  model that a Triton thread destroys later (the thread then crashes in ``RateLimiter::GetPayload``).
- For the same reason a server whose stop failed (Triton's exit timeout expired) is never deleted:
  ``delete()`` refuses it. Its owner leaves it to the process's exit.

A server is deleted only by ``delete()``: dropping the wrapper deletes nothing (deleting blocks for as long
as the models take to unload, which no garbage collection may do).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ._library import lib
from ._object import State, TritonObject
from .enums import TRITONSERVER_ModelBatchFlag, TRITONSERVER_ModelTxnPropertyFlag
from .error import OwnershipError, TritonError, UnavailableError
from .message import TRITONSERVER_Message
from .metrics import TRITONSERVER_Metrics
from .options import TRITONSERVER_ServerOptions
from .parameter import TRITONSERVER_Parameter, parameter_array
from .request import TRITONSERVER_InferenceRequest
from .trace import TRITONSERVER_InferenceTrace

logger = logging.getLogger(__name__)


class TRITONSERVER_Server(TritonObject):
    """``TRITONSERVER_ServerNew(options)``: starts the server and loads its startup models (GIL released)."""

    _c_delete = None  # deleted only through delete(): ServerDelete blocks and can fail without deleting

    def __init__(self, options: TRITONSERVER_ServerOptions) -> None:
        out = ctypes.c_void_p()
        lib().TRITONSERVER_ServerNew(ctypes.byref(out), options._ptr())
        super().__init__(out.value or 0)
        self._children: weakref.WeakSet[Any] = weakref.WeakSet()
        self._in_flight: set[int] = set()
        self._flight_lock = threading.Lock()
        self._stopping = False
        self._stop_failed = ""

    # -- lifecycle ------------------------------------------------------------------------------------
    def stop(self) -> None:
        """``TRITONSERVER_ServerStop``: refuse new requests, let Triton wait (GIL released) for those in flight
        and for the models to unload, up to the exit timeout.

        Raises:
            InternalError: Triton's exit timeout expired; the server can no longer be deleted.
        """
        pointer = self._ptr()
        self._begin_stop()
        self._call_stop(lib().TRITONSERVER_ServerStop, pointer)

    def delete(self) -> None:
        """``TRITONSERVER_ServerDelete``: stop as ``stop()`` does, then free the server.

        Raises:
            OwnershipError: requests are still in flight (they belong to this server until released), a
                stop failed before, or the server was deleted already. Nothing was asked of Triton.
            InternalError: Triton's exit timeout expired (models did not unload); the server is left
                undeleted, as Triton leaves it, and can no longer be deleted.
        """
        pointer = self._ptr()
        if self._stop_failed:
            raise OwnershipError(
                f"TRITONSERVER_Server cannot be deleted: its stop failed ({self._stop_failed}); Triton 2.51 would "
                "free it under models that are still unloading, so it is left to the process's exit"
            )
        with self._flight_lock:  # infer_async checks _stopping under the same lock
            in_flight = len(self._in_flight)
            if in_flight:
                raise OwnershipError(
                    f"TRITONSERVER_Server cannot be deleted: {in_flight} request(s) still in flight belong to it "
                    "until Triton releases them"
                )
            self._stopping = True
        self._begin_stop()
        self._call_stop(lib().TRITONSERVER_ServerDelete, pointer)
        self._state = State.DELETED
        self._deleted_because = "delete() was called"
        self._pointer = 0

    def _begin_stop(self) -> None:
        with self._flight_lock:
            self._stopping = True
        self._invalidate_children()

    def _call_stop(self, function: Any, pointer: int) -> None:
        try:
            function(pointer)
        except TritonError as exc:
            self._stop_failed = str(exc)
            raise

    @property
    def in_flight(self) -> int:
        """Requests lent to Triton by ``infer_async`` and not yet released with their FINAL response."""
        with self._flight_lock:
            return len(self._in_flight)

    @property
    def deleted(self) -> bool:
        """Whether the C server is gone."""
        return self._state is State.DELETED

    @property
    def stop_failed(self) -> bool:
        """Whether a ``stop()`` or ``delete()`` failed (Triton's exit timeout expired): it cannot be deleted now."""
        return bool(self._stop_failed)

    def set_exit_timeout(self, timeout_s: int) -> None:
        """``TRITONSERVER_ServerSetExitTimeout``: how long stop waits for requests in flight and models to unload."""
        lib().TRITONSERVER_ServerSetExitTimeout(self._ptr(), int(timeout_s))

    # -- repositories and models ------------------------------------------------------------------------
    def register_model_repository(
        self, repository_path: str | os.PathLike[str], name_mapping: Sequence[TRITONSERVER_Parameter] = ()
    ) -> None:
        """Add a repository; each ``name_mapping`` parameter maps a model folder (its name) to a model name (value)."""
        mapping = parameter_array(list(name_mapping))
        lib().TRITONSERVER_ServerRegisterModelRepository(
            self._ptr(), os.fsencode(repository_path), mapping, len(name_mapping)
        )

    def unregister_model_repository(self, repository_path: str | os.PathLike[str]) -> None:
        lib().TRITONSERVER_ServerUnregisterModelRepository(self._ptr(), os.fsencode(repository_path))

    def poll_model_repository(self) -> None:
        lib().TRITONSERVER_ServerPollModelRepository(self._ptr())

    def load_model(self, model_name: str) -> None:
        """Load (or reload) a model and wait until it is ready or failed (GIL released meanwhile)."""
        lib().TRITONSERVER_ServerLoadModel(self._ptr(), model_name.encode())

    def load_model_with_parameters(self, model_name: str, parameters: Sequence[TRITONSERVER_Parameter]) -> None:
        """Load with parameters such as ``config`` (a JSON model config) or ``file:<path>`` (bytes)."""
        array = parameter_array(list(parameters))
        lib().TRITONSERVER_ServerLoadModelWithParameters(self._ptr(), model_name.encode(), array, len(parameters))

    def unload_model(self, model_name: str) -> None:
        """Start unloading; requests in flight keep the model until they complete."""
        lib().TRITONSERVER_ServerUnloadModel(self._ptr(), model_name.encode())

    def unload_model_and_dependents(self, model_name: str) -> None:
        lib().TRITONSERVER_ServerUnloadModelAndDependents(self._ptr(), model_name.encode())

    # -- state queries ------------------------------------------------------------------------------------
    def is_live(self) -> bool:
        value = ctypes.c_bool()
        lib().TRITONSERVER_ServerIsLive(self._ptr(), ctypes.byref(value))
        return bool(value.value)

    def is_ready(self) -> bool:
        value = ctypes.c_bool()
        lib().TRITONSERVER_ServerIsReady(self._ptr(), ctypes.byref(value))
        return bool(value.value)

    def model_is_ready(self, model_name: str, model_version: int = -1) -> bool:
        value = ctypes.c_bool()
        lib().TRITONSERVER_ServerModelIsReady(self._ptr(), model_name.encode(), model_version, ctypes.byref(value))
        return bool(value.value)

    def model_batch_properties(
        self, model_name: str, model_version: int = -1
    ) -> tuple[TRITONSERVER_ModelBatchFlag, int]:
        """``(flags, voidp)``; ``voidp`` is an opaque address (0 for the flags Triton defines today)."""
        flags, voidp = ctypes.c_uint32(), ctypes.c_void_p()
        lib().TRITONSERVER_ServerModelBatchProperties(
            self._ptr(), model_name.encode(), model_version, ctypes.byref(flags), ctypes.byref(voidp)
        )
        return TRITONSERVER_ModelBatchFlag(flags.value), voidp.value or 0

    def model_transaction_properties(
        self, model_name: str, model_version: int = -1
    ) -> tuple[TRITONSERVER_ModelTxnPropertyFlag, int]:
        flags, voidp = ctypes.c_uint32(), ctypes.c_void_p()
        lib().TRITONSERVER_ServerModelTransactionProperties(
            self._ptr(), model_name.encode(), model_version, ctypes.byref(flags), ctypes.byref(voidp)
        )
        return TRITONSERVER_ModelTxnPropertyFlag(flags.value), voidp.value or 0

    def metadata(self) -> TRITONSERVER_Message:
        return self._message("TRITONSERVER_ServerMetadata")

    def model_metadata(self, model_name: str, model_version: int = -1) -> TRITONSERVER_Message:
        return self._message("TRITONSERVER_ServerModelMetadata", model_name.encode(), model_version)

    def model_statistics(self, model_name: str = "", model_version: int = -1) -> TRITONSERVER_Message:
        """Statistics of one model, or of every model when ``model_name`` is empty."""
        return self._message("TRITONSERVER_ServerModelStatistics", model_name.encode(), model_version)

    def model_config(self, model_name: str, model_version: int = -1, config_version: int = 1) -> TRITONSERVER_Message:
        return self._message("TRITONSERVER_ServerModelConfig", model_name.encode(), model_version, config_version)

    def model_index(self, flags: int = 0) -> TRITONSERVER_Message:
        """The repository index; ``TRITONSERVER_ModelIndexFlag.READY`` lists only ready models."""
        return self._message("TRITONSERVER_ServerModelIndex", int(flags))

    def metrics(self) -> TRITONSERVER_Metrics:
        out = ctypes.c_void_p()
        lib().TRITONSERVER_ServerMetrics(self._ptr(), ctypes.byref(out))
        return TRITONSERVER_Metrics(out.value or 0)

    def _message(self, function: str, *args: object) -> TRITONSERVER_Message:
        out = ctypes.c_void_p()
        getattr(lib(), function)(self._ptr(), *args, ctypes.byref(out))
        return TRITONSERVER_Message(out.value or 0)

    # -- inference --------------------------------------------------------------------------------------
    def infer_async(
        self, request: TRITONSERVER_InferenceRequest, trace: TRITONSERVER_InferenceTrace | None = None
    ) -> concurrent.futures.Future[None]:
        """``TRITONSERVER_ServerInferAsync``: lend ``request`` (and ``trace``) to Triton.

        Returns a future that completes once the request is released and its FINAL response delivered; it
        raises the first exception one of the request's callbacks raised. If this call raises, the caller
        still owns the request and the trace.
        """
        server = self._ptr()
        self._refuse_if_stopping()
        if request.server is not self:
            raise OwnershipError("TRITONSERVER_InferenceRequest was created for another TRITONSERVER_Server")
        flight = request._lend()
        try:
            trace_pointer = trace._lend(flight) if trace is not None else None
        except BaseException:
            request._unlend()
            raise
        with self._flight_lock:
            stopping = self._stopping
            if not stopping:
                self._in_flight.add(request._handle)
        if stopping:
            request._unlend()
            if trace is not None:
                trace._infer_failed()
            self._refuse_if_stopping()
        try:
            lib().TRITONSERVER_ServerInferAsync(server, request._pointer, trace_pointer)
        except BaseException:
            with self._flight_lock:
                self._in_flight.discard(request._handle)
            request._unlend()
            if trace is not None:
                trace._infer_failed()
            raise
        return flight.future

    # -- bookkeeping used by requests and responses ---------------------------------------------------------
    def _refuse_if_stopping(self) -> None:
        self._ptr()
        if self._stopping:
            raise UnavailableError("TRITONSERVER_Server is stopping: it takes no new requests")

    def _adopt(self, child: Any) -> None:
        self._children.add(child)

    def _landed(self, handle: int) -> None:
        with self._flight_lock:
            self._in_flight.discard(handle)

    def _invalidate_children(self) -> None:
        """Delete Python-owned requests and responses: alive, they would keep their models loaded."""
        for child in list(self._children):
            if child.owner_state is State.OWNED:
                child._delete_now("its server was stopped")
