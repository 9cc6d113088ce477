"""How the remote backend speaks to a server: one transport per endpoint, over gRPC or HTTP, and :func:`connect`.

    base.py         the neutral interface (Transport, the wire's tensor specs), the kept heads of shared
                    memory requests, and TransportSettings (made once from the options)
    grpc.py         gRPC: one thread-safe channel of our own, blocking calls, a deadline on each
    grpc_wire.py    a gRPC inference request written as bytes, its tensors not through protobuf's serializer
    http.py         HTTP: one connection pool per server in the process, clients per pool thread (gevent is not
                    thread-safe), geventhttpclient for inference
    http_wire.py    an HTTP inference request's body written, and its response read
    codec.py        the one tensor codec: a caller's array as the wire takes it, wire bytes as numpy
    tls.py          what gRPC and HTTP are given for TLS; a handshake that says what TLS failure it is
    credentials.py  TLS material and auth headers, secrets named by env:/file: references, redaction

Each transport turns its libraries' exceptions into a ``status.CallError`` in one context manager
(``_mapped``), by status code; nothing above this package sees a ``grpc``, ``geventhttpclient`` or
``tritonclient`` exception.
"""

from __future__ import annotations

from ...errors import BackendUnavailableError
from ..endpoints import Endpoint
from ..workers import Workers
from .base import Transport, TransportSettings


def connect(endpoint: Endpoint, settings: TransportSettings, workers: Workers, *, balanced: bool = False) -> Transport:
    """The transport for ``endpoint``, by its scheme: gRPC has one thread-safe channel (the process's channels to one
    server share its connection), HTTP the server's connection pool, shared by every caller in the process that
    speaks to it the same way, which grows by ``workers.count`` threads for this caller (``client/shared.py``).

    ``balanced``: a gRPC name with several addresses, spread by the channel's ``round_robin``.
    """
    try:
        if endpoint.protocol == "grpc":
            from .grpc import GrpcTransport

            return GrpcTransport(endpoint, settings, balanced=balanced)
        from .http import HttpTransport

        return HttpTransport(endpoint, settings, workers)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"{endpoint.url}: tritonclient is missing ({exc}); pip install 'tritonclient[grpc,http]'"
        ) from exc
