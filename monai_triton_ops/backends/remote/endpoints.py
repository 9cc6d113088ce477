"""Where the servers are and how to reach them: a backend's endpoints, its transport settings, and ``connect``.

A spec's URLs (``grpc://h1:8001``) become :class:`Endpoint` values; every endpoint of a backend is
reached with the same :class:`TransportSettings` (TLS material, compression, keepalive), built once
from the options, and :func:`connect` makes the transport for one endpoint. A backend holds a tuple of
endpoints and picks one per attempt, so several servers (failover, a headless Service that resolves to
many addresses) and credentials (client certificates, auth headers) are additions here, not a new
layer on the request path.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ...errors import BackendUnavailableError
from .credentials import Credentials, load_credentials
from .options import RemoteOptions

if TYPE_CHECKING:
    from .transport import Transport
    from .workers import Workers

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True)
class Endpoint:
    """One server address as the spec gave it: ``scheme://host:port``."""

    url: str
    scheme: str  # grpc, grpcs, http, https
    host: str
    port: int | None

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        return cls(url=url, scheme=parts.scheme, host=parts.hostname or "", port=parts.port)

    @property
    def protocol(self) -> str:
        return "grpc" if self.scheme in ("grpc", "grpcs") else "http"

    @property
    def tls(self) -> bool:
        return self.scheme in ("grpcs", "https")

    @property
    def address(self) -> str:
        """``host:port`` as the clients take it (an IPv6 literal in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)


@dataclass(frozen=True, kw_only=True)
class TransportSettings:
    """How every endpoint of one backend is spoken to; made once from the options (files read here, not per call)."""

    credentials: Credentials = field(default_factory=Credentials)  # TLS material and headers (credentials.py)
    compression: str | None = None  # gRPC message compression: gzip, deflate
    keepalive_s: float | None = None  # gRPC keepalive ping period

    @classmethod
    def from_options(cls, options: RemoteOptions) -> TransportSettings:
        return cls(
            credentials=load_credentials(options),
            compression=None if options.compression == "none" else options.compression,
            keepalive_s=options.keepalive_s,
        )


def connect(endpoint: Endpoint, settings: TransportSettings, workers: Workers) -> Transport:
    """The transport for ``endpoint``: gRPC shares one thread-safe client, HTTP has one per worker thread."""
    try:
        if endpoint.protocol == "grpc":
            from .grpc_transport import GrpcTransport

            return GrpcTransport(endpoint, settings)
        from .http_transport import HttpTransport

        return HttpTransport(endpoint, settings, workers)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"{endpoint.url}: tritonclient is missing ({exc}); pip install 'tritonclient[grpc,http]'"
        ) from exc


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (an address literal or a loopback name; no DNS lookup)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
