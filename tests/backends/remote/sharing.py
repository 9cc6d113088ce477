"""Two models of one process on the same server or fleet: what this process holds, read from the kernel.

``connections_to(port)`` counts this process's own established TCP connections to a port (its sockets' inodes in
``/proc/self/fd`` matched against ``/proc/self/net/tcp``: another process's connections never count);
``probing_threads()`` counts the fleets' probing threads by their names. ``two_models_share_and_close_apart``
is the scenario both the one-server and the fleet tests run.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from monai_triton_ops import create_backend
from monai_triton_ops.backends.base import BaseBackend
from monai_triton_ops.backends.remote.health import PROBING
from monai_triton_ops.client.transports.http import POOLS

from ...server.conftest import wait_until

#: At most this many connections per server for one process whose requests go one at a time: gRPC's one (its
#: channels share a subchannel); HTTP's one pool thread, with its inference client and its control client.
MOST = {"grpc": 1, "http": 2}


def _own_sockets() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def connections_to(port: int) -> int:
    """This process's ESTABLISHED TCP connections whose remote port is ``port``."""
    mine, count = _own_sockets(), 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01" and fields[9] in mine:
                count += 1
    return count


def _threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


def probing_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("probe-"))


def counts() -> dict[str, int]:
    """Open files and threads (regions apart: test_leaks' snapshot does the same)."""
    gc.collect()
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count()}


def _exact(backend: BaseBackend, x: np.ndarray, count: int) -> None:
    for i in range(count):
        np.testing.assert_array_equal(backend.infer({"INPUT__0": x + i}, timeout_s=60)["OUTPUT__0"], x + i)


def two_models_share_and_close_apart(
    spec: str,
    fast: str,
    slow: str,
    ports: Sequence[int],
    scheme: str,
    settled: Callable[[], bool],
    *,
    fast_shape: tuple[int, ...] = (8,),
) -> None:
    """``fast`` and ``slow`` opened on ``spec``: both exact, one connection (pool) per server and one probing
    thread; ``slow`` closed with two requests in flight cuts off only those; ``fast`` still answers, still over
    one connection per server; ``fast`` closed: ``settled()`` (the caller's flat check) holds."""
    x = np.arange(8, dtype=np.float32)
    y = np.arange(8, dtype=np.float32).reshape(fast_shape)
    first = create_backend(spec, fast).open()
    second = create_backend(spec, slow).open()
    try:
        for _ in range(2):
            _exact(first, y, 3)
            _exact(second, x, 1)
        for port in ports:
            assert connections_to(port) <= MOST[scheme], (port, connections_to(port), _threads())
        assert probing_threads() == 1
        cut = [second.submit({"INPUT__0": x + i}) for i in range(2)]
        assert wait_until(lambda: second.in_flight == 2, 10.0)
        second.close(timeout_s=0)
        for i, future in enumerate(cut):  # answered before the close, or failed by it: never lost silently
            if future.exception(timeout=60) is None:
                np.testing.assert_array_equal(future.result()["OUTPUT__0"], x + i)
        _exact(first, y, 4)  # its own requests untouched by the other's close
        for port in ports:
            assert connections_to(port) <= MOST[scheme], (port, connections_to(port))
    finally:
        second.close(timeout_s=0)
        first.close()
    assert probing_threads() == 0
    assert wait_until(lambda: not len(POOLS) and not len(PROBING), 10.0), (len(POOLS), len(PROBING))
    assert settled()
