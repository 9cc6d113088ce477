"""``RemoteBackend``: a model served by Triton servers, over gRPC or HTTP (``grpc://``, ``http://``, TLS variants).

Open is ``opening.py``. A request, from the contract's queue to the wire (``docs/architecture.md`` draws it):

    _infer(request)    on a thread of the contract's pool (client/workers.py), or the caller's over gRPC:
                       the attempt loop below, bounded by the request's deadline and ``request.cancelled``
      fleet.pick(tried)                     the server for this attempt (fleet.py)
      exchange.send(transport, request)     one attempt: slot or body, one blocking call (client/transports/), outputs

The queue, the in-flight limit and the future are the contract's (``backends/flow.py``). A failure of the
server (``fleet.FAILOVER``) goes at once to another server this request has not tried; when every server has
been tried, a transient error waits its :class:`Backoff` (ended early by a cancel) and a new round starts
while ``retries`` and the deadline allow; an error the model reported, or the deadline, ends the loop; with
``fallback=torch`` a request no server can take runs in this process (``fallback.py``).

``close(timeout_s=T)`` waits up to T for the requests in flight (the contract's), then abandons the rest at once:
their calls end (``Transport.end_calls``: this backend's HTTP calls on the server's pool are ended; gRPC's end with
their channel; other models on the same server keep their calls and their connection, ``client/shared.py``), the
shared memory regions not in use get what is left of T (at least ``REGIONS_GRACE_S``) to be unregistered, and
those the server still holds (the abandoned requests') are unlinked and handed to the janitor. At interpreter
exit ``exit_hook.py`` closes what is open with ``timeout_s=0``. ``docs/remote.md`` ("Work in flight at the end")
gives the times.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...client.endpoints import spec_endpoints
from ...client.status import CallError, Status, to_public
from ...client.timeouts import CONTROL_TIMEOUT_S
from ...client.tls import check_tls_options
from ...errors import (
    BackendStateError,
    ConfigError,
)
from ...signature import ModelSignature
from ..base import CLOSE_TIMEOUT_S, Availability, BaseBackend, InferRequest
from ..options import BackendOptions
from . import exit_hook
from .exchange import Exchange, Outputs
from .fallback import TorchFallback
from .fleet import FAILOVER, Fleet
from .health import Server
from .opening import Target, open_remote
from .options import RemoteOptions
from .protocol import run_line
from .shm.owner import owner
from .volume import served_name

logger = logging.getLogger(__name__)

#: What closing gives the shared memory regions beyond ``close()``'s own deadline: time to unregister those no
#: request uses (the server may refuse "in use" a moment after a response). An abandoned request's is not waited for.
REGIONS_GRACE_S = 1.0


@dataclass
class _Attempts:
    """What one request's attempts have been: per server this round, rounds, the last failure and where."""

    started: float
    tried: Counter[Server] = field(default_factory=Counter)
    servers: set[str] = field(default_factory=set)
    count: int = 0
    rounds: int = 0
    last: CallError | None = None
    where: str = ""


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """``retries`` more rounds after the first, waiting ``base_s * 2**n`` (capped, jittered) before each: for a
    server that may recover in a moment (``UNAVAILABLE``: a model loading, a full queue, a shutdown), never past
    the deadline, never for the model's own error (a client timeout does not stop the server's work)."""

    retries: int
    base_s: float
    cap_s: float

    def delay_s(self, attempt: int, deadline: float | None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` >= 1 done), or ``None``: give up (the
        retries are spent, or waiting would leave no time before ``deadline``, a ``time.monotonic()`` value)."""
        if attempt > self.retries:
            return None
        delay = float(min(self.cap_s, self.base_s * 2 ** (attempt - 1)))
        delay *= 0.5 + random.random() / 2  # noqa: S311 - jitter, not cryptography
        if deadline is not None and time.monotonic() + delay >= deadline:
            return None
        return delay


class RemoteBackend(BaseBackend):
    """One model on a Triton server; thread-safe; see the module docstring and ``docs/remote.md``."""

    kind = "remote"
    options_type = RemoteOptions
    takes_parameters = True

    @classmethod
    def availability(cls, scheme: str) -> Availability:
        """Nothing to check before a server is named: it runs wherever one answers."""
        tls = "TLS; " if scheme.endswith("s") else ""
        return Availability(True, f"{tls}needs a Triton server: {scheme}://HOST:PORT")

    def __init__(
        self,
        model_name: str,
        *,
        model_repository: str | Path | None = None,
        version: int | None = None,
        urls: Sequence[str] = (),
        options: BackendOptions | None = None,
    ) -> None:
        mode = options.mode if isinstance(options, RemoteOptions) else "window"
        #: The model the app names; in volume mode requests go to ``<network>_volume`` (``volume.py``).
        self.network = model_name
        served = served_name(model_name, mode)
        super().__init__(served, model_repository=model_repository, version=version, urls=urls, options=options)
        options = self.remote_options
        try:
            self.endpoints = spec_endpoints(self.urls, options.servers)
        except ConfigError as exc:
            raise ConfigError(f"model {model_name!r}: {exc}") from exc
        self.url = ",".join(e.url for e in self.endpoints)
        if options.shared_memory == "system" and len(self.endpoints) > 1:
            raise ConfigError(
                f"model {model_name!r}: shared_memory=system needs one server on this host, and {self.url} is "
                f"{len(self.endpoints)}; use shared_memory=auto or none"
            )
        self._backoff = Backoff(retries=options.retries, base_s=options.backoff_s, cap_s=options.max_backoff_s)
        self._fallback: TorchFallback | None = None
        self._events: Counter[str] = Counter()  # see ``events``
        self._events_lock = threading.Lock()
        self._fleet: Fleet | None = None
        self._exchange: Exchange | None = None
        self._any_thread = False  # whether infer() may run on the caller's thread (the transports say, at open)
        self._close_by: float | None = None  # close()'s deadline, which the regions' end keeps too
        check_tls_options(self.endpoints, options)

    @property
    def remote_options(self) -> RemoteOptions:
        options = self.options
        assert isinstance(options, RemoteOptions)  # noqa: S101 - the base checks options_type
        return options

    @property
    def shared_memory(self) -> str:
        """How tensors travel now: ``system`` or ``none`` (``auto`` resolved at open)."""
        exchange = self._exchange
        return "system" if exchange is not None and exchange.pool is not None else "none"

    def describe(self) -> str:
        """The server as its metadata names it, the transport, how tensors travel (and the whole-volume model, in
        volume mode): ``protocol.run_line``."""
        if not self.urls:
            return super().describe()
        fleet = self._fleet
        described = [s.info for s in fleet.servers if s.checked] if fleet is not None else []
        volume = self.model_name if self.remote_options.mode == "volume" else None
        return run_line(self.urls[0], described, shared_memory=self.shared_memory == "system", volume_model=volume)

    def __repr__(self) -> str:
        return f"RemoteBackend(model={self.model_name!r}, url={self.url!r}, state={self._state.value})"

    # -- open ---------------------------------------------------------------------------------------
    def _open(self) -> ModelSignature:
        options = self.remote_options
        if options.fallback == "torch":  # a fallback that could never run fails now, not when it is needed
            self._fallback = TorchFallback(
                self.model_name, self.model_repository, self.version, max_in_flight=options.max_in_flight
            )
        target = Target(
            model=self.model_name,
            network=self.network,
            version=self.version,
            endpoints=self.endpoints,
            url=self.url,
            repository=self.model_repository,
        )
        assert self._pool is not None  # noqa: S101 - the contract makes it before _open for an _infer backend
        try:
            opened = open_remote(target, options, self._fallback, self._pool)
        except BaseException:
            if self._fallback is not None:
                self._fallback.close()
            raise
        self._fleet, self._exchange = opened.fleet, opened.exchange
        exit_hook.watch(self)  # closed at exit before the regions' sweep (see exit_hook.py)
        self._any_thread = opened.fleet.members.any_thread
        via = "the request body" if opened.exchange.pool is None else "system shared memory"
        logger.info("%r: %d server(s), tensors via %s", self, len(opened.fleet.servers), via)
        return opened.signature

    # -- requests -----------------------------------------------------------------------------------
    def _can_infer_here(self) -> bool:
        """Over a transport any thread may use (gRPC; HTTP, whose calls run on the server's connection pool): every
        attempt carries the request's time left, a backoff or a fallback keeps its deadline too, and ``close()``
        ends this backend's calls and cancels the request, so ``infer()`` runs on the caller's thread, failover
        included."""
        return self._any_thread

    def _infer(self, request: InferRequest) -> Outputs:
        """One request: attempts in a plain loop over the fleet, inside its deadline, until ``request.cancelled``."""
        attempts = _Attempts(time.monotonic())
        while True:
            fleet, exchange = self._fleet, self._exchange
            if request.cancelled.is_set() or fleet is None or exchange is None:
                raise self._public(CallError(Status.CANCELLED, "cancelled before it was sent"), request, attempts)
            if self._fallback is not None and not fleet.usable():
                self._count("fell_back")
                return dict(self._fallback.run(request, f"no server is up ({fleet.describe()})"))
            server = fleet.pick(attempts.tried)
            if server is None:
                if self._next_round(request, attempts):
                    continue
                return self._give_up(request, fleet, attempts)
            attempts.tried[server] += 1
            attempts.count += 1
            attempts.servers.add(server.label)
            transport = fleet.members.take(server)
            try:
                outputs = exchange.send(transport, request)
            except CallError as error:
                attempts.last, attempts.where = error, server.label
                if error.status not in FAILOVER or request.cancelled.is_set():
                    raise self._public(error, request, attempts) from error
                fleet.failed(server, error)
                logger.debug("model %r attempt %d on %s: %s", self.model_name, attempts.count, server.label, error)
                continue
            finally:
                fleet.members.give_back(server)
            fleet.succeeded(server)
            if attempts.count > 1:
                self._count("failed_over")
            return outputs

    def _next_round(self, request: InferRequest, attempts: _Attempts) -> bool:
        """Every server tried: wait the backoff for a transient error (ended early by a cancel) and start a new
        round, or ``False``."""
        last = attempts.last
        if last is None or not last.transient or request.cancelled.is_set():
            return False
        delay = self._backoff.delay_s(attempts.rounds + 1, request.deadline)
        if delay is None:
            return False
        attempts.rounds += 1
        logger.debug("model %r: round %d failed (%s); again in %.3f s", self.model_name, attempts.rounds, last, delay)
        if request.cancelled.wait(delay):
            return False
        attempts.tried.clear()
        return True

    def _give_up(self, request: InferRequest, fleet: Fleet, attempts: _Attempts) -> Outputs:
        """No attempt left: the fallback when the servers failed (not the model), else the caller's error."""
        last = attempts.last
        if last is None:  # no server could take it at all (every one unchecked or serving another model)
            last = CallError(Status.UNAVAILABLE, f"no server can take it: {fleet.describe()}")
            attempts.where = fleet.members.label
        error = self._public(last, request, attempts)
        if self._fallback is not None and last.status in FAILOVER:
            self._count("fell_back")
            return dict(self._fallback.run(request, str(error)))
        raise error

    def _count(self, event: str) -> None:
        with self._events_lock:
            self._events[event] += 1

    def _public(self, error: CallError, request: InferRequest, attempts: _Attempts) -> Exception:
        """The caller's error for the last attempt's ``error``: what the status means, and what we know."""
        waited_s = time.monotonic() - attempts.started
        where = attempts.where or self.url
        exc: Exception = to_public(error, model=self.model_name, url=where, waited_s=waited_s)
        if attempts.count > 1:
            servers = f" on {len(attempts.servers)} servers" if len(attempts.servers) > 1 else ""
            exc = type(exc)(f"{exc} (after {attempts.count} attempts{servers} in {waited_s:.3g} s)")
        signature = self.signature
        text = [n for n in request.inputs if signature.input(n).dtype == "BYTES"]
        if text and error.status in (Status.INTERNAL, Status.MODEL_DOWN):  # what we know, not what the message says
            exc = type(exc)(
                f"{exc} (the request carried BYTES input(s) {text}; a Python-backend model on Triton 2.51 cannot "
                "decode BYTES when its stub sees numpy 2)"
            )
        return exc

    def close(self, timeout_s: float | None = None) -> None:
        """The contract's ``close``; the regions then get what is left of the same deadline (module docstring)."""
        self._close_by = time.monotonic() + (CLOSE_TIMEOUT_S if timeout_s is None else max(0.0, timeout_s))
        super().close(timeout_s)

    def _close(self) -> None:
        """Calls still out ended, regions retired, channels closed, the fallback unloaded; the contract stops the
        pool after this (its HTTP workers are free by then: their calls have ended)."""
        exchange, self._exchange = self._exchange, None
        fleet, self._fleet = self._fleet, None
        exit_hook.forget(self)
        if os.getpid() != self._pid:  # a forked child: the parent's channels, threads and regions are not ours
            return
        if fleet is not None:
            fleet.members.end_calls()
        if exchange is not None and exchange.pool is not None:
            close_by = self._close_by if self._close_by is not None else time.monotonic()
            exchange.pool.close(max(close_by, time.monotonic() + REGIONS_GRACE_S))
        if fleet is not None:
            fleet.members.close()
        if self._fallback is not None:
            self._fallback.close()

    # -- server information -------------------------------------------------------------------------
    @property
    def events(self) -> dict[str, int]:
        """Requests answered after a failed attempt (``failed_over``: by another server, or the same one after a
        backoff) and requests run by the ``fallback`` (``fell_back``), since open."""
        with self._events_lock:
            return {"failed_over": self._events["failed_over"], "fell_back": self._events["fell_back"]}

    @property
    def servers(self) -> dict[str, str]:
        """Every server of the fleet and its state (``up``, ``suspect``, ``down``, ``new``, ``excluded``)."""
        fleet = self._fleet
        return {} if fleet is None else {s.label: s.state.value for s in fleet.servers}

    def statistics(self) -> dict[str, Any]:
        """Triton's inference statistics for this model (executions, requests, queue and compute times); with several
        servers, ``model_stats`` holds every server's entries, each with its ``server``."""
        fleet = self._fleet
        if fleet is None:
            raise BackendStateError(f"{self!r}: statistics() needs an open backend")
        return fleet.members.statistics()

    def shared_memory_regions(self) -> list[str]:
        """Names of this backend's regions registered on the server (diagnostics and tests)."""
        fleet = self._fleet
        only = fleet.members.only_server() if fleet is not None else None
        if only is None:
            return []
        try:
            names = only.transport.system_shm_names(timeout_s=CONTROL_TIMEOUT_S)
        except CallError as exc:
            raise to_public(exc, model=self.model_name, url=self.url) from exc
        ours = set(owner.names())
        return [n for n in names if n in ours]
