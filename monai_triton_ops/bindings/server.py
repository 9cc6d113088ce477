"""``TRITONSERVER_Server``: the in-process server, its models, and ``infer_async``.

Stopping and deleting follow the C API, with the pitfalls closed:

- A response or request left alive by Python pins its model, and ``TRITONSERVER_ServerStop`` then waits the
  whole exit timeout. ``stop()`` and ``delete()`` first delete every Python-owned request and response of this
  server (using one afterwards raises "deleted (its server was stopped)").
- ``stop()`` and ``delete()`` refuse new requests, then wait (GIL released, no lock callbacks need) for the
  requests in flight to land, up to the exit timeout, and only then call Triton. Triton's own wait is not
  enough: when its exit timeout expires, ``TRITONSERVER_ServerDelete`` returns an error without deleting, and
  deleting again once the request lands frees the server under a model that a Triton thread destroys later
  (2.51 crashes in ``RateLimiter::GetPayload``, seen here). So when requests outlive the exit timeout,
  ``delete()`` raises without calling Triton, and the binding deletes the server after the last one has
  landed (on a short-lived thread: deleting from a Triton callback thread would join that thread).
- At interpreter exit, servers still alive are deleted before Python finalizes (``atexit``), so no Triton
  thread calls back into a finalizing interpreter.
"""

from __future__ import annotations

import atexit
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
from .error import InternalError, OwnershipError, TritonError, UnavailableError
from .message import TRITONSERVER_Message
from .metrics import TRITONSERVER_Metrics
from .options import TRITONSERVER_ServerOptions
from .parameter import TRITONSERVER_Parameter, parameter_array
from .request import TRITONSERVER_InferenceRequest
from .trace import TRITONSERVER_InferenceTrace

logger = logging.getLogger(__name__)

#: Exit timeout for a postponed deletion, when only model unloading is left to wait for.
_UNLOAD_TIMEOUT_S = 60
_live_servers: weakref.WeakSet[TRITONSERVER_Server] = weakref.WeakSet()
_atexit_lock = threading.Lock()
_atexit_registered = False


