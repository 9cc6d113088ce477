"""TLS for ``grpcs://`` and ``https://``: what each client is given, and a handshake that says what went wrong.

gRPC gets ``grpc.ssl_channel_credentials`` made from the PEM bytes read at open; HTTP (geventhttpclient)
gets an SSL context factory with the same CA and client certificate. Both verify the server's
certificate and its name (the spec's host) against ``root_certificates``, else the system's CAs.

Why :func:`check_handshake`: when TLS fails, gRPC says only ``UNAVAILABLE`` ("failed to connect to all
addresses", "Socket closed"), the code it also gives for a server that is down or restarting, and the
backend would wait out ``ready_timeout_s`` for a server that will never accept it. One TLS handshake
of our own, at open, tells the cases apart by exception type and the TLS alert's reason code (not
message text): the server's certificate is not trusted (naming the server and the CA file), the server
wants a client certificate or refuses ours, or the port does not speak TLS. A server that cannot be
reached is left to the readiness wait, which says so.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .credentials import CredentialOptions, Credentials

if TYPE_CHECKING:
    import grpc

    from .endpoints import Endpoint

#: TLS alerts by which a server refuses the client's certificate, or asks for one it did not get.
_CLIENT_REFUSED = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
    }
)
#: A server that drops the connection at or right after the handshake: how gRPC servers refuse a client
#: certificate under TLS 1.3 (no alert is sent), and a TLS 1.2 handshake cut short.
_CLOSED = "EOF"
_CLOSED_REASONS = frozenset({_CLOSED, "UNEXPECTED_EOF_WHILE_READING", "SSLEOFError"})
#: Reasons that mean the port answered, but not with TLS.
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL"})
#: What the client sends after the handshake, so that a server that checks the client's certificate late
#: (TLS 1.3 sends that refusal after the client's handshake is done) answers with its alert.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_ALPN = {"grpc": ["h2"], "http": ["http/1.1"]}


def grpc_channel_credentials(credentials: Credentials) -> grpc.ChannelCredentials:
    """The channel credentials of a ``grpcs://`` client: CA (``None``: gRPC's default roots), client certificate."""
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=credentials.root_certificates,
        private_key=credentials.client_key_pem,
        certificate_chain=credentials.client_chain_pem,
    )


def http_context_factory(credentials: Credentials) -> Callable[..., ssl.SSLContext]:
    """A factory geventhttpclient calls for each ``https://`` client: our CA and client certificate, not its own."""

    def make(**_ignored: Any) -> ssl.SSLContext:  # it passes cafile= (its own bundle): ours replaces it
        import gevent.ssl

        context: ssl.SSLContext = gevent.ssl.create_default_context()
        _load(context, credentials)
        return context

    return make


def client_context(credentials: Credentials, protocol: str) -> ssl.SSLContext:
    """The standard library's context with the same material (the handshake check)."""
    context = ssl.create_default_context()
    _load(context, credentials)
    context.set_alpn_protocols(_ALPN[protocol])
    return context


def _load(context: ssl.SSLContext, credentials: Credentials) -> None:
    if credentials.root_certificates is not None:
        context.load_verify_locations(cadata=_text(credentials, "root_certificates"))
    if credentials.client_certificate is None and credentials.client_chain_pem is not None:
        _load_client_pair(context, credentials.client_chain_pem, credentials.client_key_pem or b"")
    if credentials.client_certificate is not None:
        try:
            context.load_cert_chain(certfile=credentials.client_certificate, keyfile=credentials.client_key)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"client_certificate {str(credentials.client_certificate)!r} and client_key "
                f"{str(credentials.client_key)!r} are not a certificate and its private key ({exc.reason or exc})"
            ) from None


