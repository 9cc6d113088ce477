"""``RemoteBackend``: a model served by a Triton server, over gRPC or HTTP (``grpc://``, ``http://``, TLS variants).

Open: wait for the server and the model within ``ready_timeout_s``, read the signature (MONAI
metadata included) from the server, compare it with a local ``config.pbtxt`` when the caller's
repository has one, and, when tensors go through shared memory, register a first region (so a server
that refuses client shared memory is found at open: ``auto`` falls back to the wire with one warning,
``system`` fails).

A request, from the base's ``submit()`` to the wire (``docs/remote.md`` draws it):

    _submit(request)                        queue put on the worker pool (workers.py): never blocks
    _run(ticket)       on a worker thread:  the attempt loop below, bounded by the request's deadline
      exchange.send(transport, request)     one attempt: slot or body, one blocking call, outputs (exchange.py)
        transport.infer(...)                tritonclient, a deadline on the call (grpc_/http_transport.py)

One pool, one future per request (the pool's), retries as a plain loop on the worker: a transient
error waits its backoff there (ended early by a cancel) and tries again while the deadline allows.
Over gRPC, ``infer()`` runs ``_run`` on the caller's thread instead (``_infer_here``: no hand-off);
HTTP clients belong to the workers' threads, so HTTP requests always go to the pool.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ...errors import BackendStateError, BackendUnavailableError, ConfigError, ServerUnavailableError
from ...signature import ModelSignature
from ..base import ArrayLike, BaseBackend, InferRequest
from ..options import BackendOptions
from . import shm
from .endpoints import Endpoint, TransportSettings, connect
from .exchange import Exchange, Outputs
from .options import RemoteOptions
from .pool import RegionPool
from .protocol import BINARY_TENSORS, STATISTICS, SYSTEM_SHARED_MEMORY, UNKNOWN_SERVER, describe_model, server_info
from .retry import Backoff
from .server_model import wait_until_ready
from .tls import check_handshake, check_tls_options
from .translate import CallError, Status, to_public
from .transport import Transport
from .volume import open_volume_model, served_name, volume_parameters
from .workers import Workers

logger = logging.getLogger(__name__)

#: Deadline of the control calls made at open and close (metadata, config, registrations).
_CONTROL_TIMEOUT_S = 10.0
#: Deadline of the TLS handshake made at open to tell TLS problems from a server that is away (tls.py).
_HANDSHAKE_TIMEOUT_S = 5.0
#: How long ``close()`` waits for each worker thread to end once its last call has.
_JOIN_TIMEOUT_S = 5.0


class _Ticket:
    """One request handed to the pool; ``cancel()`` stops its attempts and ends a backoff wait at once."""

    __slots__ = ("_wake", "cancelled", "request")

    def __init__(self, request: InferRequest) -> None:
        self.request = request
        self.cancelled = False
        self._wake: threading.Event | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self._wake is not None:
            self._wake.set()

    def sleep(self, seconds: float) -> None:
        """A retry's backoff, on the worker thread (no timer thread), cut short by ``cancel()``."""
        self._wake = threading.Event()
        if not self.cancelled:
            self._wake.wait(seconds)