class TRITONSERVER_Server(TritonObject):
    """``TRITONSERVER_ServerNew(options)``: starts the server and loads its startup models (GIL released)."""

    _c_delete = None  # deleted through delete(): ServerDelete can fail without deleting

    def __init__(self, options: TRITONSERVER_ServerOptions) -> None:
        out = ctypes.c_void_p()
        lib().TRITONSERVER_ServerNew(ctypes.byref(out), options._ptr())
        super().__init__(out.value or 0)
        self._exit_timeout_s = options.exit_timeout_s
        self._children: weakref.WeakSet[Any] = weakref.WeakSet()
        self._in_flight: set[int] = set()
        self._flight_lock = threading.Lock()
        self._landed_all = threading.Condition(self._flight_lock)
        self._stopping = False
        self._delete_lock = threading.Lock()
        self._delete_pending = False
        self._deleter: threading.Thread | None = None
        _live_servers.add(self)
        _register_atexit()

    # -- lifecycle ------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Refuse new requests, let those in flight land (up to the exit timeout), ``TRITONSERVER_ServerStop``.

        Raises:
            InternalError: requests were still in flight when the exit timeout expired; Triton was not asked
                to stop (``delete()`` later deletes the server once they land).
        """
        self._ptr()
        self._begin_stop()
        lib().TRITONSERVER_ServerStop(self._ptr())

    def delete(self) -> None:
        """Stop as ``stop()`` does, then ``TRITONSERVER_ServerDelete``.

        Raises:
            InternalError: requests were still in flight when the exit timeout expired; the server is deleted
                as soon as they have landed (``wait_deleted`` waits for that).
            TritonError: Triton failed to stop (its models did not unload within the exit timeout); the
                server is left undeleted, as Triton leaves it.
            OwnershipError: deleted already, or a postponed deletion still waits for requests in flight.
        """
        with self._delete_lock:
            pointer = self._ptr()
            if self._delete_pending:
                if self._in_flight:
                    raise OwnershipError(
                        f"TRITONSERVER_Server: {len(self._in_flight)} request(s) still in flight; "
                        "it is deleted as soon as they have landed"
                    )
                self._finish_delete()
                return
            try:
                self._begin_stop()
            except InternalError:
                with self._flight_lock:
                    self._delete_pending = True
                    now = not self._in_flight
                if now:
                    self._finish_delete()
                raise
            lib().TRITONSERVER_ServerDelete(pointer)
            self._mark_deleted("delete() was called")

    def _begin_stop(self) -> None:
        self._stopping = True
        self._invalidate_children()
        with self._landed_all:
            landed = self._landed_all.wait_for(lambda: not self._in_flight, timeout=self._exit_timeout_s)
            in_flight = len(self._in_flight)
        if not landed:
            raise InternalError(
                f"Exit timeout expired: {in_flight} request(s) still in flight after {self._exit_timeout_s} s; "
                "the server is deleted once they have landed"
            )

    @property
    def deleted(self) -> bool:
        """Whether the C server is gone (after ``delete()``, possibly finished later)."""
        return self._state is State.DELETED

    def wait_deleted(self, timeout_s: float | None = None) -> bool:
        """Wait until a deletion that ``delete()`` had to postpone is finished; returns whether it is."""
        deleter = self._deleter
        if deleter is not None:
            deleter.join(timeout_s)
        return self.deleted

    def set_exit_timeout(self, timeout_s: int) -> None:
        """How long stop waits for requests in flight and for models to unload."""
        lib().TRITONSERVER_ServerSetExitTimeout(self._ptr(), int(timeout_s))
        self._exit_timeout_s = int(timeout_s)

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
            self._in_flight.add(request._handle)
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

    def _landed(self, request: TRITONSERVER_InferenceRequest) -> None:
        with self._flight_lock:
            self._in_flight.discard(request._handle)
            if not self._in_flight:
                self._landed_all.notify_all()
            finish = self._delete_pending and not self._in_flight and self._deleter is None
        if finish:  # never delete on a Triton callback thread: ServerDelete joins Triton's threads
            self._deleter = threading.Thread(target=self._finish_delete_later, name="triton-server-delete", daemon=True)
            self._deleter.start()

    def _finish_delete_later(self) -> None:
        with self._delete_lock:
            if self._state is State.OWNED:
                self._finish_delete()

    def _finish_delete(self) -> None:
        """The postponed deletion: no request is in flight any more, only model unloading is left to wait for;
        a short exit timeout (the one that expired) would leave the server half-stopped, so wait longer."""
        try:
            lib().TRITONSERVER_ServerSetExitTimeout(self._pointer, max(self._exit_timeout_s, _UNLOAD_TIMEOUT_S))
            lib().TRITONSERVER_ServerDelete(self._pointer)
        except TritonError:
            logger.exception("TRITONSERVER_ServerDelete failed; the server is left undeleted")
            return
        self._mark_deleted("delete() was called")

    def _mark_deleted(self, because: str) -> None:
        self._state = State.DELETED
        self._deleted_because = because
        self._pointer = 0
        _live_servers.discard(self)

    def _invalidate_children(self) -> None:
        """Delete Python-owned requests and responses: alive, they would keep their models loaded."""
        for child in list(self._children):
            if child.owner_state is State.OWNED:
                child._delete_now("its server was stopped")

    def __del__(self) -> None:
        if getattr(self, "_state", None) is State.OWNED:
            try:
                self.delete()
            except Exception:
                logger.exception("deleting TRITONSERVER_Server failed")


def _register_atexit() -> None:
    global _atexit_registered
    with _atexit_lock:
        if not _atexit_registered:
            atexit.register(_delete_all_servers)
            _atexit_registered = True


def _delete_all_servers() -> None:
    """At interpreter exit, while threads can still call back: delete every server still alive."""
    for server in list(_live_servers):
        if server.owner_state is State.OWNED:
            try:
                server.delete()
            except Exception:
                logger.exception("deleting a TRITONSERVER_Server at exit failed")
            server.wait_deleted(timeout_s=None)
