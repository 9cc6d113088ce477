"""Is a server healthy for the model, and if not, why: the probe of one server, the visible wait at open, each
server's state as a fleet sees it (:class:`Server`, :class:`State`), and :class:`Prober`, which runs the
fleet's probes off the request path.

A probe tells apart what an operator does something different about::

    refused      the connection was refused: nothing listens there (server down or restarting, wrong port)
    unreachable  no route to the host, or no answer to a connection (host down, a firewall)
    no name      the name does not resolve (a headless Service with no ready pod has no record)
    not ready    the server answers, the model is not ready; the repository index says its state
    loading      ... and the state is LOADING
    no answer    a connection, but no answer within the probe's deadline

The reason comes from the server's answers (readiness, repository index) and, when a call finds no
server, from a plain TCP connect's errno: never from message text. A server that answers definitively
(no such model or version, a model that failed to load) is an error at once, as with one server.

A TLS server (``grpcs://``, ``https://``) whose calls fail while something listens on its port gets one
TLS handshake of our own (``client.tls.check_handshake``): gRPC reports an untrusted certificate or a refused
client certificate as ``UNAVAILABLE``, the word it also has for a server that is down, so without it a
TLS problem would be waited out as "not ready". A handshake that fails is a ``ConfigError`` naming the
server: at open it fails the open at once (the first round of probes, or a later one when the server
came up meanwhile); on a fleet's later probes it is the reason that server stays down. The first round
at open shakes hands with every TLS server before any call (:func:`check_tls`), so the first thing the
server sees is our own handshake and its refusal is told at once.

At open, :func:`wait_until_any_ready` probes every server in rounds until one is ready, within
``ready_timeout_s``, and says so at the default log level (WARNING) while it waits: which servers,
why each is not ready, and how long it will still wait; at once, then every ``WAIT_LOG_S``.
The final error names each server with its reason, so refused and loading are told apart.

Probes are blocking network calls (a readiness call, a TCP connect, a signature read: seconds, for an
address that does not answer), so :class:`Prober` runs them on a one-thread pool (one per fleet in the
process, shared by the models on it), never on a request's worker nor on the process-wide deadline thread:
that thread only queues a probe at its time. Each schedule of a server supersedes the one before (a token),
so a server has one probe coming at most, and an earlier time (``expedite``) replaces a later one.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...client.credentials import Credentials
from ...client.endpoints import Address, Endpoint
from ...client.shared import Shared
from ...client.status import CallError, Status, to_public
from ...client.tls import check_handshake
from ...client.transports.base import Transport
from ...client.workers import JOIN_TIMEOUT_S, Workers
from ...errors import ModelLoadError, ModelNotFoundError, ServerUnavailableError
from ..deadlines import call_at
from .protocol import UNKNOWN_SERVER, ServerInfo

logger = logging.getLogger(__name__)

#: One probe's deadline (each call of it); the whole wait has the caller's deadline.
PROBE_TIMEOUT_S = 2.0
#: How often the wait at open says it is still waiting.
WAIT_LOG_S = 10.0
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 1.0
#: Repository states in which a model may still become ready.
_PENDING_STATES = frozenset({"LOADING", "UNLOADING", "READY", ""})


class Reason(enum.Enum):
    READY = "ready"
    REFUSED = "connection refused"
    UNREACHABLE = "unreachable"
    NO_NAME = "name does not resolve"
    NOT_READY = "not ready"
    LOADING = "model loading"
    NO_ANSWER = "no answer"


@dataclass(frozen=True)
class Probe:
    """What one probe found: the kind of reason, and the words for a person."""

    reason: Reason
    detail: str = ""
    #: The server accepts connections, yet the call found none: a gRPC channel still in its reconnect backoff.
    stale_connection: bool = False

    @property
    def ready(self) -> bool:
        return self.reason is Reason.READY

    def __str__(self) -> str:
        return f"{self.reason.value} ({self.detail})" if self.detail else self.reason.value


def probe(
    transport: Transport,
    address: Address,
    model: str,
    version: int | None,
    *,
    timeout_s: float,
    credentials: Credentials | None = None,
) -> Probe:
    """Whether ``model`` is ready on the server at ``address``, and if not, why (see the module docstring).

    Raises ``ModelNotFoundError`` or ``ModelLoadError`` when the server says the model can never be ready,
    ``ConfigError`` when TLS with it fails (``credentials``: what the transport was given).
    """
    timeout_s = max(0.05, min(PROBE_TIMEOUT_S, timeout_s))
    try:
        if transport.is_model_ready(model, _version(version), timeout_s=timeout_s):
            return Probe(Reason.READY)
        try:
            index = transport.repository_index(timeout_s=timeout_s)
        except CallError as exc:  # an Open Inference Protocol server has no repository index
            if exc.status in (Status.UNSUPPORTED, Status.NOT_FOUND):
                # Its model metadata then says whether the model is there at all (KServe answers the HTTP
                # readiness of a model it does not have with a bare 404, over gRPC with NOT_FOUND).
                transport.model_metadata(model, _version(version), timeout_s=timeout_s)
                return Probe(Reason.NOT_READY, "the server has no repository index to say why")
            raise
        state = never_ready(index, model, version, address.label)
        kind = Reason.LOADING if state == "LOADING" else Reason.NOT_READY
        return Probe(kind, f"state {state or 'unknown'}")
    except CallError as exc:
        if exc.status is Status.DEADLINE:
            return Probe(Reason.NO_ANSWER, f"nothing within {timeout_s:.3g} s")
        if exc.status is not Status.UNAVAILABLE:
            raise to_public(exc, model=model, url=address.label) from exc
        return _why_unavailable(address, exc, timeout_s, credentials)


def _why_unavailable(address: Address, error: CallError, timeout_s: float, credentials: Credentials | None) -> Probe:
    """A call found no server: a TCP connect says why (by errno); a server that accepts it answered "not ready",
    unless TLS with it fails (a ``ConfigError``)."""
    endpoint = address.endpoint
    if address.balanced or endpoint.port is None:
        check_tls(endpoint, credentials, timeout_s)
        return Probe(Reason.NOT_READY, error.message)
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s):
            pass
    except socket.gaierror as exc:
        return Probe(Reason.NO_NAME, f"{endpoint.host}: {exc.strerror or exc}")
    except TimeoutError:
        return Probe(Reason.UNREACHABLE, f"no answer to a connection within {timeout_s:.3g} s")
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            return Probe(Reason.REFUSED, f"nothing listens on {endpoint.address}")
        return Probe(Reason.UNREACHABLE, exc.strerror or str(exc))
    check_tls(endpoint, credentials, timeout_s)
    return Probe(Reason.NOT_READY, f"the server answers: {error.message}", stale_connection=True)


def check_tls(endpoint: Endpoint, credentials: Credentials | None, timeout_s: float) -> None:
    """A TLS problem with ``endpoint`` says so (``ConfigError``) instead of "not ready"; quiet for a plaintext
    endpoint, a good handshake, or nothing to shake hands with (the probe says why)."""
    if endpoint.tls and credentials is not None:
        check_handshake(endpoint, credentials, timeout_s=timeout_s)


def never_ready(index: Sequence[Mapping[str, Any]], model: str, version: int | None, where: str) -> str:
    """Raise when the index shows the model can never become ready; else its state (``LOADING``...)."""
    entries = [e for e in index if e.get("name") == model]
    if not entries:
        raise ModelNotFoundError(f"model {model!r} is not on {where}; the server has: {_listing(index)}")
    if version is not None:
        versioned = [e for e in entries if str(e.get("version", "")) == str(version)]
        if not versioned and any(e.get("state") == "READY" for e in entries):
            raise ModelNotFoundError(
                f"model {model!r} has no version {version} on {where}; it has: {_listing(entries)}"
            )
        entries = versioned or entries
    for entry in entries:
        state = str(entry.get("state", ""))
        if state not in _PENDING_STATES:
            reason = entry.get("reason") or "no reason given"
            raise ModelLoadError(f"model {model!r} is {state} on {where}: {reason}")
    states = sorted({str(e.get("state") or "") for e in entries})
    return "LOADING" if "LOADING" in states else ", ".join(s for s in states if s)


def _listing(index: Sequence[Mapping[str, Any]]) -> str:
    if not index:
        return "no models"
    items = []
    for entry in sorted(index, key=lambda e: (str(e.get("name")), str(e.get("version")))):
        version = f" version {entry['version']}" if entry.get("version") else ""
        items.append(f"{entry.get('name')}{version} ({entry.get('state') or 'unknown'})")
    return ", ".join(items)


#: One round of probes: every server probed in the time left -> what its probe found.
ProbeRound = Callable[[float], Mapping[str, Probe]]


def wait_until_any_ready(probe_round: ProbeRound, model: str, *, timeout_s: float) -> Mapping[str, Probe]:
    """Probe in rounds until at least one server is ready; the last round's findings, by server.

    Logs at WARNING while it waits (at once, then every ``WAIT_LOG_S``); raises ``ServerUnavailableError``
    naming every server and its reason when none is ready within ``timeout_s``.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    poll, next_log = _POLL_FIRST_S, started
    found: dict[str, Probe] = {}
    while True:
        found.update(probe_round(max(0.0, deadline - time.monotonic())))  # a server left unprobed keeps its last
        if any(p.ready for p in found.values()):
            if time.monotonic() - started > 1.0:
                logger.warning("model %r ready after %.1f s on %s", model, time.monotonic() - started, _ready(found))
            return found
        now = time.monotonic()
        if now >= deadline:
            raise ServerUnavailableError(_final(model, found, timeout_s))
        if now >= next_log:
            logger.warning(
                "waiting for model %r%s: %s; %.0f s left of ready_timeout_s=%g",
                model,
                "" if now - started < 1 else f" ({now - started:.0f} s so far)",
                describe(found),
                deadline - now,
                timeout_s,
            )
            next_log = now + WAIT_LOG_S
        time.sleep(max(0.0, min(poll, deadline - time.monotonic())))
        poll = min(2 * poll, _POLL_MAX_S)


