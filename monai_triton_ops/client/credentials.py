"""What a remote backend proves itself with: TLS material and auth headers, with secrets kept out of sight.

A secret never travels as an option's value: an option value shows in ``ps`` (a flag), in logs (the
run line, the settings line) and in the spec. Options name where a secret is instead, and it is read
once, at open::

    auth_token=env:TRITON_TOKEN                      the token is in this environment variable
    auth_token=file:/var/run/secrets/triton/token    ... or in this file (one trailing newline dropped)
    restricted_keys=triton-admin-key=env:ADMIN_KEY   Triton's restricted-protocol header and its value
    headers=x-api-key=file:/run/secrets/api-key      any other header

A :class:`Secret`'s value is never in its ``repr`` or ``str``, and :func:`redact` takes every secret in use
out of a text (a server's error message, say) before it reaches an error or a log line.

Headers go on every call, gRPC and HTTP alike, through a tritonclient client plugin
(:class:`HeaderPlugin`): the bearer token as ``authorization: Bearer ...``, each restricted-protocol key as
its header over HTTP and as ``triton-grpc-protocol-<key>`` over gRPC (Triton's own prefix for gRPC).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from tritonclient.utils import InferenceServerException

from ..errors import ConfigError

E = TypeVar("E", bound=BaseException)

#: Triton 2.51 reads a restricted gRPC protocol's key from this header prefix plus the key's name.
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"
#: What a redacted secret reads as.
REDACTED = "<redacted>"
#: A header name both protocols take (gRPC metadata keys are lower case; no ``:`` or ``grpc-`` names).
_HEADER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
#: Headers the clients set themselves.
_RESERVED_PREFIXES = ("grpc-", "content-")
_RESERVED = frozenset({"host", "te", "connection", "transfer-encoding", "user-agent", "accept-encoding"})
_SOURCES = ("env:", "file:")


@dataclass(frozen=True)
class Secret:
    """A secret value and where it came from; only ``source`` is ever shown."""

    value: str = field(repr=False, compare=False)
    source: str

    def __repr__(self) -> str:
        return f"Secret(from {self.source})"

    __str__ = __repr__


def check_reference(option: str, reference: str) -> None:
    """``env:NAME`` or ``file:PATH``; anything else is refused without showing it (it may be the secret itself)."""
    kind, _, target = reference.partition(":")
    if f"{kind}:" not in _SOURCES or not target.strip():
        raise ConfigError(
            f"{option} must say where the secret is, env:VARIABLE or file:PATH, not the secret itself (an option's "
            f"value shows in ps, logs and the backend spec); got a value of {len(reference)} characters that "
            "starts with neither"
        )


def read_secret(option: str, reference: str, environ: Mapping[str, str] | None = None) -> Secret:
    """The secret ``reference`` points at (``env:NAME`` or ``file:PATH``), checked to fit in a header."""
    check_reference(option, reference)
    kind, _, target = reference.partition(":")
    target = target.strip()
    if kind == "env":
        env = os.environ if environ is None else environ
        if target not in env:
            raise ConfigError(f"{option}: environment variable {target} is not set")
        value = env[target]
    else:
        try:
            value = Path(target).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{option}: the file {target!r} cannot be read: {_why(exc)}") from None
        value = value[:-1] if value.endswith("\n") else value
        value = value[:-1] if value.endswith("\r") else value
    if not value:
        raise ConfigError(f"{option}: {reference} is empty")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) or not value.isascii():
        raise ConfigError(f"{option}: {reference} holds control or non-ASCII characters; a header cannot carry them")
    secret = Secret(value, reference)
    _remember(secret)
    return secret


def check_header_entry(option: str, entry: str) -> str:
    """``NAME=env:VAR`` / ``NAME=file:PATH``: the header name (lower case), or ``ConfigError``."""
    name, sep, reference = entry.partition("=")
    name = name.strip().lower()
    if not sep or not _HEADER_NAME.match(name):
        raise ConfigError(
            f"{option}: each entry is HEADER=env:VARIABLE or HEADER=file:PATH with a header name of letters, digits, "
            f"'-', '_' or '.'; got an entry of {len(entry)} characters"
        )
    if name.startswith(_RESERVED_PREFIXES) or name in _RESERVED:
        raise ConfigError(f"{option}: header {name!r} is set by the client itself and cannot be given")
    check_reference(f"{option} ({name})", reference.strip())
    return name


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """The TLS material and the headers of one backend, read once at open (every file and variable)."""

    root_certificates: bytes | None = field(default=None, repr=False)  # PEM of a private CA
    root_certificates_path: Path | None = None
    client_certificate: Path | None = None  # PEM chain, and its key when client_key is not given
    client_key: Path | None = None
    client_chain_pem: bytes | None = field(default=None, repr=False)
    client_key_pem: bytes | None = field(default=None, repr=False)
    headers: tuple[tuple[str, Secret], ...] = ()  # sent as they are on both protocols
    restricted: tuple[tuple[str, Secret], ...] = ()  # Triton's restricted-protocol keys

    @property
    def has_client_certificate(self) -> bool:
        return self.client_certificate is not None

    def ca_name(self) -> str:
        """How messages name the CAs this client trusts."""
        if self.root_certificates_path is not None:
            return f"the CA file {str(self.root_certificates_path)!r} (root_certificates)"
        return "the system's CA certificates (no root_certificates given)"

    def headers_for(self, protocol: str) -> dict[str, str]:
        """Every header of a call over ``protocol`` (``grpc`` or ``http``), values included."""
        headers = {name: secret.value for name, secret in self.headers}
        prefix = GRPC_RESTRICTED_PREFIX if protocol == "grpc" else ""
        headers.update({prefix + name: secret.value for name, secret in self.restricted})
        return headers

    def describe_headers(self, protocol: str) -> str:
        """The names of the headers sent (never their values), for messages."""
        names = sorted(self.headers_for(protocol))
        return ", ".join(names) if names else "none"

    def plugin(self, protocol: str) -> HeaderPlugin | None:
        headers = self.headers_for(protocol)
        return HeaderPlugin(headers) if headers else None


class CredentialOptions(Protocol):
    """The options this module reads (``RemoteOptions`` has them)."""

    @property
    def root_certificates(self) -> Path | None: ...
    @property
    def client_certificate(self) -> Path | None: ...
    @property
    def client_key(self) -> Path | None: ...
    @property
    def auth_token(self) -> str | None: ...
    @property
    def headers(self) -> tuple[str, ...]: ...
    @property
    def restricted_keys(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, kw_only=True)
class CredentialRefs:
    """The credential options given on their own (a tool's command line): paths, and references to secrets."""

    root_certificates: Path | None = None
    client_certificate: Path | None = None
    client_key: Path | None = None
    auth_token: str | None = None
    headers: tuple[str, ...] = ()
    restricted_keys: tuple[str, ...] = ()


def check_credential_options(options: CredentialOptions) -> None:
    """What can be checked without reading a secret, option by option: reference forms, header names.

    Deploy-time settings parse each option on its own (``app_settings.py``), so what needs two options
    (a key needs its certificate) is checked at open, by :func:`load_credentials`.
    """
    if options.auth_token is not None:
        check_reference("auth_token", options.auth_token)
    names = ["authorization"] if options.auth_token is not None else []
    names += [check_header_entry("headers", entry) for entry in options.headers]
    if len(set(names)) != len(names):
        raise ConfigError(f"headers: a header is given twice in {names} (auth_token sets 'authorization')")
    keys = [check_header_entry("restricted_keys", entry) for entry in options.restricted_keys]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"restricted_keys: a key is given twice in {keys}")


