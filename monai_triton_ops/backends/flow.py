"""How a backend's requests flow: the one queue, the in-flight limit, the caller-thread path, completion, deadlines.

``BaseBackend`` (``base.py``) is the contract: lifecycle, the public calls and the hooks a backend implements.
``RequestFlow`` is what runs under those calls, the same for every backend: a call is checked and split into
requests (``prepare``), queued with a deadline timer (``enqueue``), handed to the backend while fewer than
``max_in_flight`` are out (``_pump``, ``_dispatch``), and concluded request by request (``_conclude``: outputs
checked and converted, joined in order, or the call failed once). ``infer()``'s one-request call may instead take
a place and run on the caller's thread (``start_here``, ``run_here``). A ``BaseBackend`` has one flow (composition,
not a base class): the flow holds the state the lifecycle and the requests share, and asks the backend only for its
hooks (``FlowHooks``: ``_infer``, ``_submit``, ``_cancel``), its options and its signature; every change to that
state is made under ``lock``.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import ClassVar, Protocol

from ..errors import BackendStateError, InferenceError, InferenceTimeoutError, MonaiTritonError, UsageError
from ..signature import ModelSignature
from ..validation import InputChecks, check_outputs
from .arrays import ArrayLike, batch_of, join, to_family
from .deadlines import call_at
from .options import BackendOptions
from .requests import Call, InferRequest, Parameter, checked_parameters, complete, split_requests, wanted_outputs

logger = logging.getLogger("monai_triton_ops.backends.base")  # one logger for the contract and its flow


class BackendState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class FlowHooks(Protocol):
    """What the flow asks of its backend: names for messages, options, the signature and the backend's hooks."""

    kind: ClassVar[str]
    model_name: str
    options: BackendOptions
    takes_parameters: ClassVar[bool]

    @property
    def signature(self) -> ModelSignature: ...
    def _infer(self, request: InferRequest) -> Mapping[str, ArrayLike]: ...
    def _submit(self, request: InferRequest) -> Future[Mapping[str, ArrayLike]]: ...
    def _cancel(self, request: InferRequest) -> None: ...


