"""The contract's worker pool: ``max_in_flight`` threads that run a synchronous backend's requests (``_infer``).

Every backend that implements ``_infer`` (``torch``, the remote backends) gets one from ``BaseBackend.open()``,
made before the backend's own ``_open`` so that opening can use it. Why not a ``ThreadPoolExecutor``:
tritonclient's HTTP client is not thread-safe and is bound to the gevent hub of the thread that made it, so a
thread must own its client (and its hub) for its whole life and close both itself when it ends (closed from
another thread, they leak their sockets and hub or raise greenlet errors); an executor runs no code as its
threads end.

    workers = Workers("remote-seg", 2)
    future = workers.submit(run, request)         # never blocks: a queue put
    value = workers.call(fn, timeout_s=5)         # a control call from any thread, run on a worker
    client = workers.local(key, make)             # the calling worker's own resource, closed as it ends
    workers.stop(join_timeout_s=5)

The remote backend's prober (``remote/health.py``) is a one-thread pool of its own, off the request path:
resources are per thread whatever pool the thread belongs to, so a probe over HTTP has a client of its own
(``hosts_clients``). An HTTP server's connection pool (``transports/http.py``) is a ``lazy`` pool shared by the
process's models on that server: it starts a thread only when work would wait, and ``grow`` raises its limit.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from .status import CallError, Status

logger = logging.getLogger(__name__)

T = TypeVar("T")
A = TypeVar("A")
#: What ``make`` returns for ``local``: the resource and how to release it (on the same thread).
Made = tuple[T, Callable[[], None]]
#: How long stopping a pool waits for each of its threads once its last call has ended.
JOIN_TIMEOUT_S = 5.0
#: Extra wait, beyond a control call's own deadline, for a worker busy with a request to pick it up.
QUEUE_GRACE_S = 1.0
#: Each worker thread's resources, whichever pool it belongs to (``local`` and ``on_worker`` read it).
_THREAD = threading.local()
#: Run on every worker thread as it ends, after its resources are released (``at_thread_exit``).
_AT_EXIT: list[Callable[[], None]] = []
_AT_EXIT_LOCK = threading.Lock()


class Workers:
    """Up to ``count`` daemon threads fed from one queue; ``submit`` refuses work once ``stop`` has begun.

    All ``count`` threads start at once, or, ``lazy``, one more only when work waits and no thread is idle: a shared
    HTTP connection pool (``transports/http.py``) has as many threads, and so connections, as requests were ever
    in flight at once, not as many as its models could send.
    """

    def __init__(self, name: str, count: int, *, hosts_clients: bool = True, lazy: bool = False) -> None:
        #: Whether this pool's threads make clients of their own when they ``call`` another pool (the call runs
        #: inline): a prober's and the janitor's thread do; a backend's request threads do not, so an HTTP server's
        #: calls go to its one connection pool (``transports/http.py``), whichever model makes them.
        self.hosts_clients = hosts_clients
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Callable[[Any], Any], Any, Future[Any]] | None] = queue.SimpleQueue()
        self.closed = False
        self._owners: dict[int | None, dict[object, Made[Any]]] = {}  # each thread's resources (stop() reads)
        self._busy: set[int | None] = set()  # threads running work now (stop() reads)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # the threads' list, the limit, and the lazy pool's counts
        self._limit = 0
        self._lazy = lazy
        self._waiting = 0  # work queued and not yet taken (lazy)
        self._free = 0  # threads started and not running work (lazy; free again before their caller hears back)
        self.grow(max(1, count))

    @property
    def count(self) -> int:
        """How many threads the pool may have."""
        return self._limit

    @property
    def started(self) -> int:
        """How many threads it has started."""
        return len(self._threads)

    def grow(self, more: int) -> None:
        """Allow ``more`` threads (a shared connection pool grows as models join it, and never shrinks before
        ``stop``); started now unless ``lazy`` (then one, at least)."""
        with self._lock:
            self._limit += more
            wanted = 1 if self._lazy else self._limit
            while not self.closed and len(self._threads) < wanted:
                self._start()

    def _start(self) -> None:
        """(under the lock)"""
        thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        self._free += 1
        thread.start()

    def submit(self, fn: Callable[[A], T], arg: A) -> Future[T]:
        """``fn(arg)`` on a worker; its result or exception in the returned future."""
        if self.closed:
            raise CallError(Status.CANCELLED, "the backend is closed")
        future: Future[T] = Future()
        if self._lazy:
            with self._lock:
                self._waiting += 1
                if self._waiting > self._free and len(self._threads) < self._limit and not self.closed:
                    self._start()
        self._queue.put((fn, arg, future))
        return future

    def call(self, fn: Callable[[], T], *, timeout_s: float) -> T:
        """Run ``fn`` on a worker and wait for it: inline on this pool's own thread (queuing would wait for itself),
        and on a thread of a pool that ``hosts_clients`` (it owns its own)."""
        current = getattr(_THREAD, "pool", None)
        if current is self or (current is not None and current.hosts_clients):
            return fn()
        future = self.submit(lambda _: fn(), None)
        try:
            return future.result(timeout=timeout_s + QUEUE_GRACE_S)
        except TimeoutError:
            future.cancel()
            raise CallError(Status.DEADLINE, f"no worker answered within {timeout_s:.3g} s") from None

    @staticmethod
    def on_worker() -> bool:
        """Whether the calling thread is a worker (of any pool): it can own resources."""
        return hasattr(_THREAD, "resources")

    @staticmethod
    def local(key: object, make: Callable[[], Made[T]]) -> T:
        """This worker's resource for ``key``, made on first use; released (on this thread) when the worker ends."""
        resources: dict[object, Made[Any]] = _THREAD.resources
        if key not in resources:
            resources[key] = make()
        resource: T = resources[key][0]
        return resource

    @staticmethod
    def discard(key: object) -> None:
        """Release this worker's resource for ``key`` now (a connection left mid-message); the next use makes one."""
        made = _THREAD.resources.pop(key, None)
        if made is not None:
            _quietly(made[1])

    @staticmethod
    def at_thread_exit(hook: Callable[[], None]) -> None:
        """Run ``hook`` on every worker (of any pool) as it ends, after its resources are released (once per hook)."""
        with _AT_EXIT_LOCK:
            if hook not in _AT_EXIT:
                _AT_EXIT.append(hook)

    def stop(self, *, join_timeout_s: float) -> None:
        """Refuse new work, let the queued work run, and wait, ``join_timeout_s`` in all, for the threads to end:
        the idle ones, and those that own resources (they release them as they end). A thread busy with work that
        owns nothing (a request that ignored its cancel) is not waited for: it ends when its work does. Idempotent."""
        with self._lock:  # with the list: a lazy pool starts no thread after this
            if self.closed:
                return
            self.closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        end = time.monotonic() + join_timeout_s
        for thread in threads:
            if thread is not threading.current_thread() and (
                self._owners.get(thread.ident) or thread.ident not in self._busy
            ):
                thread.join(timeout=max(0.0, end - time.monotonic()))

    def _next(self) -> tuple[Callable[[Any], Any], Any, Future[Any]] | None:
        """The next job (``None``: stop), counted as taken for a lazy pool's growth."""
        job = self._queue.get()
        if self._lazy and job is not None:
            with self._lock:
                self._waiting -= 1
                self._free -= 1
        return job

    def _freed(self) -> None:
        """A job is over: counted free before its caller hears back (who may submit again at once)."""
        if self._lazy:
            with self._lock:
                self._free += 1

    def _work(self) -> None:
        resources: dict[object, Made[Any]] = {}
        _THREAD.resources = resources
        _THREAD.pool = self
        me = threading.get_ident()
        self._owners[me] = resources
        try:
            while (job := self._next()) is not None:
                fn, arg, future = job
                del job
                if future.set_running_or_notify_cancel():
                    self._busy.add(me)
                    try:
                        result = fn(arg)
                    except BaseException as exc:  # the future carries it to whoever waits
                        self._freed()
                        future.set_exception(exc)
                    else:
                        self._freed()
                        future.set_result(result)
                        del result
                    finally:
                        self._busy.discard(me)
                else:
                    self._freed()
                # Nothing of a finished request stays on this thread: its outputs may hold a leased slot.
                del fn, arg, future
        finally:
            for _, release in reversed(list(resources.values())):
                _quietly(release)
            resources.clear()
            with _AT_EXIT_LOCK:
                hooks = list(_AT_EXIT)
            for hook in hooks:
                _quietly(hook)


def _quietly(release: Callable[[], None]) -> None:
    try:
        release()
    except Exception:  # a worker ending must release everything else even when one release fails
        logger.debug("releasing a worker's resource failed", exc_info=True)
