"""Output buffers lent to callers and reused once every array made from them is gone.

Triton writes each output into memory that the response allocator hands it. Fresh memory is costly
here: the kernel zeroes every page on first touch (measured on the 2-vCPU machine: 5.2 ms to fault in
8 MB, 0.3 ms to write the same 8 MB again), and the in-process backend paid that on every output. So
buffers are kept and reused, and the contract's ownership rule still holds: a buffer is *lent* as one
array (the lease, the first ndarray over it), every array made from an output is a view of that lease
(numpy points each view's ``base`` at it), and the buffer serves no other output until the lease and
all its views are gone (a finaliser on the lease gives it back). A caller that keeps its results
simply keeps their buffers; one that drops them (a sliding window blends and drops each window) gets
the same few buffers back window after window.

    pool = BufferPool()
    lease = pool.lend(8 << 20)  # uint8, exactly the size asked; writable; the caller's until dropped
"""

from __future__ import annotations

import threading
import weakref
from collections import deque

import numpy as np

#: Idle buffers kept for reuse, at most this many and this many bytes together (the oldest go first).
MAX_IDLE_BUFFERS = 16
MAX_IDLE_BYTES = 512 << 20
#: An idle buffer serves a request of at least 1/WASTE of its size (a small output never pins a big buffer).
WASTE = 2


class BufferPool:
    """Thread-safe: ``lend`` from any thread; leases come back from whichever thread drops them last."""

    def __init__(self, *, max_idle_buffers: int = MAX_IDLE_BUFFERS, max_idle_bytes: int = MAX_IDLE_BYTES) -> None:
        self._max_idle_buffers = max_idle_buffers
        self._max_idle_bytes = max_idle_bytes
        self._lock = threading.Lock()
        self._idle: list[np.ndarray] = []  # oldest first
        self._returned: deque[np.ndarray] = deque()  # appended by finalisers on any thread, drained under the lock
        self.created = 0  # buffers allocated so far (tests and benchmarks read it)

    def lend(self, byte_size: int) -> np.ndarray:
        """A writable uint8 array of ``byte_size`` bytes over a buffer nobody else holds."""
        buffer = self._reuse(byte_size)
        if buffer is None:
            buffer = np.empty(byte_size, dtype=np.uint8)
            with self._lock:
                self.created += 1
        # A memoryview between buffer and lease: numpy stops its base chain at the first ndarray over a
        # non-ndarray, so every view of the lease keeps the lease (not the pooled buffer) alive.
        lease = np.frombuffer(memoryview(buffer.data), dtype=np.uint8, count=byte_size)
        weakref.finalize(lease, self._returned.append, buffer)
        return lease

    @property
    def idle(self) -> int:
        """Buffers waiting to be lent again."""
        with self._lock:
            self._drain()
            return len(self._idle)

    def clear(self) -> None:
        """Forget the idle buffers (leases still out come back and are kept within the bounds)."""
        with self._lock:
            self._drain()
            self._idle.clear()

    def _reuse(self, byte_size: int) -> np.ndarray | None:
        with self._lock:
            self._drain()
            fitting = [
                i for i, b in enumerate(self._idle) if byte_size <= b.nbytes <= max(byte_size * WASTE, byte_size + 4096)
            ]
            if not fitting:
                return None
            best = min(fitting, key=lambda i: self._idle[i].nbytes)
            return self._idle.pop(best)  # by position: ``list.remove`` would compare arrays element-wise

    def _drain(self) -> None:
        """Returned buffers become idle; past the bounds the oldest idle ones go (lock held)."""
        while self._returned:
            self._idle.append(self._returned.popleft())
        while self._idle and (
            len(self._idle) > self._max_idle_buffers or sum(b.nbytes for b in self._idle) > self._max_idle_bytes
        ):
            self._idle.pop(0)