def describe(found: Mapping[str, Probe]) -> str:
    """``grpc://a:8001 connection refused (nothing listens on a:8001); grpc://b:8001 model loading (...)``."""
    return "; ".join(f"{label} {probe}" for label, probe in found.items())


def _ready(found: Mapping[str, Probe]) -> str:
    return ", ".join(label for label, p in found.items() if p.ready)


def _final(model: str, found: Mapping[str, Probe], timeout_s: float) -> str:
    if len(found) == 1:
        ((label, only),) = found.items()
        return f"model {model!r} on {label} was not ready within {timeout_s:g} s (ready_timeout_s): {only}"
    return (
        f"model {model!r} was not ready on any of its {len(found)} servers within {timeout_s:g} s "
        f"(ready_timeout_s): {describe(found)}"
    )


def _version(version: int | None) -> str:
    return "" if version is None else str(version)


# -- a fleet's servers, and their probes off the request path ----------------------------------------


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
        self.answered_at = 0.0  # when a request last got its answer there while it was not up

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
    """Runs ``probe(server)`` for servers at their time, one at a time, on a probing thread.

    The thread is shared by every prober of the same ``share`` key (the fleet's servers and how they are spoken
    to: ``members.py``): the models of one process on one fleet probe on one thread, not one each. Once ``stop``
    is called this prober runs nothing more; the key's last prober stops the thread."""

    def __init__(self, name: str, probe: Callable[[Server], None], *, share: Hashable | None = None) -> None:
        self._probe = probe
        self._key: Hashable = share if share is not None else object()  # no key: a thread of its own
        self._workers = PROBING.acquire(self._key, lambda: Workers(name, 1))
        self._stopped = False
        self._stop_lock = threading.Lock()

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
        if token != server.probe_token or self._stopped:
            return
        with contextlib.suppress(CallError):  # closing
            self._workers.submit(self._run, (server, token))

    def _run(self, job: tuple[Server, int]) -> None:
        server, token = job
        if token == server.probe_token and not self._stopped:
            server.probe_at = None
            self._probe(server)

    def submit(self, job: Callable[[], None]) -> None:
        """Another job for the probing thread (resolving names again); refused quietly once stopped."""
        if self._stopped:
            return
        with contextlib.suppress(CallError):  # closing
            self._workers.submit(lambda _: None if self._stopped else job(), None)

    def stop(self) -> None:
        """Nothing more runs for this prober; the last one of its key stops the thread. Idempotent."""
        with self._stop_lock:
            stopped, self._stopped = self._stopped, True
        if not stopped:
            PROBING.release(self._key)


def _stop_thread(workers: Workers) -> None:
    workers.stop(join_timeout_s=JOIN_TIMEOUT_S)


#: The probing threads of this process, one per fleet (``client/shared.py``).
PROBING: Shared[Workers] = Shared("probing thread", _stop_thread)
