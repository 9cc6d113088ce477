"""A fleet's servers as the fleet sees them (:class:`Server`, :class:`State`), and :class:`Prober`, which runs
their probes off the request path.

Probes are blocking network calls (a readiness call, a TCP connect, a signature read: seconds, for an
address that does not answer), so they run on a one-thread pool of their own, never on a request's worker
nor on the process-wide deadline thread: that thread only queues a probe at its time. Each schedule of a
server supersedes the one before (a token), so a server has one probe coming at most, and an earlier time
(``expedite``) replaces a later one.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import time
from collections.abc import Callable

from ..deadlines import call_at
from ..status import CallError
from .endpoints import Address
from .protocol import UNKNOWN_SERVER, ServerInfo
from .transports.base import Transport
from .workers import Workers

_JOIN_TIMEOUT_S = 5.0


class State(enum.Enum):
    NEW = "new"
    UP = "up"
    SUSPECT = "suspect"
    DOWN = "down"
    EXCLUDED = "excluded"


class Server:
    """One server of a fleet: its address, its transport, and what the fleet knows of it (under the fleet's lock)."""

    def __init__(self, address: Address, transport: Transport) -> None:
        self.address = address
        self.transport = transport
        self.stale: list[Transport] = []  # replaced transports, closed once no attempt uses them
        self.state = State.NEW
        self.why = ""  # the last probe's or failure's reason, for logs and errors
        self.checked = False  # its signature matched the fleet's
        self.info: ServerInfo = UNKNOWN_SERVER  # what it speaks (protocol.py), learnt when it is first checked
        self.warned = False  # a WARNING said it is down: its return is logged too
        self.warned_model_down = False
        self.probe_delay_s = 0.0
        self.probe_at: float | None = None  # when its next probe is due (None: none scheduled)
        self.probe_token = 0
        self.in_flight = 0
        self.retired = False
        self.failed_at = 0.0

    @property
    def label(self) -> str:
        return self.address.label

    @property
    def capacity(self) -> int:
        """Attempts one request may make on it per round: a balanced name spreads them over its addresses."""
        return 2 if self.address.balanced else 1

    def __repr__(self) -> str:
        return f"Server({self.label}, {self.state.value})"


class Prober:
    """Runs ``probe(server)`` for servers at their time, one at a time, on a thread of its own."""

    def __init__(self, name: str, probe: Callable[[Server], None]) -> None:
        self._probe = probe
        self._workers = Workers(name, 1)

    def schedule(self, server: Server, delay_s: float) -> None:
        """Probe ``server`` in ``delay_s`` (replacing any probe already scheduled). Call under the fleet's lock."""
        server.probe_token += 1
        server.probe_at = time.monotonic() + delay_s
        call_at(server.probe_at, functools.partial(self._queue, server, server.probe_token))

    def expedite(self, server: Server) -> None:
        """Probe now, unless a probe is due now anyway. Call under the fleet's lock."""
        if server.probe_at is None or server.probe_at > time.monotonic():
            self.schedule(server, 0.0)

    def _queue(self, server: Server, token: int) -> None:
        """On the deadline thread: only a queue put (a superseded schedule does nothing)."""
        if token != server.probe_token:
            return
        with contextlib.suppress(CallError):  # closing
            self._workers.submit(self._run, (server, token))

    def _run(self, job: tuple[Server, int]) -> None:
        server, token = job
        if token == server.probe_token:
            server.probe_at = None
            self._probe(server)

    def submit(self, job: Callable[[], None]) -> None:
        """Another job for the probing thread (resolving names again); refused quietly once stopped."""
        with contextlib.suppress(CallError):  # closing
            self._workers.submit(lambda _: job(), None)

    def stop(self) -> None:
        self._workers.stop(join_timeout_s=_JOIN_TIMEOUT_S)