def load_credentials(options: CredentialOptions, environ: Mapping[str, str] | None = None) -> Credentials:
    """Read every file and variable the options name; each problem is a ``ConfigError`` naming the option."""
    check_credential_options(options)
    if options.client_key is not None and options.client_certificate is None:
        raise ConfigError("client_key is given without client_certificate: mutual TLS needs both (PEM files)")
    built: list[tuple[str, Secret]] = []
    keys: list[tuple[str, Secret]] = []
    if options.auth_token is not None:
        token = read_secret("auth_token", options.auth_token, environ)
        bearer = Secret(f"Bearer {token.value}", token.source)
        _remember(bearer)
        built.append(("authorization", bearer))
    given = (("headers", options.headers, built), ("restricted_keys", options.restricted_keys, keys))
    for option, entries, into in given:
        for entry in entries:
            name, _, reference = (part.strip() for part in entry.partition("="))
            into.append((name.lower(), read_secret(f"{option} ({name})", reference, environ)))
    chain, key = _client_pair(options.client_certificate, options.client_key)
    return Credentials(
        root_certificates=_read_file("root_certificates", options.root_certificates),
        root_certificates_path=options.root_certificates,
        client_certificate=options.client_certificate,
        client_key=options.client_key,
        client_chain_pem=chain,
        client_key_pem=key,
        headers=tuple(built),
        restricted=tuple(keys),
    )


