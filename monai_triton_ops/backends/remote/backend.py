"""``RemoteBackend``: a model served by a Triton server, over gRPC or HTTP (``grpc://``, ``http://``, TLS variants).

Open: wait for the server and the model within ``ready_timeout_s``, read the signature (MONAI
metadata included) from the server's model config, compare with a local ``config.pbtxt`` when the
caller's repository has one, and, when tensors go through shared memory, register a first region
(so a server that refuses client shared memory is found at open: ``auto`` falls back to the wire
with one warning, ``system`` fails).

Requests: asynchronous (``_submit``): gRPC's async API, or HTTP worker threads that each own a
client; the base keeps at most ``max_in_flight`` outstanding. See ``calls.py`` for one request's
attempts and ``pool.py`` for the shared memory slots.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...errors import BackendStateError, BackendUnavailableError, ConfigError
from ...signature import ModelSignature
from ..base import ArrayLike, BaseBackend, InferRequest
from ..options import BackendOptions
from . import shm
from .calls import Call, Context, OutputSizes
from .options import RemoteOptions
from .pool import RegionPool
from .retry import Backoff
from .server_model import check_local_config, read_signature, wait_until_ready
from .translate import CallError, to_public
from .transport import Transport

logger = logging.getLogger(__name__)

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
#: Deadline of the control calls made at open (metadata, config, the first registration).
_CONTROL_TIMEOUT_S = 10.0


class RemoteBackend(BaseBackend):
    """One model on one Triton server; thread-safe; see the module docstring and ``docs/remote.md``."""

    kind = "remote"
    options_type = RemoteOptions

    def __init__(
        self,
        model_name: str,
        *,
        model_repository: str | Path | None = None,
        version: int | None = None,
        urls: Sequence[str] = (),
        options: BackendOptions | None = None,
    ) -> None:
        super().__init__(model_name, model_repository=model_repository, version=version, urls=urls, options=options)
        if not self.urls:
            raise ConfigError(f"model {model_name!r}: a remote backend needs a server URL, e.g. grpc://HOST:8001")
        if len(self.urls) > 1:
            raise ConfigError(
                f"model {model_name!r}: several servers {list(self.urls)} (failover) are not supported yet; give one"
            )
        self.url = self.urls[0]
        parts = urlsplit(self.url)
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        self.port = parts.port
        self._transport: Transport | None = None
        self._context: Context | None = None
        self._requests: dict[int, Call] = {}
        self._calls_lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def remote_options(self) -> RemoteOptions:
        options = self.options
        assert isinstance(options, RemoteOptions)  # noqa: S101 - the base checks options_type
        return options

    @property
    def shared_memory(self) -> str:
        """How tensors travel now: ``system`` or ``none`` (``auto`` resolved at open)."""
        return "system" if self._context is not None and self._context.pool is not None else "none"

    def __repr__(self) -> str:
        return f"RemoteBackend(model={self.model_name!r}, url={self.url!r}, state={self._state.value})"

    # -- open ---------------------------------------------------------------------------------------
    def _open(self) -> ModelSignature:
        options = self.remote_options
        transport = self._make_transport(options)
        try:
            wait_until_ready(transport, self.model_name, self.version, timeout_s=options.ready_timeout_s)
            signature = read_signature(transport, self.model_name, self.version, timeout_s=_CONTROL_TIMEOUT_S)
            check_local_config(signature, self.model_repository, url=self.url)
            pool = self._make_pool(transport, options)
        except BaseException:
            transport.close()
            raise
        self._transport = transport
        self._context = Context(
            transport=transport,
            signature=signature,
            version="" if self.version is None else str(self.version),
            pool=pool,
            sizes=OutputSizes(),
            backoff=Backoff(retries=options.retries, base_s=options.backoff_s, cap_s=options.max_backoff_s),
            default_timeout_s=float(options.timeout_s or 0) or 120.0,
            fallback=options.shared_memory == "auto",
            started=self._started,
            ended=self._ended,
        )
        logger.info("%r: tensors via %s", self, "system shared memory" if pool else "the request body")
        return signature

    def _make_transport(self, options: RemoteOptions) -> Transport:
        address = f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"
        tls = self.scheme in ("grpcs", "https")
        try:
            if self.scheme in ("grpc", "grpcs"):
                from .grpc_transport import GrpcTransport

                certificates = _read_pem(options.root_certificates)
                compression = None if options.compression == "none" else options.compression
                return GrpcTransport(
                    address,
                    url=self.url,
                    ssl=tls,
                    root_certificates=certificates,
                    compression=compression,
                    keepalive_s=options.keepalive_s,
                    workers=options.max_in_flight,
                )
            from .http_transport import HttpTransport

            return HttpTransport(address, url=self.url, workers=options.max_in_flight, ssl=tls)
        except ImportError as exc:
            raise BackendUnavailableError(
                f"{self.url}: tritonclient is missing ({exc}); pip install 'tritonclient[grpc,http]'"
            ) from exc

    def _make_pool(self, transport: Transport, options: RemoteOptions) -> RegionPool | None:
        mode = options.shared_memory
        if mode == "cuda":
            raise BackendUnavailableError(
                f"{self.url}: shared_memory=cuda needs a GPU and cuda-python; it is not supported by this build yet "
                "(use auto, system or none)"
            )
        if mode == "none" or (mode == "auto" and not is_loopback(self.host)):
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
        if os.getpid() != self._pid:
            raise BackendStateError(
                f"{self!r} was opened in process {self._pid}; after fork() open a new backend in this process"
            )
        context = self._context
        if context is None:
            raise BackendStateError(f"{self!r}: not open")
        return Call(context, request).start()

    def _started(self, call: Call) -> None:
        with self._calls_lock:
            self._requests[id(call.request)] = call

    def _ended(self, call: Call) -> None:
        with self._calls_lock:
            self._requests.pop(id(call.request), None)

    def _cancel(self, request: InferRequest) -> None:
        with self._calls_lock:
            call = self._requests.get(id(request))
        if call is not None:
            call.cancel()

    def _close(self) -> None:
        context, self._context = self._context, None
        transport, self._transport = self._transport, None
        if os.getpid() != self._pid:  # a forked child: the parent's channel and regions are not ours
            return
        if context is not None and context.pool is not None:
            context.pool.close(time.monotonic() + _CONTROL_TIMEOUT_S)
        if transport is not None:
            transport.close()

    # -- server information -------------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        """Triton's inference statistics for this model (executions, requests, queue and compute times)."""
        transport = self._transport
        if transport is None:
            raise BackendStateError(f"{self!r}: statistics() needs an open backend")
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


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (an address literal or a loopback name; no DNS lookup)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _read_pem(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="ascii")
    except OSError as exc:
        raise ConfigError(f"root_certificates {str(path)!r} cannot be read: {exc}") from exc