class RemoteBackend(BaseBackend):
    """One model on a Triton server; thread-safe; see the module docstring and ``docs/remote.md``."""

    kind = "remote"
    options_type = RemoteOptions
    takes_parameters = True

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
        self.endpoints = tuple(Endpoint.parse(url) for url in self.urls)
        if not self.endpoints:
            raise ConfigError(f"model {model_name!r}: a remote backend needs a server URL, e.g. grpc://HOST:8001")
        if len(self.endpoints) > 1:
            raise ConfigError(
                f"model {model_name!r}: several servers {list(self.urls)} (failover) are not supported yet; give one"
            )
        self.url = self.endpoints[0].url
        options = self.remote_options
        self._backoff = Backoff(retries=options.retries, base_s=options.backoff_s, cap_s=options.max_backoff_s)
        self._workers: Workers | None = None
        self._transport: Transport | None = None
        self._exchange: Exchange | None = None
        self._tickets: dict[int, _Ticket] = {}
        self._tickets_lock = threading.Lock()
        self._pid = os.getpid()
        self._server = UNKNOWN_SERVER  # what the server speaks, learnt at open (protocol.py)
        check_tls_options(self.endpoints, self.remote_options)

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

    def __repr__(self) -> str:
        return f"RemoteBackend(model={self.model_name!r}, url={self.url!r}, state={self._state.value})"

    # -- open ---------------------------------------------------------------------------------------
    def _open(self) -> ModelSignature:
        options = self.remote_options
        settings = TransportSettings.from_options(options)
        workers = Workers(f"remote-{self.model_name}", options.max_in_flight)
        transport: Transport | None = None
        try:
            transport = connect(self.endpoints[0], settings, workers)
            if options.mode == "volume":
                signature = self._open_volume(transport, settings, options)
            else:
                self._wait(transport, settings, options)
                served = describe_model(
                    transport,
                    self.model_name,
                    self.version,
                    timeout_s=_CONTROL_TIMEOUT_S,
                    repository=self.model_repository,
                    max_batch_size=options.max_batch_size,
                )
                signature, self._server = served.signature, served.server
                transport.use_binary_tensors(served.server.has(BINARY_TENSORS))
            pool = self._make_pool(transport, options)
        except BaseException:
            if transport is not None:
                transport.close()
            workers.stop(join_timeout_s=_JOIN_TIMEOUT_S)
            raise
        self._workers, self._transport = workers, transport
        version, parameters = "" if self.version is None else str(self.version), {}
        if options.mode == "volume":  # the version asked for is the network's, sent along as a parameter
            version, parameters = "", volume_parameters(self.version)
        self._exchange = Exchange(
            signature, version, pool, fallback=options.shared_memory == "auto", parameters=parameters
        )
        logger.info("%r: tensors via %s", self, "system shared memory" if pool else "the request body")
        return signature

    def _wait(self, transport: Transport, settings: TransportSettings, options: RemoteOptions) -> None:
        """Readiness, after a TLS handshake of our own: a TLS problem is a ``ConfigError`` now, not a long wait."""
        endpoint, handshake_s = self.endpoints[0], min(_HANDSHAKE_TIMEOUT_S, options.ready_timeout_s)
        check_handshake(endpoint, settings.credentials, timeout_s=handshake_s)
        try:
            wait_until_ready(transport, self.model_name, self.version, timeout_s=options.ready_timeout_s)
        except ServerUnavailableError:
            check_handshake(endpoint, settings.credentials, timeout_s=handshake_s)  # up meanwhile, refusing us?
            raise

    def _open_volume(self, transport: Transport, settings: TransportSettings, options: RemoteOptions) -> ModelSignature:
        """The whole-volume model and its network (``volume.py``), after a TLS handshake of our own. Triton only:
        the volume model is a Python-backend model that runs MONAI's sliding window on the server."""
        check_handshake(
            self.endpoints[0], settings.credentials, timeout_s=min(_HANDSHAKE_TIMEOUT_S, options.ready_timeout_s)
        )
        signature = open_volume_model(
            transport,
            self.network,
            self.version,
            ready_timeout_s=options.ready_timeout_s,
            repository=self.model_repository,
        )
        self._server = server_info(transport, model=self.model_name, timeout_s=_CONTROL_TIMEOUT_S)
        transport.use_binary_tensors(self._server.has(BINARY_TENSORS))
        return signature

    def _make_pool(self, transport: Transport, options: RemoteOptions) -> RegionPool | None:
        mode = options.shared_memory
        if mode == "cuda":
            raise BackendUnavailableError(
                f"{self.url}: shared_memory=cuda needs a GPU and cuda-python; it is not supported by this build yet "
                "(use auto, system or none)"
            )
        if mode == "none" or (mode == "auto" and not self.endpoints[0].is_loopback):
            return None
        if not self._server.has(SYSTEM_SHARED_MEMORY):
            if mode == "system":
                raise ConfigError(
                    f"model {self.model_name!r}: shared_memory=system, but {self._server.lacks(SYSTEM_SHARED_MEMORY)} "
                    f"at {self.url} (use shared_memory=auto or none)"
                )
            logger.info("%s: %s; tensors go in the request body", self.url, self._server.lacks(SYSTEM_SHARED_MEMORY))
            return None
        shm.remove_stale_regions(lambda name: transport.unregister_system_shm(name, timeout_s=1.0))
        pool = RegionPool(transport, max_slots=options.max_in_flight + 4)
        try:
            pool.release(pool.acquire(shm.PAGE))  # the server must accept a region now, not at the first request
        except (CallError, OSError) as exc:
            pool.close(time.monotonic())
            reason = exc.message if isinstance(exc, CallError) else str(exc)
            if mode == "system":
                raise ConfigError(
                    f"model {self.model_name!r}: shared_memory=system, but {self.url} cannot use this host's "
                    f"system shared memory: {reason} (use shared_memory=auto or none)"
                ) from exc
            logger.warning(
                "%s refuses client shared memory (%s); tensors of model %r go in the request body",
                self.url,
                reason,
                self.model_name,
            )
            return None
        return pool

    # -- requests -----------------------------------------------------------------------------------
    def _submit(self, request: InferRequest) -> Future[Mapping[str, ArrayLike]]:
        """Hand the request to a worker; never blocks (shared memory and the network are the worker's)."""
        if os.getpid() != self._pid:
            raise BackendStateError(
                f"{self!r} was opened in process {self._pid}; after fork() open a new backend in this process"
            )
        workers = self._workers
        if workers is None:
            raise BackendStateError(f"{self!r}: not open")
        ticket = self._ticket(request)
        try:
            return workers.submit(self._run, ticket)
        except BaseException:  # closing: _run will never drop it
            with self._tickets_lock:
                self._tickets.pop(id(request), None)
            raise

    def _can_infer_here(self) -> bool:
        """Over a transport any thread may use (gRPC): every call carries the request's time left and ends when
        ``close()`` closes the channel, so ``infer()`` runs on the caller's thread. HTTP clients are the workers'."""
        transport = self._transport
        return transport is not None and transport.any_thread and os.getpid() == self._pid

    def _infer_here(self, request: InferRequest) -> Outputs:
        return self._run(self._ticket(request))

    def _ticket(self, request: InferRequest) -> _Ticket:
        """The request's ticket, where ``_cancel`` finds it until ``_run`` ends."""
        ticket = _Ticket(request)
        with self._tickets_lock:
            self._tickets[id(request)] = ticket
        return ticket

    def _run(self, ticket: _Ticket) -> Outputs:
        """One request on a worker (or the ``infer()`` caller's) thread: attempts in a plain loop, each inside the
        request's deadline."""
        request, started = ticket.request, time.monotonic()
        attempt = 0
        try:
            while True:
                attempt += 1
                transport = self._transport  # points 2-3: the next healthy endpoint's transport, per attempt
                exchange = self._exchange
                try:
                    if ticket.cancelled or exchange is None or transport is None:
                        raise CallError(Status.CANCELLED, "cancelled before it was sent")
                    return exchange.send(transport, request)
                except CallError as error:
                    delay = None
                    if error.transient and not ticket.cancelled:
                        delay = self._backoff.delay_s(attempt, request.deadline)
                    if delay is None:
                        raise self._public(error, request, attempt, time.monotonic() - started) from error
                    logger.debug("model %r attempt %d: %s; retrying in %.3f s", self.model_name, attempt, error, delay)
                    ticket.sleep(delay)
        finally:
            with self._tickets_lock:
                self._tickets.pop(id(request), None)

    def _public(self, error: CallError, request: InferRequest, attempts: int, waited_s: float) -> Exception:
        """The caller's error for the last attempt's ``error``: what the status means, and what we know."""
        exc: Exception = to_public(error, model=self.model_name, url=self.url, waited_s=waited_s)
        if attempts > 1:
            exc = type(exc)(f"{exc} (after {attempts} attempts in {waited_s:.3g} s)")
        signature = self.signature
        text = [n for n in request.inputs if signature.input(n).dtype == "BYTES"]
        if text and error.status in (Status.INTERNAL, Status.MODEL_DOWN):  # what we know, not what the message says
            exc = type(exc)(
                f"{exc} (the request carried BYTES input(s) {text}; a Python-backend model on Triton 2.51 cannot "
                "decode BYTES when its stub sees numpy 2)"
            )
        return exc

    def _cancel(self, request: InferRequest) -> None:
        """No further attempt (a call already out ends at its deadline, or when ``close()`` ends the channel)."""
        with self._tickets_lock:
            ticket = self._tickets.get(id(request))
        if ticket is not None:
            ticket.cancel()

    def _close(self) -> None:
        exchange, self._exchange = self._exchange, None
        transport, self._transport = self._transport, None
        workers, self._workers = self._workers, None
        if os.getpid() != self._pid:  # a forked child: the parent's channel, threads and regions are not ours
            return
        if exchange is not None and exchange.pool is not None:
            exchange.pool.close(time.monotonic() + _CONTROL_TIMEOUT_S)
        if transport is not None:
            transport.close()
        if workers is not None:
            workers.stop(join_timeout_s=_JOIN_TIMEOUT_S)

    # -- server information -------------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        """Triton's inference statistics for this model (executions, requests, queue and compute times)."""
        transport = self._transport
        if transport is None:
            raise BackendStateError(f"{self!r}: statistics() needs an open backend")
        if not self._server.has(STATISTICS):
            raise ConfigError(
                f"model {self.model_name!r} on {self.url}: no statistics: {self._server.lacks(STATISTICS)}"
            )
        try:
            return transport.statistics(self.model_name, timeout_s=_CONTROL_TIMEOUT_S)
        except CallError as exc:
            raise to_public(exc, model=self.model_name, url=self.url) from exc

    def shared_memory_regions(self) -> list[str]:
        """Names of this backend's regions registered on the server (diagnostics and tests)."""
        transport = self._transport
        if transport is None:
            return []
        try:
            names = transport.system_shm_names(timeout_s=_CONTROL_TIMEOUT_S)
        except CallError as exc:
            raise to_public(exc, model=self.model_name, url=self.url) from exc
        return [n for n in names if n in set(shm.live_regions())]
