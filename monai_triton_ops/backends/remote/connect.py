"""The one function that makes the transport for an endpoint: gRPC or HTTP, by the endpoint's scheme.

Apart from ``endpoints.py`` because the transports import the endpoint types: the endpoints know nothing of the
transports, and this module, above both, picks one.
"""

from __future__ import annotations

from ...errors import BackendUnavailableError
from .endpoints import Endpoint, TransportSettings
from .transport import Transport
from .workers import Workers


def connect(endpoint: Endpoint, settings: TransportSettings, workers: Workers, *, balanced: bool = False) -> Transport:
    """The transport for ``endpoint``: gRPC shares one thread-safe client, HTTP has one per worker thread.

    ``balanced``: a gRPC name with several addresses, spread by the channel's ``round_robin``.
    """
    try:
        if endpoint.protocol == "grpc":
            from .grpc_transport import GrpcTransport

            return GrpcTransport(endpoint, settings, balanced=balanced)
        from .http_transport import HttpTransport

        return HttpTransport(endpoint, settings, workers)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"{endpoint.url}: tritonclient is missing ({exc}); pip install 'tritonclient[grpc,http]'"
        ) from exc
