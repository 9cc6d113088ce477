"""The backend contract: ``open / submit / infer / close``, a context manager, and a MONAI predictor.

A backend is where the model runs (in-process TorchScript, in-process Triton, remote Triton).
Everything that must behave the same on every backend lives in ``BaseBackend``:

    submit(inputs) -> validate -> split to max_batch_size -> queue -> at most max_in_flight requests
    handed to the backend (_submit, or _infer on a small worker pool) -> check outputs -> convert to
    the caller's array family -> join in order -> the caller's Future (or InferenceTimeoutError at
    the deadline, after a best-effort _cancel)

``close(timeout_s)`` stops new requests, lets those in flight finish until its deadline, then
fails the rest with ``BackendStateError`` and releases the backend. Arrays a backend returns are
the caller's to keep: never views into memory the backend reuses (see ``docs/architecture.md``).
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, overload

import numpy as np
import torch

from ..errors import (
    BackendStateError,
    ConfigError,
    InferenceError,
    InferenceTimeoutError,
    MonaiTritonError,
    UsageError,
)
from ..signature import ModelSignature
from ..validation import dtype_name, validate_inputs
from .arrays import ArrayFamily, ArrayLike, batch_of, join, split, to_family
from .deadlines import call_at
from .options import BackendOptions
from .requests import Call, InferRequest, Parameter, checked_parameters, complete, unwrapped, wanted_outputs

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ArrayFamily", "ArrayLike", "BackendState", "BaseBackend", "InferRequest"]

logger = logging.getLogger(__name__)

#: How long ``close()`` waits for requests in flight when the caller gives no deadline.
CLOSE_TIMEOUT_S = 30.0


class BackendState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class BaseBackend(ABC):
    """Lifecycle, validation, batch split, requests in flight, deadlines and conversions.

    A subclass provides ``_open`` and either ``_infer`` (synchronous: run on the base's worker
    pool, ``max_in_flight`` threads) or ``_submit`` (asynchronous: must not block, completes the
    future exactly once), optionally ``_cancel`` and ``_close``. ``open()`` is explicit (and done
    by ``with``) so heavy loading happens where the caller chooses; a closed backend never reopens.
    """

    #: The spec scheme this backend answers to (``"torch"``, ``"grpc"``...), for messages.
    kind: ClassVar[str] = "base"
    #: The frozen dataclass of options this backend accepts.
    options_type: ClassVar[type[BackendOptions]] = BackendOptions
    #: Whether requests may carry Triton request parameters (``submit(..., parameters=...)``) to the model.
    takes_parameters: ClassVar[bool] = False

    def __init__(
        self,
        model_name: str,
        *,
        model_repository: str | Path | None = None,
        version: int | None = None,
        urls: Sequence[str] = (),
        options: BackendOptions | None = None,
    ) -> None:
        cls = type(self)
        if cls._infer is BaseBackend._infer and cls._submit is BaseBackend._submit:
            raise TypeError(f"{cls.__name__} must implement _infer (synchronous) or _submit (asynchronous)")
        options = cls.options_type() if options is None else options
        if not isinstance(options, cls.options_type):
            raise ConfigError(
                f"backend {cls.kind!r} takes {cls.options_type.__name__} options, got {type(options).__name__}"
            )
        self.model_name = model_name
        self.model_repository = None if model_repository is None else Path(model_repository)
        self.version = version
        self.urls = tuple(urls)
        self.options = options
        self._state = BackendState.NEW
        self._lock = threading.Condition(threading.Lock())
        self._signature: ModelSignature | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._queue: deque[tuple[Call, int]] = deque()
        self._calls: set[Call] = set()
        self._in_flight = 0
        self._local = threading.local()

    # -- what a subclass provides ------------------------------------------------------------
    @abstractmethod
    def _open(self) -> ModelSignature:
        """Load or connect to the model and return its signature."""

    def _infer(self, request: InferRequest) -> Mapping[str, ArrayLike]:
        """Synchronous backends: run one request (on a pool thread); outputs keyed by requested names."""
        raise NotImplementedError

    def _submit(self, request: InferRequest) -> Future[Mapping[str, ArrayLike]]:
        """Asynchronous backends override this; by default ``_infer`` runs on the worker pool."""
        pool = self._pool
        if pool is None:
            raise BackendStateError(f"{self!r}: no worker pool (not open)")
        return pool.submit(self._run_sync, request)

    def _cancel(self, request: InferRequest) -> None:  # noqa: B027 - optional hook
        """Best effort: stop a request past its deadline or left over at ``close()``."""

    def _close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing to release
        """Release what ``_open`` acquired; requests that ignored ``_cancel`` may still be running."""

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def state(self) -> BackendState:
        with self._lock:
            return self._state

    @property
    def in_flight(self) -> int:
        """Requests handed to the backend and not finished (never above ``options.max_in_flight``)."""
        with self._lock:
            return self._in_flight

    @property
    def signature(self) -> ModelSignature:
        """The model's named inputs and outputs; available once open."""
        if self._signature is None:
            raise BackendStateError(f"{self!r}: call open() (or use 'with') before reading the signature")
        return self._signature

    def open(self) -> Self:
        """Load the model; a no-op when already open. Returns ``self`` for chaining."""
        with self._lock:
            if self._state in (BackendState.CLOSING, BackendState.CLOSED):
                raise BackendStateError(f"{self!r}: cannot reopen a backend once it has been closed")
            if self._state is BackendState.NEW:
                self._signature = self._open()
                if type(self)._submit is BaseBackend._submit:
                    self._pool = ThreadPoolExecutor(
                        self.options.max_in_flight, thread_name_prefix=f"{self.kind}-{self.model_name}"
                    )
                self._state = BackendState.OPEN
                logger.info("opened %r: inputs %s outputs %s", self, self._signature.inputs, self._signature.outputs)
        return self

    def close(self, timeout_s: float | None = None) -> None:
        """Stop new requests, wait for those in flight up to ``timeout_s``, fail the rest, release.

        Safe to call more than once. ``timeout_s=None`` waits at most ``CLOSE_TIMEOUT_S``.
        """
        limit = CLOSE_TIMEOUT_S if timeout_s is None else max(0.0, timeout_s)
        with self._lock:
            if self._state is not BackendState.OPEN:
                if self._state is BackendState.NEW:
                    self._state = BackendState.CLOSED
                return
            self._state = BackendState.CLOSING
            end = time.monotonic() + limit
            while self._busy() and (remaining := end - time.monotonic()) > 0:
                self._lock.wait(remaining)
            leftover = [call for call in self._calls if not call.future.done()]
            self._queue.clear()
        for call in leftover:
            error = BackendStateError(f"{self!r}: closed after waiting {limit:g} s with this request still in flight")
            if self._fail(call, error):
                self._cancel_running(call)
        try:
            self._close()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                self._state = BackendState.CLOSED
            logger.info("closed %r (%d request(s) cut off)", self, len(leftover))

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model_name!r}, state={self._state.value})"

    # -- inference ---------------------------------------------------------------------------
    def submit(
        self,
        inputs: Mapping[str, ArrayLike],
        *,
        outputs: Sequence[str] | None = None,
        timeout_s: float | None = None,
        parameters: Mapping[str, Parameter] | None = None,
    ) -> Future[dict[str, ArrayLike]]:
        """Start one inference; the future holds every requested output (default: all).

        Inputs are checked against the signature before anything runs; a batch above
        ``max_batch_size`` is split into requests and joined back in order. Outputs come back in
        the first input's array family and on its device. ``timeout_s`` (default: the options')
        bounds the whole call; past it the future raises ``InferenceTimeoutError``. ``parameters``
        are Triton request parameters for the model (backends with ``takes_parameters`` only).
        """
        signature = self._signature_if_open("submit()")
        validate_inputs(signature, inputs)
        given_parameters = checked_parameters(self, parameters)
        wanted = wanted_outputs(signature, outputs)
        timeout = self.options.timeout_s if timeout_s is None else timeout_s
        if timeout is not None and not timeout > 0:
            raise UsageError(f"model {self.model_name!r}: timeout_s must be > 0 seconds, got {timeout!r}")
        given = {name: unwrapped(inputs[name]) for name in signature.input_names}
        family = ArrayFamily.of(given[signature.input_names[0]])
        deadline = None if timeout is None else time.monotonic() + timeout
        requests = [
            InferRequest(
                model=self.model_name,
                inputs=part,
                outputs=wanted,
                family=family,
                deadline=deadline,
                parameters=given_parameters,
            )
            for part in self._parts(signature, given)
        ]
        call = Call(requests, timeout)
        with self._lock:
            if self._state is not BackendState.OPEN:
                raise BackendStateError(f"{self!r}: submit() needs an open backend (state {self._state.value})")
            self._calls.add(call)
            self._queue.extend((call, index) for index in range(len(requests)))
        # A weak reference: the future keeps its callbacks, so a strong one would make a cycle that keeps every
        # result alive until the garbage collector runs (shared-memory outputs are leased until their arrays go).
        call.future.add_done_callback(functools.partial(self._forget, weakref.ref(call)))
        if deadline is not None:
            call.timer = call_at(deadline, functools.partial(self._expire, call))
        logger.debug(
            "%r submit %d request(s) of %s", self, len(requests), {n: tuple(v.shape) for n, v in given.items()}
        )
        self._pump()
        return call.future

    def infer(
        self,
        inputs: Mapping[str, ArrayLike],
        *,
        outputs: Sequence[str] | None = None,
        timeout_s: float | None = None,
        parameters: Mapping[str, Parameter] | None = None,
    ) -> dict[str, ArrayLike]:
        """``submit(...).result()``: run the model and return the requested outputs."""
        return self.submit(inputs, outputs=outputs, timeout_s=timeout_s, parameters=parameters).result()

    @overload
    def __call__(self, data: torch.Tensor) -> torch.Tensor: ...
    @overload
    def __call__(self, data: np.ndarray) -> np.ndarray: ...
    def __call__(self, data: ArrayLike) -> ArrayLike:
        """MONAI predictor: one tensor in, one out (``options.output_name``, default the first)."""
        signature = self.signature
        if len(signature.inputs) != 1:
            raise UsageError(
                f"model {signature.name!r} has {len(signature.inputs)} inputs {list(signature.input_names)}; "
                "call infer() with a dict instead"
            )
        output = self.options.output_name or signature.outputs[0].name
        return self.infer({signature.inputs[0].name: data}, outputs=(output,))[output]

    # -- the machinery -----------------------------------------------------------------------
    def _signature_if_open(self, what: str) -> ModelSignature:
        with self._lock:
            if self._state is not BackendState.OPEN or self._signature is None:
                raise BackendStateError(f"{self!r}: {what} needs an open backend (state {self._state.value})")
            return self._signature

    def _parts(self, signature: ModelSignature, inputs: dict[str, ArrayLike]) -> list[dict[str, ArrayLike]]:
        limit = signature.max_batch_size
        if signature.batch_axis != 0 or limit <= 0 or batch_of(inputs) <= limit:
            return [inputs]
        return split(inputs, limit)

    def _busy(self) -> bool:
        """Calls not yet completed (their futures remove them), or requests still out (lock held)."""
        return bool(self._calls) or self._in_flight > 0

    def _pump(self) -> None:
        """Hand queued requests to the backend while fewer than ``max_in_flight`` are out."""
        if getattr(self._local, "pumping", False):  # a request finished synchronously inside _dispatch
            return
        self._local.pumping = True
        try:
            while True:
                with self._lock:
                    if not self._queue or self._in_flight >= self.options.max_in_flight:
                        return
                    call, index = self._queue.popleft()
                    if call.future.done():
                        continue
                    self._in_flight += 1
                    call.running.add(index)
                self._dispatch(call, index)
        finally:
            self._local.pumping = False

    def _dispatch(self, call: Call, index: int) -> None:
        try:
            child = self._submit(call.requests[index])
        except Exception as exc:  # a backend refusing synchronously fails this call, not the caller's thread
            child = Future()
            child.set_exception(exc)
        child.add_done_callback(functools.partial(self._finished, call, index))

    def _finished(self, call: Call, index: int, child: Future[Mapping[str, ArrayLike]]) -> None:
        with self._lock:
            self._in_flight -= 1
            call.running.discard(index)
            self._lock.notify_all()
        try:
            outputs = self._checked(call, index, child)
        except InferenceTimeoutError as exc:
            if call.timeout_s is None:  # the backend's own limit, not the caller's deadline
                self._fail(call, exc)
            else:  # the backend saw the caller's deadline first: one message either way
                self._expire(call, cause=exc)
        except BaseException as exc:  # whatever the backend raised goes to the caller's future
            self._fail(call, exc)
        else:
            parts = call.store(index, outputs)
            if parts is not None:
                complete(call.future, result=join(parts))
        self._pump()

    def _checked(self, call: Call, index: int, child: Future[Mapping[str, ArrayLike]]) -> dict[str, ArrayLike]:
        """The request's outputs, checked (names, dtypes, batch) and in the caller's family."""
        request = call.requests[index]
        try:
            outputs = child.result()
        except MonaiTritonError:
            raise
        except Exception as exc:
            raise InferenceError(f"model {self.model_name!r}: {self.kind} backend failed: {exc!r}") from exc
        if set(outputs) != set(request.outputs):
            raise InferenceError(
                f"model {self.model_name!r} returned outputs {sorted(outputs)}, requested {list(request.outputs)}"
            )
        signature = self.signature
        batch = batch_of(request.inputs) if len(call.requests) > 1 else None
        for name in request.outputs:
            value, spec = outputs[name], signature.output(name)
            actual = dtype_name(value)
            if actual != spec.dtype:
                raise InferenceError(
                    f"model {self.model_name!r} output {name!r}: expected dtype {spec.dtype}, got {actual}"
                )
            if batch is not None and (len(value.shape) == 0 or int(value.shape[0]) != batch):
                raise InferenceError(
                    f"model {self.model_name!r} output {name!r}: expected a batch of {batch}, got shape "
                    f"{list(value.shape)}"
                )
        return {name: to_family(outputs[name], request.family) for name in request.outputs}

    def _run_sync(self, request: InferRequest) -> Mapping[str, ArrayLike]:
        remaining = request.remaining_s()
        if remaining is not None and remaining <= 0:  # its deadline passed while it waited for a thread
            raise InferenceTimeoutError(f"model {self.model_name!r}: deadline passed before the request started")
        return self._infer(request)

    def _expire(self, call: Call, cause: BaseException | None = None) -> None:
        waited = time.monotonic() - call.started
        error = InferenceTimeoutError(
            f"model {self.model_name!r}: no answer within the deadline of {call.timeout_s:g} s (waited {waited:.2f} s)"
        )
        error.__cause__ = cause
        if self._fail(call, error):
            self._cancel_running(call)

    def _fail(self, call: Call, error: BaseException) -> bool:
        if not call.settle():
            return False
        complete(call.future, error=error)
        return True

    def _cancel_running(self, call: Call) -> None:
        with self._lock:
            running = [call.requests[index] for index in sorted(call.running)]
        for request in running:
            try:
                self._cancel(request)
            except Exception:  # best effort: the call has already failed with a clear error
                logger.warning("%r: cancelling a request failed", self, exc_info=True)

    def _forget(self, ref: weakref.ref[Call], future: Future[dict[str, ArrayLike]]) -> None:
        call = ref()
        if call is None:  # already forgotten
            return
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None  # the timer's callback holds the call: a cycle, kept (with its results) until GC
        call.drop_results()  # the timer heap may hold the call a while longer; the caller's future has them
        with self._lock:
            self._calls.discard(call)
            self._lock.notify_all()
        if future.cancelled() and call.settle():  # the caller cancelled: stop what is running
            self._cancel_running(call)
