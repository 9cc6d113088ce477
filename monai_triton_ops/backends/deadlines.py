"""One process-wide timer thread for request deadlines.

A sliding window sends hundreds of requests; a ``threading.Timer`` each would start hundreds of
threads. Here a single daemon thread sleeps until the earliest deadline, so a deadline costs a
heap entry and cancelling it (the request finished first) costs a flag.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Timer:
    """A scheduled callback; ``cancel()`` before it fires makes it a no-op."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Scheduler:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Call ``callback`` from the timer thread at ``time.monotonic() >= when``."""
        timer = Timer(when, callback)
        with self._wake:
            heapq.heappush(self._heap, (when, next(self._order), timer))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="monai-triton-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()
        return timer

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._wake.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._wake.wait(delay)
                    continue
                timer = heapq.heappop(self._heap)[2]
            if not timer.cancelled:
                try:
                    timer.callback()
                except Exception:  # a failing callback must not stop every other deadline
                    logger.exception("deadline callback failed")


_scheduler = _Scheduler()


def call_at(when: float, callback: Callable[[], None]) -> Timer:
    """Schedule ``callback`` at the monotonic time ``when``; returns a cancellable ``Timer``."""
    return _scheduler.at(when, callback)
