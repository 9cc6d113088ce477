"""One process-wide timer thread for request deadlines.

A sliding window sends hundreds of requests; a ``threading.Timer`` each would start hundreds of
threads. Here a single daemon thread sleeps until the earliest deadline, so a deadline costs a
heap entry and cancelling it (the request finished first) costs a flag. The thread is woken only
when a new deadline is the earliest (each wake-up takes the GIL from the threads doing the work),
a cancelled timer lets go of its callback at once (which holds the request and its inputs), and
cancelled entries are swept out whenever the heap has doubled since the last sweep.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Heap size at which cancelled entries are first swept out.
_FIRST_SWEEP = 1024


class Timer:
    """A scheduled callback; ``cancel()`` before it fires makes it a no-op."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.callback = _nothing  # the heap may keep this entry until its time: it must hold nothing


def _nothing() -> None:
    pass


class _Scheduler:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._sweep_at = _FIRST_SWEEP

    def at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Call ``callback`` from the timer thread at ``time.monotonic() >= when``."""
        timer = Timer(when, callback)
        with self._wake:
            if len(self._heap) >= self._sweep_at:
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._sweep_at = max(_FIRST_SWEEP, 2 * len(self._heap))
            earliest = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, next(self._order), timer))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="monai-triton-deadlines", daemon=True)
                self._thread.start()
            elif earliest:  # the thread sleeps until the earliest deadline: a later one needs no wake-up
                self._wake.notify()
        return timer

    def __len__(self) -> int:
        with self._wake:
            return len(self._heap)

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
