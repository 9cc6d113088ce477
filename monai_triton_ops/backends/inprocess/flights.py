"""The one registry of what an in-process server has lent to Triton: each request from submit to landing.

A request is in flight from ``TRITONSERVER_ServerInferAsync`` until Triton has released it and delivered its
FINAL response (the binding's flight future completes then). The server's ``Flights`` holds, per request, the
Triton request (Triton's until it lands; deleted here as soon as it lands: a request left alive pins its model,
and unloading would wait on it) and the answer it was submitted with (completed by the response callback; a
failure seen only at landing fails it here, if nothing did before).

It is what ``close()`` drains and cancels, what a cancel at a deadline looks up, and what tells a retiring
server that Triton has let go of everything (``wait_empty``). A key is the caller's own object for the
request (the backend's ``InferRequest``), held here until the request lands, so it cannot be reused meanwhile.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ... import bindings

logger = logging.getLogger(__name__)


class Answer(Protocol):
    """What a submitted request is answered through (the backend's future and outputs)."""

    def fail(self, error: BaseException) -> None:
        """Fail the answer with ``error`` (Triton's, or a callback's), unless it has its outcome already."""


class Flights:
    """The requests in flight, keyed by the caller's object for each; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a plain lock on the per-request path (a Condition's `with` is Python code)
        self._empty = threading.Condition(self._lock)
        self._flights: dict[Hashable, tuple[bindings.TRITONSERVER_InferenceRequest, Answer]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)

    def count_held(self) -> int:
        """How many are in flight, for a caller that holds the lock (``locked()``)."""
        return len(self._flights)

    def add(
        self,
        key: Hashable,
        request: bindings.TRITONSERVER_InferenceRequest,
        answer: Answer,
        admit: Callable[[], None],
    ) -> None:
        """Register a request about to be lent; ``admit`` (called under the lock) raises to refuse it."""
        with self._lock:
            admit()
            self._flights[key] = (request, answer)

    def land(self, key: Hashable, landed: concurrent.futures.Future[None]) -> None:
        """Triton let go of the request (the binding's flight future): forget it, delete it, fail its answer if
        the flight failed; wake whoever waits for the last one."""
        with self._lock:
            entry = self._flights.pop(key, None)
            if not self._flights:
                self._empty.notify_all()
        if entry is None:
            return
        request, answer = entry
        delete(request)
        error = landed.exception()
        if error is not None:
            answer.fail(error)

    def withdraw(self, key: Hashable) -> None:
        """A request Triton refused synchronously: it was never lent; forget it and delete it."""
        with self._lock:
            entry = self._flights.pop(key, None)
            if not self._flights:
                self._empty.notify_all()
        if entry is not None:
            delete(entry[0])

    def cancel(self, key: Hashable) -> None:
        """Ask Triton to cancel one request, best effort (under the lock: it is deleted only after this)."""
        with self._lock:
            entry = self._flights.get(key)
            if entry is not None:
                with contextlib.suppress(Exception):  # released meanwhile: nothing to cancel
                    entry[0].cancel()

    def cancel_all(self) -> int:
        """Ask Triton to cancel every request in flight; how many were."""
        with self._lock:
            for request, _ in self._flights.values():
                with contextlib.suppress(Exception):
                    request.cancel()
            return len(self._flights)

    def wait_empty(self, timeout_s: float | None, *, or_until: Callable[[], bool] | None = None) -> bool:
        """Wait until nothing is in flight (``None``: without a deadline) or ``or_until()`` holds; whether empty.

        ``wake()`` makes a waiter look at ``or_until`` again.
        """
        with self._lock:
            self._empty.wait_for(
                lambda: not self._flights or (or_until is not None and or_until()),
                timeout=None if timeout_s is None else max(0.0, timeout_s),
            )
            return not self._flights

    def locked(self) -> threading.Lock:
        """The registry's lock: a change of the server's phase is made under it (``add`` admits under it)."""
        return self._lock

    def wake(self) -> None:
        """Wake the waiters (the server's phase changed; lock held by the caller)."""
        self._empty.notify_all()


def delete(request: bindings.TRITONSERVER_InferenceRequest) -> None:
    """Delete a request Python owns (once landed, or never lent); one Triton still holds is left alone."""
    from ... import bindings as b

    if request.owner_state is b.State.OWNED:
        request.delete()
