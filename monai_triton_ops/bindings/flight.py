"""The in-flight state that the request, response, trace and server wrappers share.

A request lent to Triton by ``TRITONSERVER_ServerInferAsync`` is in flight until Triton has released it *and*
delivered its FINAL response: two callbacks, in either order, on Triton's threads, possibly before
``infer_async`` returns. :class:`Flight` is one such inference: the callbacks and user objects it was lent with
(held for the whole flight, so C never calls into freed objects), the exceptions those callbacks raised, and the
future that ends it. :class:`FlightServer` is what a request and a response need of the server they belong to.

Both live here, below the wrappers, so that each wrapper imports this module and no wrapper imports another
for them.
"""

from __future__ import annotations

import concurrent.futures
import threading
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
        "allocator",
        "allocator_user_object",
        "errors",
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
        self.errors: list[BaseException] = []
        self.allocator = allocator
        self.allocator_user_object = allocator_user_object
        self.response_fn = response_fn
        self.response_user_object = response_user_object
        self.release_fn = release_fn
        self.release_user_object = release_user_object

    def note(self, exc: BaseException) -> None:
        self.errors.append(exc)

    @property
    def completed(self) -> bool:
        """Whether the future was given its outcome (an exception noted now would reach nobody)."""
        return self.future.done()

    def allocation_error(self) -> BaseException | None:
        """The first exception an allocator callback raised (the cause of the response's error)."""
        return self.errors[0] if self.errors else None

    def complete(self) -> None:
        """Give the future its outcome: the first exception a callback raised, else ``None``."""
        if self.errors:
            self.future.set_exception(self.errors[0])
        else:
            self.future.set_result(None)
