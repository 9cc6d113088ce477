"""The servers a fleet's endpoints stand for now, and their transports: the part of a fleet that does not judge.

:class:`Members` holds every :class:`~.health.Server` the spec's endpoints stand for (a name of a headless
Service stands for every ready pod, ``endpoints.addresses_of``), each with a transport of its own
(``client.transports.connect``). Names are resolved again every ``resolve_interval_s`` on the probing thread: an
address that appears is a new server (probed at once), one that is gone is retired. A transport is closed
once no attempt uses it (``take`` / ``give_back``): a retired server's, or one replaced because its gRPC
channel kept failing while the server accepted connections (gRPC would wait out its own reconnect backoff).

Which of them takes a request, and their health, is the fleet's (``fleet.py``): a fleet has its members, and gives
them its probe (run on the members' probing thread) and what to do under the lock when servers come or go.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...client.endpoints import Address, Endpoint, Resolver, addresses_of, is_name, resolve
from ...client.status import CallError, to_public
from ...client.timeouts import CONTROL_TIMEOUT_S
from ...client.transports import connect
from ...client.transports.base import Transport, TransportSettings
from ...client.workers import Workers
from ...errors import ConfigError, MonaiTritonError
from .health import Prober, Server, State
from .options import RemoteOptions
from .protocol import STATISTICS

logger = logging.getLogger(__name__)


class Members:
    """Every server of one backend's model and its transport; thread-safe.

    ``lock`` is the fleet's one lock too: ``all`` (every server, retired ones until their last attempt ends) is
    read and changed under it, and so are the servers' states. ``probe(server)`` runs on the probing thread
    (``prober``); ``changed()`` runs under the lock after servers were retired.
    """

    def __init__(
        self,
        model: str,
        origins: Sequence[Endpoint],
        settings: TransportSettings,
        workers: Workers,
        options: RemoteOptions,
        *,
        probe: Callable[[Server], None],
        changed: Callable[[], None],
        resolver: Resolver = resolve,
    ) -> None:
        self.model = model
        self._origins = tuple(origins)
        self.settings = settings
        self._workers = workers
        self._options = options
        self._resolver = resolver
        self._changed = changed
        self.lock = threading.Lock()
        self.all: list[Server] = []  # changed in place only
        # One probing thread per fleet in this process, whichever models it serves (health.Prober).
        share = ("probe", tuple(o.url for o in self._origins), settings)
        self.prober = Prober(f"probe-{','.join(o.address for o in self._origins)}", probe, share=share)
        self.closed = False
        self._names = any(is_name(o) for o in self._origins)  # resolved again from time to time
        self._resolve_at = 0.0
        self._resolving = False
        for origin in self._origins:
            for address in addresses_of(origin, resolver):
                self._add(address)
        self._resolve_at = time.monotonic() + options.resolve_interval_s

    @property
    def servers(self) -> list[Server]:
        """The servers not retired."""
        with self.lock:
            return [s for s in self.all if not s.retired]

    @property
    def label(self) -> str:
        """How errors name the fleet: its one server, or its spec entries."""
        servers = self.servers
        if len(servers) == 1:
            return servers[0].label
        return ",".join(o.url for o in self._origins)

    def only_server(self) -> Server | None:
        """The one server, when the fleet is one address (shared memory is possible only then)."""
        servers = self.servers
        if len(servers) == 1 and not servers[0].address.balanced:
            return servers[0]
        return None

    @property
    def any_thread(self) -> bool:
        """Whether any thread may make an attempt (gRPC): the servers share the spec's one scheme, so one answer."""
        return all(s.transport.any_thread for s in self.servers)

    def pin(self) -> None:
        """Resolve no name again: the fleet stays this one server (its shared memory regions are registered there)."""
        self._names = False

    @property
    def resolves(self) -> bool:
        """Whether a name of the spec is resolved again from time to time."""
        return self._names

    def resolve_if_due(self) -> None:
        """On the request path: names resolved again on the probing thread, once ``resolve_interval_s`` passed."""
        if self._names and time.monotonic() >= self._resolve_at:
            self._resolve_later()

    def take(self, server: Server) -> Transport:
        """The server's transport for one attempt; ``give_back(server)`` when the attempt is over."""
        with self.lock:
            server.in_flight += 1
            return server.transport

    def give_back(self, server: Server) -> None:
        """An attempt is over: a retired or replaced transport is closed once no attempt uses it."""
        with self.lock:
            server.in_flight -= 1
            stale = self._unused_stale(server)
            if server.retired and server.in_flight == 0:
                stale.append(server.transport)
        for old in stale:
            old.close()

    def schedule(self, server: Server, delay_s: float) -> None:
        """A probe of ``server`` in ``delay_s`` (none for a retired or excluded one, or once closed)."""
        with self.lock:
            if not (self.closed or server.retired or server.state is State.EXCLUDED):
                self.prober.schedule(server, delay_s)

    def reconnect(self, server: Server) -> None:
        """A new channel: gRPC keeps failing calls fast until its own reconnect backoff ends, whatever the server.
        (gRPC only: its tensors are binary whatever the server, so nothing learnt at the check is lost.)"""
        transport = connect(server.address.endpoint, self.settings, self._workers, balanced=server.address.balanced)
        with self.lock:
            server.stale.append(server.transport)
            server.transport = transport
            stale = self._unused_stale(server)
        for old in stale:
            old.close()
        logger.debug("model %r: %s reconnected", self.model, server.label)

    @staticmethod
    def _unused_stale(server: Server) -> list[Transport]:
        """(under the lock) The replaced transports no attempt uses any more, taken from the server."""
        if server.in_flight:
            return []
        stale, server.stale = server.stale, []
        return stale

    def _resolve_later(self) -> None:
        with self.lock:
            if self._resolving or self.closed:
                return
            self._resolving = True
            self._resolve_at = time.monotonic() + self._options.resolve_interval_s
        self.prober.submit(self.resolve)

    def resolve(self) -> None:
        """Resolve every name again: new addresses become NEW servers (probed now), vanished ones are retired."""
        try:
            wanted = {a.key: a for origin in self._origins for a in addresses_of(origin, self._resolver)}
            with self.lock:
                have = {s.address.key: s for s in self.all if not s.retired}
                gone = [s for key, s in have.items() if key not in wanted]
                for server in gone:
                    server.retired = True
                    server.state = State.EXCLUDED
                self._changed()
                self.all[:] = [s for s in self.all if not (s.retired and s.in_flight == 0)]
            for server in gone:
                logger.info("model %r: %s is no longer an address of its name; dropped", self.model, server.label)
                if server.in_flight == 0:
                    server.transport.close()
            for key, address in wanted.items():
                if key not in have:
                    server = self._add(address)
                    logger.info("model %r: new server %s; checking it", self.model, server.label)
                    self.schedule(server, 0.0)
        finally:
            self._resolving = False

    def _add(self, address: Address) -> Server:
        server = Server(address, connect(address.endpoint, self.settings, self._workers, balanced=address.balanced))
        with self.lock:
            self.all.append(server)
        return server

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics of the model on every server: ``model_stats`` entries, each with its ``server``.

        One server: its error is the caller's. Several: a server that cannot say is an entry with its ``error``.
        """
        entries: list[dict[str, Any]] = []
        servers = self.servers
        for server in servers:
            try:
                stats = self._statistics_of(server)
            except MonaiTritonError as exc:
                if len(servers) == 1:
                    raise
                entries.append({"server": server.label, "error": str(exc)})
                continue
            entries += [{**entry, "server": server.label} for entry in stats.get("model_stats", [])]
        return {"model_stats": entries}

    def _statistics_of(self, server: Server) -> dict[str, Any]:
        if server.checked and not server.info.has(STATISTICS):  # an Open Inference Protocol server has none
            raise ConfigError(f"model {self.model!r} on {server.label}: no statistics: {server.info.lacks(STATISTICS)}")
        try:
            return server.transport.statistics(self.model, timeout_s=CONTROL_TIMEOUT_S)
        except CallError as exc:
            raise to_public(exc, model=self.model, url=server.label) from exc

    def end_calls(self) -> None:
        """Every server's inference calls still out end now (``Transport.end_calls``); control calls still work."""
        with self.lock:
            transports = [t for s in self.all for t in (s.transport, *s.stale)]
        for transport in transports:
            transport.end_calls()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            servers = list(self.all)
            self.all.clear()
        self.prober.stop()
        for server in servers:
            for transport in [server.transport, *server.stale]:
                transport.close()
