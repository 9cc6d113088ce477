"""At interpreter exit, every remote backend still open is closed with ``timeout_s=0``: its work in flight is
abandoned at once, not waited for.

A remote request runs on the server, not in this process: waiting at exit for answers nobody will read would only
delay the end (a request's deadline is 2 minutes by default). Closing ends the calls still out (``CANCELLED``),
unregisters and unlinks the shared memory regions the server has let go of, unlinks the others (the janitor
unregisters them once the process is gone, as the server finishes their requests) and ends the worker threads,
each HTTP worker closing its own client. Nothing of a request runs in this process after that, so the exit keeps
the program's own exit code.

The regions' exit sweep must run after this (it would unregister each region through an HTTP worker still busy with
a call, waiting for it): both are the region owner's one ``atexit`` hook, which runs this first
(``shm/owner.py``, ``RegionOwner.before_sweep``).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Protocol

from .shm.owner import owner

logger = logging.getLogger(__name__)


class Closable(Protocol):
    def close(self, timeout_s: float | None = None) -> None: ...


_open: weakref.WeakSet[Closable] = weakref.WeakSet()  # a backend dropped unclosed leaves its regions to the sweep
_lock = threading.Lock()


def watch(backend: Closable) -> None:
    """Close ``backend`` at interpreter exit unless it is closed before, ahead of the regions' exit sweep."""
    with _lock:
        _open.add(backend)
    owner.before_sweep(close_open)


def forget(backend: Closable) -> None:
    """``backend`` is closed: nothing to do for it at exit."""
    with _lock:
        _open.discard(backend)


def close_open() -> None:
    """Close every backend still open, abandoning its work in flight (``atexit`` calls it)."""
    with _lock:
        backends = list(_open)
    for backend in backends:
        try:
            backend.close(timeout_s=0)
        except Exception:  # one backend's failure must not keep the others open
            logger.exception("closing %r at exit failed", backend)