class RequestFlow:
    """The request flow of one backend (``BaseBackend`` has one): see the module docstring.

    It holds the state the lifecycle and the flow share, every change made under ``lock``: ``state``, the
    ``signature`` and its input checks once open, the ``queue`` of requests not yet handed over, the ``calls`` not
    yet completed, the requests ``in_flight``, and ``pid``, the process that opened the backend.
    """

    def __init__(self, backend: FlowHooks) -> None:
        self._backend = backend
        self.lock = threading.Lock()  # a plain lock on the per-request path (a Condition's `with` is Python code)
        self.drained = threading.Condition(self.lock)  # what close() waits on: requests and calls ending
        self.state = BackendState.NEW
        self.signature: ModelSignature | None = None
        self.check_inputs: InputChecks | None = None
        self.pid = os.getpid()  # the process that opened it: its threads and connections are not a forked child's
        self.queue: deque[tuple[Call, int]] = deque()
        self.calls: set[Call] = set()
        self.in_flight = 0
        self._local = threading.local()

    def prepare(
        self,
        what: str,
        inputs: Mapping[str, ArrayLike],
        outputs: Sequence[str] | None,
        timeout_s: float | None,
        parameters: Mapping[str, Parameter] | None = None,
    ) -> Call:
        """The checked call: inputs validated, requests within ``max_batch_size``, its deadline fixed."""
        signature, check_inputs = self._signature_if_open(what)
        check_inputs(inputs)
        given_parameters = checked_parameters(self._backend, parameters)
        wanted = wanted_outputs(signature, outputs)
        timeout = self._backend.options.timeout_s if timeout_s is None else timeout_s
        if timeout is not None and not timeout > 0:
            raise UsageError(f"model {self._backend.model_name!r}: timeout_s must be > 0 seconds, got {timeout!r}")
        call = Call(
            split_requests(self._backend.model_name, signature, inputs, wanted, timeout, given_parameters), timeout
        )
        if logger.isEnabledFor(logging.DEBUG):
            shapes = {n: tuple(v.shape) for n, v in inputs.items()}
            logger.debug("%r %s: %d request(s) of %s", self._backend, what, len(call.requests), shapes)
        return call

    def enqueue(self, call: Call) -> None:
        """Queue the call's requests (a deadline timer armed); the pump hands them to the backend."""
        with self.lock:
            if self.state is not BackendState.OPEN:
                raise BackendStateError(f"{self._backend!r}: submit() needs an open backend (state {self.state.value})")
            self.check_process()
            self.calls.add(call)
            self.queue.extend((call, index) for index in range(len(call.requests)))
        # A weak reference: the future keeps its callbacks, so a strong one would make a cycle that keeps every
        # result alive until the garbage collector runs (shared-memory outputs are leased until their arrays go).
        call.future.add_done_callback(functools.partial(self._forget, weakref.ref(call)))
        deadline = call.requests[0].deadline
        if deadline is not None:
            call.timer = call_at(deadline, functools.partial(self._expire, call))
        self._pump()

    def start_here(self, call: Call) -> bool:
        """Take a place among the ``max_in_flight`` for a call run on this thread; False when none is free
        (or requests wait in the queue, which go first)."""
        with self.lock:
            if self.state is not BackendState.OPEN:
                raise BackendStateError(f"{self._backend!r}: infer() needs an open backend (state {self.state.value})")
            self.check_process()
            if self.queue or self.in_flight >= self._backend.options.max_in_flight:
                return False
            self.calls.add(call)  # close() waits for it and, past its deadline, fails it like any other
            self.in_flight += 1
            call.running.add(0)
        return True

    def run_here(self, call: Call) -> dict[str, ArrayLike]:
        """Run the call's one request on this thread; its deadline is the backend's to keep (no timer entry).

        An answer after the deadline is the deadline's error, as on a worker. ``close()`` may fail the
        call meanwhile (and ``_cancel`` the request); the caller then gets that error, whatever the
        backend returns later.
        """
        request, result = call.requests[0], None
        try:
            try:
                outputs = self._backend._infer(request)
                if request.deadline is not None and time.monotonic() > request.deadline:
                    raise InferenceTimeoutError("the answer came after the deadline")  # as a timer would have had it
            except BaseException as exc:  # whatever the backend raised goes where a submitted request's would
                with self.lock:
                    call.running.discard(0)  # over: nothing left for a cancel to stop
                self._conclude(call, 0, None, exc)
            else:
                try:
                    checked = self._checked(call, 0, outputs)
                except BaseException as exc:  # a wrong answer
                    self.fail(call, exc)
                else:
                    if call.settle():  # not failed meanwhile by close(): the caller's, with no future to pass through
                        result = checked
                del outputs
        finally:  # its place and its call go together, once the outcome is settled
            with self.lock:
                self.in_flight -= 1
                call.running.discard(0)
                self.calls.discard(call)
                self._wake_close()
                queued = bool(self.queue)
        if queued:  # requests submitted while this one held its place
            self._pump()
        return result if result is not None else call.future.result()

    def check_process(self) -> None:
        """A forked child has none of the parent's threads or connections: it opens a backend of its own."""
        if os.getpid() != self.pid:
            raise BackendStateError(
                f"{self._backend!r} was opened in process {self.pid}; after fork() open a new backend in this process"
            )

    def _signature_if_open(self, what: str) -> tuple[ModelSignature, InputChecks]:
        """No lock: each attribute is read at once, and queueing or starting a request checks the state again under
        the lock."""
        signature, check_inputs = self.signature, self.check_inputs
        if self.state is not BackendState.OPEN or signature is None or check_inputs is None:
            raise BackendStateError(f"{self._backend!r}: {what} needs an open backend (state {self.state.value})")
        return signature, check_inputs

    def _wake_close(self) -> None:
        """A request or call ended: wake ``close()`` if it waits for them (lock held; only it waits on the lock)."""
        if self.state is BackendState.CLOSING:
            self.drained.notify_all()

    def busy(self) -> bool:
        """Calls not yet completed (their futures remove them), or requests still out (lock held)."""
        return bool(self.calls) or self.in_flight > 0

    def _pump(self) -> None:
        """Hand queued requests to the backend while fewer than ``max_in_flight`` are out."""
        if getattr(self._local, "pumping", False):  # a request finished synchronously inside _dispatch
            return
        self._local.pumping = True
        try:
            while True:
                with self.lock:
                    if not self.queue or self.in_flight >= self._backend.options.max_in_flight:
                        return
                    call, index = self.queue.popleft()
                    if call.future.done():
                        continue
                    self.in_flight += 1
                    call.running.add(index)
                self._dispatch(call, index)
        finally:
            self._local.pumping = False

    def _dispatch(self, call: Call, index: int) -> None:
        try:
            child = self._backend._submit(call.requests[index])
        except Exception as exc:  # a backend refusing synchronously fails this call, not the caller's thread
            drop_locals(exc)
            child = Future()
            child.set_exception(exc)
        child.add_done_callback(functools.partial(self._finished, call, index))

    def _finished(self, call: Call, index: int, child: Future[Mapping[str, ArrayLike]]) -> None:
        self._release(call, index)
        try:  # read, not raised: a raise would add this frame (and the call it holds) to the error's traceback
            error = child.exception()
        except BaseException as exc:  # the child's cancellation
            error = exc.with_traceback(None)
        if error is not None:
            self._conclude(call, index, None, error)
        else:
            outputs = child.result()
            self._conclude(call, index, outputs, None)
            del outputs
        self._pump()

    def _release(self, call: Call, index: int) -> None:
        """A request is no longer out: its place among the ``max_in_flight`` is free."""
        with self.lock:
            self.in_flight -= 1
            call.running.discard(index)
            self._wake_close()

    def _conclude(
        self, call: Call, index: int, outputs: Mapping[str, ArrayLike] | None, error: BaseException | None
    ) -> None:
        """One request's outcome into its call: outputs checked and kept (the last completes the call), or the
        call failed with the backend's error (a foreign one as ``InferenceError``)."""
        if error is None:
            try:
                checked = self._checked(call, index, outputs or {})
            except BaseException as exc:  # a wrong answer fails the call, not the thread that delivered it
                self.fail(call, exc)
                return
            if len(call.requests) == 1:
                if call.settle():
                    complete(call.future, result=checked)
            elif (parts := call.store(index, checked)) is not None:
                complete(call.future, result=join(parts))
        elif isinstance(error, InferenceTimeoutError) and call.timeout_s is not None:
            self._expire(call, cause=error)  # the backend saw the caller's deadline first: one message either way
        elif isinstance(error, MonaiTritonError) or not isinstance(error, Exception):
            self.fail(call, error)
        else:
            failure = InferenceError(
                f"model {self._backend.model_name!r}: {self._backend.kind} backend failed: {error!r}"
            )
            failure.__cause__ = error
            self.fail(call, failure)

    def _checked(self, call: Call, index: int, outputs: Mapping[str, ArrayLike]) -> dict[str, ArrayLike]:
        """The request's outputs, checked (names, dtypes, batch) and in the caller's family."""
        request = call.requests[index]
        batch = batch_of(request.inputs) if len(call.requests) > 1 else None
        check_outputs(self._backend.signature, request.outputs, outputs, batch=batch)
        return {name: to_family(outputs[name], request.family) for name in request.outputs}

    def run_sync(self, request: InferRequest) -> Mapping[str, ArrayLike]:
        remaining = request.remaining_s()
        if remaining is not None and remaining <= 0:  # its deadline passed while it waited for a thread
            raise InferenceTimeoutError(
                f"model {self._backend.model_name!r}: deadline passed before the request started"
            )
        return self._backend._infer(request)

    def _expire(self, call: Call, cause: BaseException | None = None) -> None:
        waited = time.monotonic() - call.started
        model = self._backend.model_name
        error = InferenceTimeoutError(
            f"model {model!r}: no answer within the deadline of {call.timeout_s:g} s (waited {waited:.2f} s)"
        )
        error.__cause__ = cause
        if self.fail(call, error):
            self.cancel_running(call)

    def fail(self, call: Call, error: BaseException) -> bool:
        if not call.settle():
            return False
        complete(call.future, error=error)
        return True

    def cancel_running(self, call: Call) -> None:
        with self.lock:
            running = [call.requests[index] for index in sorted(call.running)]
        for request in running:
            request.cancelled.set()
            try:
                self._backend._cancel(request)
            except Exception:  # best effort: the call has already failed with a clear error
                logger.warning("%r: cancelling a request failed", self._backend, exc_info=True)

    def _forget(self, ref: weakref.ref[Call], future: Future[dict[str, ArrayLike]]) -> None:
        call = ref()
        if call is None:  # already forgotten
            return
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None  # the timer's callback holds the call: a cycle, kept (with its results) until GC
        call.drop_results()  # the timer heap may hold the call a while longer; the caller's future has them
        with self.lock:
            self.calls.discard(call)
            self._wake_close()
        if future.cancelled() and call.settle():  # the caller cancelled: stop what is running
            self.cancel_running(call)


def drop_locals(error: BaseException) -> None:
    """Clear the local variables of the frames ``error`` (and its causes) went through.

    A refused request's exception ends up in the call's failed future, and its traceback keeps every frame
    it was raised through, with their locals: the request, its inputs, what the backend made of it. A caller
    that keeps the future would keep all that alive. The traceback still says where it was raised.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