_PEM_KEY = re.compile(rb"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?-----END \1PRIVATE KEY-----\s*", re.DOTALL)


def _client_pair(certificate: Path | None, key: Path | None) -> tuple[bytes | None, bytes | None]:
    """The client's certificate chain and key as PEM; without ``client_key`` the key is in the certificate file."""
    chain = _read_file("client_certificate", certificate)
    if chain is None:
        return None, None
    if key is not None:
        return chain, _read_file("client_key", key)
    found = _PEM_KEY.search(chain)
    if found is None:
        raise ConfigError(
            f"client_certificate {str(certificate)!r} holds no private key: give client_key too (a PEM file)"
        )
    return _PEM_KEY.sub(b"", chain), found.group(0)


class HeaderPlugin:
    """Puts the backend's headers on every call a tritonclient client makes (registered once per client).

    tritonclient calls a registered plugin with each call's request before it is sent; it needs only
    ``__call__`` (the shape of tritonclient's ``InferenceServerClientPlugin``).
    """

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)

    def __call__(self, request: Any) -> None:
        request.headers.update(self._headers)

    def __repr__(self) -> str:
        return f"HeaderPlugin({sorted(self._headers)})"


# -- keeping secrets out of texts ------------------------------------------------------------------
_in_use: set[str] = set()
_in_use_lock = threading.Lock()


def _remember(secret: Secret) -> None:
    with _in_use_lock:
        _in_use.add(secret.value)


def redact(text: str) -> str:
    """``text`` with every secret this process has read replaced by ``<redacted>`` (longest first)."""
    with _in_use_lock:
        values = sorted(_in_use, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def scrub(exc: E) -> E:
    """``exc`` with every secret taken out of its text, to be the ``__cause__`` of our own error, whose traceback
    (``-l DEBUG``) prints it. A tritonclient ``InferenceServerException`` keeps its text in attributes of its own:
    it is made anew, redacted, through its public constructor and getters (``message()``, ``status()``,
    ``debug_details()``), with the original's traceback; any other exception has its ``args`` redacted in place."""
    if isinstance(exc, InferenceServerException):
        message, details = exc.message(), exc.debug_details()
        clean = InferenceServerException(
            redact(message) if isinstance(message, str) else message,
            status=exc.status(),
            debug_details=redact(details) if isinstance(details, str) else details,
        )
        return cast(E, clean.with_traceback(exc.__traceback__))
    exc.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in exc.args)
    return exc


def _read_file(option: str, path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"{option} {str(path)!r} cannot be read: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) and exc.strerror else None) or type(exc).__name__
