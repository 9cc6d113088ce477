"""Fixtures of the remote backend's unit tests: an in-memory stand-in for a server (``memory.py``), no process.

Every test here runs in ``make test-fast`` (no ``triton`` marker): real threads, real shared memory in ``/dev/shm``,
the stand-in server on the other side of the transport interface. Races are provoked by switching threads often
(``sys.setswitchinterval``), never by sleeping.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from .memory import MemoryServer, MemoryTransport


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    stand_in = MemoryServer()
    yield stand_in
    stand_in.close()


@pytest.fixture
def transport(server: MemoryServer) -> MemoryTransport:
    return MemoryTransport(server)


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Threads switch every microsecond instead of every 5 ms: a check-then-act race shows within a few hundred
    rounds instead of hiding behind the interpreter's time slice."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)