def _load_client_pair(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """A client certificate given as PEM bytes only (the shm janitor gets them on its pipe, not as files):
    ``load_cert_chain`` reads files only, so a 0600 temporary file, deleted as soon as it is loaded."""
    fd, path = tempfile.mkstemp(prefix="mto-client-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(chain + b"\n" + key)
        context.load_cert_chain(certfile=path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _text(credentials: Credentials, option: str) -> str:
    data = credentials.root_certificates or b""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ConfigError(f"{option} {str(credentials.root_certificates_path)!r} holds no PEM certificate")
    return text


def check_tls_options(endpoints: Sequence[Endpoint], options: CredentialOptions) -> None:
    """TLS files for a plaintext server are a mistake (the traffic would go in clear): refused at once."""
    given = [name for name in ("root_certificates", "client_certificate") if getattr(options, name) is not None]
    plain = [e.url for e in endpoints if not e.tls]
    if given and plain:
        raise ConfigError(
            f"{' and '.join(given)} given, but {', '.join(plain)} does not use TLS: use grpcs:// or https://"
        )


def check_handshake(endpoint: Endpoint, credentials: Credentials, *, timeout_s: float) -> None:
    """One TLS handshake with ``endpoint``; ``ConfigError`` when TLS itself fails (see the module docstring).

    Returns quietly for a plaintext endpoint, after a good handshake, and when the server cannot be
    reached at all (refused, no route, no answer in time): waiting for the server is the caller's.
    """
    if not endpoint.tls:
        return
    context = client_context(credentials, endpoint.protocol)
    port = endpoint.port or 443
    shaken = False
    try:
        with (
            socket.create_connection((endpoint.host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=endpoint.host, do_handshake_on_connect=False) as tls,
        ):
            tls.do_handshake()
            shaken = True
            tls.sendall(_HTTP2_PREFACE if endpoint.protocol == "grpc" else _http_probe(endpoint))
            answer = tls.recv(1)
    except ssl.SSLCertVerificationError as exc:
        raise ConfigError(
            f"{endpoint.url}: the server's TLS certificate is not trusted: {exc.verify_message} "
            f"(checked against {credentials.ca_name()})"
        ) from None
    except ssl.SSLError as exc:
        reason = str(exc.reason or type(exc).__name__)
        if not shaken and reason in _CLOSED_REASONS:
            raise ConfigError(_cut_short(endpoint, credentials)) from None
        raise ConfigError(_refused(endpoint, credentials, reason)) from None
    except OSError:
        return
    if not answer and endpoint.protocol == "grpc":  # a gRPC server answers a preface with its SETTINGS, always
        raise ConfigError(_refused(endpoint, credentials, _CLOSED))


def _http_probe(endpoint: Endpoint) -> bytes:
    host = endpoint.address
    return f"GET /v2/health/live HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode("ascii")


def _refused(endpoint: Endpoint, credentials: Credentials, reason: str) -> str:
    if reason in _CLIENT_REFUSED or reason in _CLOSED_REASONS:
        how = (
            f"refused the TLS connection ({reason})"
            if reason in _CLIENT_REFUSED
            else "closed the connection right after the TLS handshake, without a word"
        )
        if not credentials.has_client_certificate:
            return (
                f"{endpoint.url} {how}: a server that requires a client certificate (mutual TLS) does this when it "
                "gets none; set client_certificate and client_key"
            )
        return (
            f"{endpoint.url} {how}: it does not accept this client's certificate "
            f"{str(credentials.client_certificate)!r} (issued by a CA the server does not trust, or expired)"
        )
    if reason in _NOT_TLS:
        return f"{endpoint.url}: the server does not speak TLS on this port ({reason}); use {_plain(endpoint)}://"
    return f"{endpoint.url}: the TLS handshake failed ({reason})"


def _cut_short(endpoint: Endpoint, credentials: Credentials) -> str:
    certificate = (
        f"it refused this client's certificate {str(credentials.client_certificate)!r}"
        if credentials.has_client_certificate
        else "it wants a client certificate and none was given (set client_certificate and client_key)"
    )
    return (
        f"{endpoint.url} closed the connection during the TLS handshake: this port may not speak TLS (then use "
        f"{_plain(endpoint)}://), or, under TLS 1.2, {certificate}"
    )


def _plain(endpoint: Endpoint) -> str:
    return "grpc" if endpoint.protocol == "grpc" else "http"
