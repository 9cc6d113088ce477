"""The backend contract: ``open / submit / infer / close``, a context manager, and a MONAI predictor.

A backend is where the model runs (in-process TorchScript, in-process Triton, remote Triton).
Everything that must behave the same on every backend lives in ``BaseBackend`` (the contract: lifecycle, the
calls, the hooks a backend implements) and the request flow under it (``flow.py``):

    submit(inputs) -> validate -> split to max_batch_size -> queue -> at most max_in_flight requests
    handed to the backend (_infer on the contract's worker pool, workers.py; or _submit, a backend's own
    asynchronous call) -> check outputs -> convert to the caller's array family -> join in order -> the
    caller's Future (or InferenceTimeoutError at the deadline, after a best-effort cancel)

    infer(inputs), one request, a backend that allows it, fewer than max_in_flight out -> the same
    checks, limits and errors, but _infer runs on the caller's thread: no hand-off

The queue, the in-flight limit and the future of a request are the contract's alone: a backend runs one
request when asked (``_infer``, or ``_submit``) and sees a request's cancellation on ``request.cancelled``.

``close(timeout_s)`` stops new requests, lets those in flight finish until its deadline, then
fails the rest with ``BackendStateError`` and releases the backend. Arrays a backend returns are
the caller's to keep: never views into memory the backend reuses (see ``docs/architecture.md``).
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, NamedTuple, overload

import numpy as np

from ..client.workers import JOIN_TIMEOUT_S, Workers
from ..errors import BackendStateError, ConfigError, UsageError
from ..signature import ModelSignature
from ..validation import InputChecks
from .arrays import ArrayFamily, ArrayLike
from .flow import BackendState, RequestFlow
from .options import BackendOptions
from .requests import InferRequest, Parameter

if TYPE_CHECKING:
    import torch
    from typing_extensions import Self

__all__ = ["ArrayFamily", "ArrayLike", "Availability", "BackendState", "BaseBackend", "InferRequest"]

logger = logging.getLogger(__name__)

#: How long ``close()`` waits for requests in flight when the caller gives no deadline.
CLOSE_TIMEOUT_S = 30.0


class Availability(NamedTuple):
    """Whether a backend can run here, and one line on what it needs or why it cannot (``monai-triton backends``)."""

    runs_here: bool
    detail: str


class BaseBackend(ABC):
    """Lifecycle, validation, batch split, requests in flight, deadlines and conversions.

    A subclass provides ``_open`` and either ``_infer`` (synchronous: run on the base's worker
    pool, ``max_in_flight`` threads, made before ``_open`` and given to it as ``self._pool``) or ``_submit``
    (asynchronous: must not block, completes the future exactly once), optionally ``_cancel``, ``_close``
    and ``_can_infer_here`` (``_infer`` on the caller's thread). ``open()`` is explicit (and done
    by ``with``) so heavy loading happens where the caller chooses; a closed backend never reopens. Requests run
    through the backend's ``RequestFlow`` (``flow.py``), which holds the state they share with the lifecycle.
    """

    #: The spec scheme this backend answers to (``"torch"``, ``"grpc"``...), for messages.
    kind: ClassVar[str] = "base"
    #: The frozen dataclass of options this backend accepts.
    options_type: ClassVar[type[BackendOptions]] = BackendOptions
    #: Whether requests may carry Triton request parameters (``submit(..., parameters=...)``) to the model.
    takes_parameters: ClassVar[bool] = False

    @classmethod
    def availability(cls, scheme: str) -> Availability:
        """Whether this backend can run here, asked through the registry once its class imports.

        Without a model or a server: a backend checks what it needs beyond its import (a device, a library) and
        says so in one line. ``scheme`` is the one it is registered under (a class may serve several).
        """
        return Availability(True, "a third-party backend")

    def describe(self) -> str:
        """Where and how this backend runs its model, in words: the run line's ``model 'x' ran on ...``."""
        return f"{self.kind or type(self).__name__} ({type(self).__name__})"

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
        self._pool: Workers | None = None
        self._flow = RequestFlow(self)

    # -- what a subclass provides ------------------------------------------------------------
    @abstractmethod
    def _open(self) -> ModelSignature:
        """Load or connect to the model and return its signature."""

    def _infer(self, request: InferRequest) -> Mapping[str, ArrayLike]:
        """Synchronous backends: run one request (on a pool thread, or the caller's: ``_can_infer_here``); outputs
        keyed by requested names. A long request looks at ``request.cancelled`` between its steps."""
        raise NotImplementedError

    def _submit(self, request: InferRequest) -> Future[Mapping[str, ArrayLike]]:
        """Asynchronous backends override this; by default ``_infer`` runs on the worker pool."""
        pool = self._pool
        if pool is None:
            raise BackendStateError(f"{self!r}: no worker pool (not open)")
        return pool.submit(self._flow.run_sync, request)

    @property
    def _synchronous(self) -> bool:
        """Whether this backend runs ``_infer`` on the contract's pool (it does not override ``_submit``)."""
        return type(self)._submit is BaseBackend._submit

    def _can_infer_here(self) -> bool:
        """Whether ``infer()`` may run a request's ``_infer`` on the calling thread now; default no.

        Only for a backend whose request keeps its own deadline on any thread (its blocking calls
        carry the time left) and ends when ``close()`` releases the backend: the base arms no timer for
        such a request, and the caller's thread is the one that waits.
        """
        return False

    def _cancel(self, request: InferRequest) -> None:  # noqa: B027 - optional hook: nothing to stop by default
        """Best effort: stop a request past its deadline or left over at ``close()`` (``request.cancelled`` is
        already set)."""

    def _close(self) -> None:  # noqa: B027 - optional hook: nothing to release by default
        """Release what ``_open`` acquired; requests that ignored ``_cancel`` may still be running."""

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def state(self) -> BackendState:
        with self._flow.lock:
            return self._flow.state

    @property
    def _state(self) -> BackendState:
        """The state without the lock (for ``__repr__``, which messages made under the lock call)."""
        return self._flow.state

    @property
    def _pid(self) -> int:
        """The process that opened the backend (a forked child's copy is not its to release)."""
        return self._flow.pid

    @property
    def in_flight(self) -> int:
        """Requests handed to the backend and not finished (never above ``options.max_in_flight``)."""
        with self._flow.lock:
            return self._flow.in_flight

    @property
    def signature(self) -> ModelSignature:
        """The model's named inputs and outputs; available once open."""
        signature = self._flow.signature
        if signature is None:
            raise BackendStateError(f"{self!r}: call open() (or use 'with') before reading the signature")
        return signature

    def open(self) -> Self:
        """Load the model; a no-op when already open. Returns ``self`` for chaining."""
        flow = self._flow
        with flow.lock:
            if flow.state in (BackendState.CLOSING, BackendState.CLOSED):
                raise BackendStateError(f"{self!r}: cannot reopen a backend once it has been closed")
            if flow.state is BackendState.NEW:
                flow.pid = os.getpid()
                if self._synchronous:
                    self._pool = Workers(
                        f"{self.kind}-{self.model_name}", self.options.max_in_flight, hosts_clients=False
                    )
                try:
                    signature = self._open()
                except BaseException:
                    self._stop_pool()
                    raise
                flow.signature, flow.check_inputs = signature, InputChecks(signature)
                flow.state = BackendState.OPEN
                logger.info("opened %r: inputs %s outputs %s", self, signature.inputs, signature.outputs)
        return self

    def close(self, timeout_s: float | None = None) -> None:
        """Stop new requests, wait for those in flight up to ``timeout_s``, fail the rest, release.

        Safe to call more than once. ``timeout_s=None`` waits at most ``CLOSE_TIMEOUT_S``.
        """
        limit = CLOSE_TIMEOUT_S if timeout_s is None else max(0.0, timeout_s)
        flow = self._flow
        with flow.lock:
            if flow.state is not BackendState.OPEN:
                if flow.state is BackendState.NEW:
                    flow.state = BackendState.CLOSED
                return
            flow.state = BackendState.CLOSING
            end = time.monotonic() + limit
            while flow.busy() and (remaining := end - time.monotonic()) > 0:
                flow.drained.wait(remaining)
            leftover = [call for call in flow.calls if not call.future.done()]
            flow.queue.clear()
        for call in leftover:
            error = BackendStateError(f"{self!r}: closed after waiting {limit:g} s with this request still in flight")
            if flow.fail(call, error):
                flow.cancel_running(call)
        try:
            self._close()
        finally:
            self._stop_pool()
            with flow.lock:
                flow.state = BackendState.CLOSED
            logger.info("closed %r (%d request(s) cut off)", self, len(leftover))

    def _stop_pool(self) -> None:
        """No new work for the pool; wait (``JOIN_TIMEOUT_S`` in all) for threads that release what they own."""
        pool, self._pool = self._pool, None
        if pool is not None and os.getpid() == self._flow.pid:
            pool.stop(join_timeout_s=JOIN_TIMEOUT_S)

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
        call = self._flow.prepare("submit()", inputs, outputs, timeout_s, parameters)
        self._flow.enqueue(call)
        return call.future

    def infer(
        self,
        inputs: Mapping[str, ArrayLike],
        *,
        outputs: Sequence[str] | None = None,
        timeout_s: float | None = None,
        parameters: Mapping[str, Parameter] | None = None,
    ) -> dict[str, ArrayLike]:
        """``submit(...).result()``: run the model and return the requested outputs.

        The caller waits anyway, so a backend that allows it (``_can_infer_here``) runs a one-request
        call on the caller's thread while fewer than ``max_in_flight`` requests are out: no hand-off
        to a worker and back. Same checks, limits, deadline and errors as ``submit``.
        """
        flow = self._flow
        call = flow.prepare("infer()", inputs, outputs, timeout_s, parameters)
        if len(call.requests) == 1 and self._can_infer_here() and flow.start_here(call):
            return flow.run_here(call)
        flow.enqueue(call)
        return call.future.result()

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
