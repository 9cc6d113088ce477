"""What the models of one process share per server: a reference-counted registry, released by its last user.

A process with several models on the same server (an App SDK multi-AI app, an ensemble's members, two operators)
opens one backend per model; what they can share is kept here once per *key*, and every backend takes a
reference (``acquire``) and gives it back (``release``); the last release closes it::

    POOLS = Shared("HTTP connection pool", close=stop_pool)          # transports/http.py
    pool = POOLS.acquire(key, lambda: Workers(...), lambda pool: pool.grow(2))
    ...
    POOLS.release(key)   # the last user: stop_pool(pool)

Two shares use it: each HTTP server's connection pool (``transports/http.py``: threads that own the clients) and
each fleet's probing thread (``backends/remote/health.py``). gRPC needs none: the channels of one process to one
server share its TCP connection in gRPC's own subchannel pool (each model keeps its channel, so that closing it
ends that model's calls alone).

A key holds everything that decides how the server is spoken to (address, protocol, TLS material, headers,
compression, keepalive, reconnect backoff: ``TransportSettings``), so models with different credentials or TLS
settings never share. A forked child starts with an empty registry: the parent's threads and sockets are not
the child's (``os.register_at_fork``), and the child's backends make their own. At interpreter exit the backends'
exit hook closes every backend, and with the last one the shared part goes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Shared(Generic[T]):
    """``key -> (value, references)``; thread-safe. ``close(value)`` runs outside the lock, on the last release."""

    def __init__(self, what: str, close: Callable[[T], None]) -> None:
        self._what = what  # for log lines
        self._close = close
        self._lock = threading.Lock()
        self._entries: dict[Hashable, tuple[T, int]] = {}
        os.register_at_fork(after_in_child=self._forget)

    def acquire(self, key: Hashable, make: Callable[[], T], join: Callable[[T], None] | None = None) -> T:
        """The shared value for ``key``: made by the first user, ``join(value)`` run for each later one (under the
        lock: a pool grows for the model that joins it)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                value = make()
                self._entries[key] = (value, 1)
                return value
            value, references = entry
            if join is not None:
                join(value)
            self._entries[key] = (value, references + 1)
        logger.debug("a %s shared by %d users", self._what, references + 1)
        return value

    def release(self, key: Hashable) -> None:
        """One user is done; the last one closes the value. A key not held (a forked child's) is ignored."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            value, references = entry
            if references > 1:
                self._entries[key] = (value, references - 1)
                return
            del self._entries[key]
        self._close(value)

    def users(self, key: Hashable) -> int:
        """How many users hold ``key`` now (diagnostics and tests)."""
        with self._lock:
            entry = self._entries.get(key)
            return 0 if entry is None else entry[1]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _forget(self) -> None:
        """In a forked child: nothing of the parent's is held (its lock may have been taken mid-fork: a new one)."""
        self._lock = threading.Lock()
        self._entries = {}
