"""Where the servers are: a backend's endpoints, and the addresses a name stands for.

A spec's URLs (``grpc://h1:8001``) and the ``servers`` option become :class:`Endpoint` values
(:func:`spec_endpoints`); how every endpoint is spoken to is ``transports/`` (``TransportSettings``, and
``transports.connect`` for the transport of one endpoint).

A name can stand for several servers (a Kubernetes headless Service answers with the address of every
ready pod): :func:`addresses_of` resolves an endpoint into the :class:`Address` values the fleet dials.

    IP literal, or a loopback name (localhost)   one server, as written
    a name with one address (or none yet)        one server, dialled by name (a proxy routing by host works)
    a plaintext name with several addresses      one server per address, dialled by address: each is
                                                 checked, balanced over and failed over on its own
    a TLS name with several addresses            one server by name (the certificate names the host):
                                                 gRPC's own round_robin spreads its calls over them
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError

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


@dataclass(frozen=True)
class Address:
    """One server of a fleet: the endpoint dialled, the spec entry it came from, and how messages name it."""

    origin: Endpoint  # as the spec (or the servers option) wrote it
    endpoint: Endpoint  # what is dialled: the origin itself, or one of its name's addresses
    label: str  # grpc://h:8001, or grpc://name:8001 (10.0.0.5) for one address of a name
    balanced: bool = False  # a TLS gRPC name over several addresses: gRPC's round_robin inside one channel

    @property
    def key(self) -> str:
        return self.label


#: ``resolve(host, port)`` -> the host's addresses, in the resolver's order; ``OSError`` when it has none.
Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address of ``host`` for TCP (A and AAAA records, ``/etc/hosts``), duplicates dropped."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def is_name(origin: Endpoint) -> bool:
    """Whether ``origin`` names a host that :func:`addresses_of` resolves (not an address, not loopback)."""
    return origin.port is not None and not is_loopback(origin.host) and not _is_literal(origin.host)


def addresses_of(origin: Endpoint, resolver: Resolver = resolve) -> list[Address]:
    """The servers ``origin`` stands for now (see the module docstring); a name that does not resolve is kept."""
    as_written = [Address(origin, origin, origin.url)]
    if origin.port is None or not is_name(origin):
        return as_written
    try:
        hosts = resolver(origin.host, origin.port)
    except OSError:  # no record yet (a headless Service without ready pods): probes say so, and resolve again
        return as_written
    if len(hosts) <= 1:
        return as_written
    if origin.tls:
        return [Address(origin, origin, origin.url, balanced=origin.protocol == "grpc")]
    return [
        Address(origin, Endpoint.parse(f"{origin.scheme}://{_bracketed(h)}:{origin.port}"), f"{origin.url} ({h})")
        for h in hosts
    ]


#: The schemes a server URL may have.
SCHEMES = ("grpc", "grpcs", "http", "https")


def server_endpoint(url: str) -> Endpoint:
    """One server's URL as a tool takes it: ``grpc://``, ``grpcs://``, ``http://``, ``https://HOST:PORT``, or a bare
    ``HOST:PORT`` (HTTP, as the App SDK's ``-t``/``TRITON_SERVER_NETLOC``); ``ConfigError`` for anything else."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in SCHEMES or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ConfigError(
            f"server URL {url!r}: expected grpc://HOST:PORT, grpcs://, http://HOST:PORT, https:// or HOST:PORT"
        )
    return Endpoint.parse(f"{parts.scheme}://{parts.netloc}")


def spec_endpoints(urls: Sequence[str], servers: Sequence[str]) -> tuple[Endpoint, ...]:
    """The spec's URLs, then the ``servers`` option's (``HOST:PORT`` or a URL of the same scheme), once each; at
    least one, all of one scheme (``ConfigError`` otherwise)."""
    endpoints = [Endpoint.parse(url) for url in urls]
    scheme = endpoints[0].scheme if endpoints else "grpc"
    for entry in servers:
        text = entry.strip()
        parts = urlsplit(text if "://" in text else f"{scheme}://{text}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != scheme or not parts.hostname or port is None or parts.path:
            raise ConfigError(
                f"option servers: {entry!r} is not HOST:PORT (or {scheme}://HOST:PORT, the spec's scheme)"
            )
        endpoints.append(Endpoint.parse(f"{scheme}://{parts.netloc}"))
    if not endpoints:
        raise ConfigError("a remote backend needs a server URL, e.g. grpc://HOST:8001")
    if len({e.scheme for e in endpoints}) > 1:
        raise ConfigError(f"every server of one backend needs the same scheme, got {urls}")
    return tuple(dict.fromkeys(endpoints))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (an address literal or a loopback name; no DNS lookup)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
