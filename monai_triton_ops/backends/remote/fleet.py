"""The servers of one remote backend: which one takes the next attempt, which ones are down, and probing them back.

A fleet is every :class:`~.endpoints.Address` the spec's endpoints stand for (a name of a headless
Service stands for every ready pod), each a :class:`Server` with a transport of its own. Each server is::

    NEW       not checked yet (not ready at open, or an address a name gained): probed, then used once
              it is ready and serves the same model (signature, version, metadata)
    UP        ready, same model: takes requests, round robin
    SUSPECT   a request failed on it (connection lost, unavailable): not picked while another server is
              up; probed after ``probe_backoff_s`` (UP again at once when ready: a full queue passes)
    DOWN      a probe found it not ready, and why (refused, loading...): logged once, probed with backoff
              doubling up to ``max_probe_backoff_s``, UP again once a probe finds it ready
    EXCLUDED  it serves another model, or one this backend's options or local config.pbtxt contradict:
              never used (logged as an error)

Every server is described on its own when first found ready (``protocol.describe_model``): what it speaks
(Triton's extensions, or the bare Open Inference Protocol), and so where its signature comes from and
whether its HTTP tensors go binary; every server is reached with the backend's one set of TLS material
and headers, and a TLS failure with any of them is told apart from a server that is down (``health.py``).

Probes run off the request path (``health.Prober``); when no server is up, every server not up is probed at
once. Which servers there are (names resolved again, servers retired) and their transports (replaced, closed
once no attempt uses them) are the fleet's :class:`~.members.Members` (``fleet.members``: ``take`` and
``give_back`` a server's transport, ``statistics``, ``end_calls``, ``close``); the fleet judges them.

``pick(tried)`` is the request path's one question: an UP server this request has not tried, round
robin; when no server is up, a SUSPECT or DOWN one that was checked (the request is then the probe: a
lone server is retried as before); else ``None``, and the caller backs off or gives up.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from ...client.endpoints import Endpoint, Resolver, resolve
from ...client.status import CallError, Status, to_public
from ...client.timeouts import CONTROL_TIMEOUT_S
from ...client.transports.base import TransportSettings
from ...client.workers import Workers
from ...errors import ConfigError, MonaiTritonError
from ...signature import ModelSignature
from . import health
from .health import Server, State
from .members import Members
from .options import RemoteOptions
from .protocol import Served, describe_model, mismatch

logger = logging.getLogger(__name__)

#: Statuses after which a request goes to another server: the server, not the request, failed.
FAILOVER = frozenset({Status.UNAVAILABLE, Status.MODEL_DOWN})

#: One round-robin turn per set of origins, shared by every fleet over them in this process. An ensemble's members
#: (one backend each) send a window batch's requests together; turns of their own advance in step, so every
#: member's request went to the same server (measured: 4 of 5 on one, benchmarks/bench_ensemble.py).
_TURNS: dict[tuple[Endpoint, ...], itertools.count[int]] = {}
_TURNS_LOCK = threading.Lock()


def shared_turn(origins: Sequence[Endpoint]) -> itertools.count[int]:
    """The round-robin counter of every fleet over ``origins`` in this process (made by the first)."""
    with _TURNS_LOCK:
        return _TURNS.setdefault(tuple(origins), itertools.count())


#: Reads a ready server's model instead of ``describe_model`` (whole-volume mode: ``volume.py``).
Describe = Callable[[Server], Served]


class Fleet:
    """Every server of one backend's model, their health, and the choice; thread-safe. See the module docstring."""

    def __init__(
        self,
        model: str,
        version: int | None,
        origins: Sequence[Endpoint],
        settings: TransportSettings,
        workers: Workers,
        options: RemoteOptions,
        *,
        repository: str | Path | None = None,
        resolver: Resolver = resolve,
        describe: Describe | None = None,
    ) -> None:
        self._describe = describe  # how a ready server's model is read; default: describe_model
        self.version = version
        self._repository = repository  # the caller's: a local config.pbtxt each server is compared with
        self._up: tuple[Server, ...] = ()  # the servers UP now, rebuilt under the lock on every change of state
        self._turn = shared_turn(origins)  # the servers' turn, not this model's: see shared_turn
        self._rounds = 0
        self.signature: ModelSignature | None = None
        self._strict = True  # compare version and metadata too (not against a fallback's local signature)
        self.model = model
        self._options = options
        self.members = Members(
            model, origins, settings, workers, options, probe=self._probe, changed=self._refresh_up, resolver=resolver
        )
        self._lock = self.members.lock  # one lock: the members' list and the servers' states change together
        self._servers = self.members.all  # the same list, changed in place only (read under the lock)
        self._prober = self.members.prober

    @property
    def servers(self) -> list[Server]:
        """The servers not retired."""
        return self.members.servers

    def usable(self) -> bool:
        """Whether a server is up, or failed a request without a probe confirming it down yet."""
        with self._lock:
            return any(s.state in (State.UP, State.SUSPECT) for s in self._servers if not s.retired)

    def describe(self) -> str:
        """Every server with its state and reason, for errors."""
        with self._lock:
            return "; ".join(f"{s.label} {s.state.value}{f' ({s.why})' if s.why else ''}" for s in self._servers)

    def open(self, timeout_s: float) -> ModelSignature:
        """Wait (visibly) until a server is ready; check every ready server serves the same model; probe the rest."""
        found = health.wait_until_any_ready(self._probe_round, self.model, timeout_s=timeout_s)
        ready = [s for s in self.servers if found.get(s.label, health.Probe(health.Reason.NOT_READY)).ready]
        signatures = {s.label: self._read_signature(s) for s in ready}
        first, reference = next(iter(signatures.items()))
        for label, signature in signatures.items():
            found_differences = mismatch(reference, signature, strict=True, names=(first, label))
            if found_differences:
                raise ConfigError(
                    f"model {self.model!r}: the servers do not serve the same model: {label} differs from "
                    f"{first}: " + "; ".join(found_differences)
                )
        self.signature = reference
        waiting = []
        with self._lock:
            for server in self._servers:
                if server in ready:
                    server.state, server.checked = State.UP, True
                    self._up += (server,)
                else:
                    server.why = str(found.get(server.label, "not probed yet"))
                    server.warned = True
                    waiting.append(server)
        if waiting:
            logger.warning(
                "model %r: %d of %d servers ready; not yet: %s; they are probed in the background and used once "
                "ready with the same model",
                self.model,
                len(ready),
                len(ready) + len(waiting),
                "; ".join(f"{s.label} {s.why}" for s in waiting),
            )
            for server in waiting:
                self.members.schedule(server, self._options.probe_backoff_s)
        return reference

    def adopt(self, signature: ModelSignature) -> None:
        """No server was ready at open (a fallback runs the model): check servers against ``signature`` as they come."""
        self.signature = signature
        self._strict = False
        for server in self.servers:
            server.warned = True
            self.members.schedule(server, 0.0)

    def _probe_round(self, remaining_s: float) -> dict[str, health.Probe]:
        self._rounds += 1
        if self.members.resolves and self._rounds > 1:  # a headless Service gains its first ready pod while we wait
            self.members.resolve()
        found: dict[str, health.Probe] = {}
        end = time.monotonic() + remaining_s
        for server in self.servers:
            left = end - time.monotonic()
            if left <= 0:
                break
            if self._rounds == 1:  # TLS before any call: a refusal is a ConfigError now, not a wait (health.py)
                handshake_s = min(health.PROBE_TIMEOUT_S, left)
                health.check_tls(server.address.endpoint, self.members.settings.credentials, handshake_s)
            found[server.label] = self._probe_server(server, left)
        return found

    def _probe_server(self, server: Server, timeout_s: float) -> health.Probe:
        credentials = self.members.settings.credentials
        return health.probe(
            server.transport, server.address, self.model, self.version, timeout_s=timeout_s, credentials=credentials
        )

    def _read_signature(self, server: Server) -> ModelSignature:
        """The server described (protocol.py): its signature, checked against a local config.pbtxt, and what it
        speaks, which its transport follows (binary HTTP tensors or JSON)."""
        if self._describe is not None:
            served = self._describe(server)
        else:
            served = describe_model(
                server.transport,
                self.model,
                self.version,
                timeout_s=CONTROL_TIMEOUT_S,
                repository=self._repository,
                max_batch_size=self._options.max_batch_size,
            )
        server.info = served.server
        server.transport.use_binary_tensors(served.server.binary_tensors)
        return served.signature

    def pick(self, tried: Counter[Server]) -> Server | None:
        """The server for a request's next attempt (see the module docstring), or ``None``."""
        self.members.resolve_if_due()
        first = self._up  # a first attempt, the common case: no lock, one read
        if first and not tried:
            return first[next(self._turn) % len(first)]
        with self._lock:
            live = [s for s in self._servers if not s.retired]
            untried = [s for s in self._up if tried[s] < s.capacity]
            if untried:
                return untried[next(self._turn) % len(untried)]
            if self._up:
                return None
            fallen = [s for s in live if s.state in (State.SUSPECT, State.DOWN) and s.checked and tried[s] < s.capacity]
            return min(fallen, key=lambda s: s.failed_at) if fallen else None

    def failed(self, server: Server, error: CallError) -> None:
        """A request's attempt failed on ``server`` with a status in ``FAILOVER``: others take requests first."""
        with self._lock:
            if error.status is Status.MODEL_DOWN and not server.warned_model_down:
                server.warned_model_down = True
                logger.warning(
                    "model %r on %s: %s; requests go to the other servers",
                    self.model,
                    server.label,
                    to_public(error, model=self.model, url=server.label),
                )
            server.failed_at = time.monotonic()
            server.why = f"{error.status.value}: {error.message}"
            if server.state is State.UP:
                server.state = State.SUSPECT
                self._refresh_up()
                logger.debug("model %r: %s suspect after %s", self.model, server.label, error)
            if server.state is State.EXCLUDED or self.members.closed:
                return
            if server.probe_at is None:
                self._prober.schedule(server, self._options.probe_backoff_s)
            if not any(s.state is State.UP for s in self._servers if not s.retired):
                for other in self._servers:  # nothing up: whatever is back is wanted now, not at its next probe
                    if other.state in (State.SUSPECT, State.DOWN, State.NEW) and not other.retired:
                        self._prober.expedite(other)

    def succeeded(self, server: Server) -> None:
        """A request got its answer from ``server``: it is up (a lone server that was retried comes back here)."""
        if server.state is State.UP:  # the common case, without the lock: a stale read only delays the next line
            return
        with self._lock:
            if server.state in (State.SUSPECT, State.DOWN) and server.checked:
                server.answered_at = time.monotonic()
                self._mark_up(server)

    def _mark_up(self, server: Server) -> None:
        """(under the lock)"""
        if server.warned:
            logger.info("model %r: %s is back (ready, same model); requests go to it again", self.model, server.label)
        server.state, server.why, server.warned, server.probe_delay_s = State.UP, "", False, 0.0
        self._refresh_up()

    def _refresh_up(self) -> None:
        """(under the lock)"""
        self._up = tuple(s for s in self._servers if s.state is State.UP and not s.retired)

    def _probe(self, server: Server) -> None:
        """On the probing thread: is the server ready (and the same model, the first time)? Up, or down and later.

        A request answered there while the probe ran is newer news than a "not ready" the probe brings back (requests
        were in flight on it when one failed): the server stays up."""
        if self.members.closed or server.retired:
            return
        began = time.monotonic()
        found = self._probe_once(server)
        if found.stale_connection and server.address.endpoint.protocol == "grpc":
            self.members.reconnect(server)  # the server answers a connection, the channel still waits out its backoff
            found = self._probe_once(server)
        with self._lock:
            if server.state is State.EXCLUDED:
                return
            if found.ready:
                self._mark_up(server)
                return
            if server.state is State.UP and server.answered_at >= began:
                return
            self._mark_down(server, found)
            if not self.members.closed and not server.retired:
                self._prober.schedule(server, server.probe_delay_s)

    def _probe_once(self, server: Server) -> health.Probe:
        try:
            found = self._probe_server(server, health.PROBE_TIMEOUT_S)
            if found.ready and not server.checked:
                self._check(server)
        except MonaiTritonError as exc:  # not (or no longer) serving the model, or a signature read failed
            return health.Probe(health.Reason.NOT_READY, str(exc))
        return found

    def _mark_down(self, server: Server, found: health.Probe) -> None:
        """(under the lock)"""
        server.why = str(found)
        server.probe_delay_s = min(
            self._options.max_probe_backoff_s, max(self._options.probe_backoff_s, 2 * server.probe_delay_s)
        )
        if server.state is not State.DOWN and not server.warned:
            others = sum(1 for s in self._servers if s.state is State.UP and not s.retired)
            where = f"requests go to the {others} other server(s)" if others else "no server of the model is up"
            logger.warning(
                "model %r: %s is down: %s; %s; probing it again every %g s at most",
                self.model,
                server.label,
                found,
                where,
                self._options.max_probe_backoff_s,
            )
            server.warned = True
        if server.state is not State.NEW:
            server.state = State.DOWN
            self._refresh_up()

    def _check(self, server: Server) -> None:
        """A server found ready for the first time: the same model as the fleet's, or excluded for good (also when
        the options or the local config.pbtxt contradict what it serves: a ``ConfigError`` describing it)."""
        try:
            signature = self._read_signature(server)
        except ConfigError as exc:
            self._exclude(server, f"what it serves does not fit this backend: {exc}")
            return
        reference = self.signature
        names = ("the fleet", server.label)
        found = [] if reference is None else mismatch(reference, signature, strict=self._strict, names=names)
        if found:
            self._exclude(server, "it serves another model: " + "; ".join(found))
            return
        with self._lock:
            server.checked = True
            if reference is None:
                self.signature = signature

    def _exclude(self, server: Server, why: str) -> None:
        with self._lock:
            server.state, server.why = State.EXCLUDED, why
            self._refresh_up()
        logger.error("model %r: %s is never used: %s", self.model, server.label, why)
