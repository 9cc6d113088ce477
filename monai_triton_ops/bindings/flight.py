"""The in-flight state that the request, response, trace and server wrappers share.

A request lent to Triton by ``TRITONSERVER_ServerInferAsync`` is in flight until Triton has released it *and*
delivered its FINAL response: two callbacks, in either order, on Triton's threads, possibly before
``infer_async`` returns. :class:`Flight` is one such inference: the callbacks and user objects it was lent with
(held for the whole flight, so C never calls into freed objects), the exceptions those callbacks raised, and the
future that ends it. :class:`FlightServer` is what a request and a response need of the server they belong to.

An exception kept for the future is :func:`detached` first: its traceback becomes a note of the same text, so
it keeps no frame, and through the frames no response, output buffer or request, alive (a response held by a
callback's frame would hold its buffers, whose handles hold this flight, which holds the exception: nothing
would ever free them).

Both live here, below the wrappers, so that each wrapper imports this module and no wrapper imports another
for them.
"""

from __future__ import annotations

import concurrent.futures
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .allocator import TRITONSERVER_ResponseAllocator


class FlightServer(Protocol):
    """What a request or a response needs of its ``TRITONSERVER_Server``: its pointer and its bookkeeping."""

    def _ptr(self) -> int: ...

    def _refuse_if_stopping(self) -> None:
        """Raise ``UnavailableError`` once the server is stopping (it takes no new requests)."""

    def _adopt(self, child: Any) -> None:
        """Remember a Python-owned request or response, to delete it when the server stops."""

    def _landed(self, handle: int) -> None:
        """The request of ``handle`` is no longer in flight (released and FINAL delivered)."""


class Flight:
    """One inference of a request: from ``infer_async`` to release + FINAL; what its callbacks use."""

    __slots__ = (
        "allocation_failure",
        "allocator",
        "allocator_user_object",
        "error",
        "final",
        "future",
        "lock",
        "release_fn",
        "release_user_object",
        "released",
        "response_fn",
        "response_user_object",
    )

    def __init__(
        self,
        *,
        allocator: TRITONSERVER_ResponseAllocator | None,
        allocator_user_object: Any,
        response_fn: Callable[..., None] | None,
        response_user_object: Any,
        release_fn: Callable[..., None] | None,
        release_user_object: Any,
    ) -> None:
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.lock = threading.RLock()
        self.released = False
        self.final = False
        self.error: BaseException | None = None
        """The first exception a callback of this inference raised (the future's outcome)."""
        self.allocation_failure: BaseException | None = None
        """The first exception an allocator callback raised (the cause of the response's error)."""
        self.allocator = allocator
        self.allocator_user_object = allocator_user_object
        self.response_fn = response_fn
        self.response_user_object = response_user_object
        self.release_fn = release_fn
        self.release_user_object = release_user_object

    def note(self, exc: BaseException, *, allocation: bool = False) -> None:
        """Keep ``exc`` (raised by a callback of this inference; ``allocation``: by an allocator callback), detached.

        Only the first of each kind is kept: the future raises the first, and a later one reaches nobody (it is
        mostly a consequence of the first: a response callback reading the error a failed allocation left).
        """
        first = self.error is None
        first_allocation = allocation and self.allocation_failure is None
        if first or first_allocation:
            detached(exc)
        if first:
            self.error = exc
        if first_allocation:
            self.allocation_failure = exc

    @property
    def completed(self) -> bool:
        """Whether the future was given its outcome (an exception noted now would reach nobody)."""
        return self.future.done()

    def allocation_error(self) -> BaseException | None:
        """The first exception an allocator callback raised (the cause of the response's error)."""
        return self.allocation_failure

    def complete(self) -> None:
        """Give the future its outcome: the first exception a callback raised, else ``None``.

        The callbacks and user objects are let go first: no callback of this inference comes any more, and a
        response kept past it still refers to this record, which must not keep them (a user object that holds
        that response would make a cycle only the garbage collector frees).
        """
        self.allocator = self.allocator_user_object = None
        self.response_fn = self.response_user_object = None
        self.release_fn = self.release_user_object = None
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(None)


def detached(exc: BaseException) -> BaseException:
    """``exc``, and the exceptions chained to it, with each traceback turned into a note of the same text.

    A traceback holds its frames, and a frame holds its local variables and the frame that called it (up to
    the trampoline and, for a callback made during a C call, the Python code that made that call): clearing
    the frames' variables is not enough, the callers' frames still hold theirs. The note keeps what the
    traceback showed (file, line, function and source of each frame, up to where the trampoline caught it).
    """
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            text = "".join(traceback.format_tb(current.__traceback__)).rstrip()
            _add_note(current, f"Raised in a callback (its traceback kept as text, so that it holds no frame):\n{text}")
            current.__traceback__ = None
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        grouped = getattr(current, "exceptions", ())  # an exception group's members
        if isinstance(grouped, tuple):
            pending.extend(e for e in grouped if isinstance(e, BaseException))
    return exc


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, which Python 3.10 lacks (there the note is kept, but not printed)."""
    notes = getattr(exc, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        try:
            exc.__notes__ = notes
        except AttributeError:  # an exception class with __slots__ and no __dict__
            return
    notes.append(note)
