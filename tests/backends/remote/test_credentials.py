"""Credentials without a server: what options may say, how secrets are read, and that they are never shown.

The same paths against real servers (Triton's mutual TLS, its restricted protocols, nginx) are in ``test_auth.py``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from monai_triton_ops.backends.remote.options import RemoteOptions
from monai_triton_ops.client import credentials
from monai_triton_ops.client.credentials import (
    REDACTED,
    HeaderPlugin,
    Secret,
    load_credentials,
    read_secret,
    redact,
    scrub,
)
from monai_triton_ops.errors import ConfigError

from .certs import authority

#: Where the token is: a reference, not a secret (what the options take).
TOKEN_REFERENCE = "env:MTO_TOKEN"  # noqa: S105 - a reference to a variable, not a password


def options(**given: Any) -> RemoteOptions:
    return RemoteOptions(**given)


def test_a_secret_shows_where_it_came_from_never_its_value(tmp_path: Path) -> None:
    value = secrets.token_hex(12)
    secret = read_secret("auth_token", "env:MTO_UNIT_TOKEN", {"MTO_UNIT_TOKEN": value})
    assert secret.value == value
    for text in (repr(secret), str(secret), f"{secret}", repr([secret])):
        assert value not in text
        assert "env:MTO_UNIT_TOKEN" in text


def test_a_file_secret_loses_one_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    assert read_secret("auth_token", f"file:{tmp_path / 'token'}").value == "abc"
    (tmp_path / "token").write_text("abc\r\n")
    assert read_secret("auth_token", f"file:{tmp_path / 'token'}").value == "abc"


@pytest.mark.parametrize(
    ("reference", "environ", "match"),
    [
        ("env:MTO_UNIT_NONE", {}, "environment variable MTO_UNIT_NONE is not set"),
        ("env:MTO_UNIT_EMPTY", {"MTO_UNIT_EMPTY": ""}, "env:MTO_UNIT_EMPTY is empty"),
        ("env:MTO_UNIT_LINES", {"MTO_UNIT_LINES": "a\nb"}, "control or non-ASCII characters"),
        ("env:MTO_UNIT_UTF", {"MTO_UNIT_UTF": "caf\u00e9"}, "control or non-ASCII characters"),
        ("file:/nonexistent/secret", {}, "the file '/nonexistent/secret' cannot be read: No such file"),
        ("vault:secret/triton", {}, "env:VARIABLE or file:PATH, not the secret itself"),
        ("env:", {}, "env:VARIABLE or file:PATH"),
    ],
)
def test_a_secret_that_cannot_be_read_is_named_not_shown(reference: str, environ: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        read_secret("auth_token", reference, environ)
    for value in environ.values():
        if value:
            assert value not in str(info.value)


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"auth_token": "plain-token"}, r"auth_token must say where the secret is"),
        ({"headers": ("x-api-key",)}, r"HEADER=env:VARIABLE or HEADER=file:PATH"),
        ({"headers": ("x api=env:A",)}, r"HEADER=env:VARIABLE"),
        ({"headers": ("grpc-timeout=env:A",)}, r"'grpc-timeout' is set by the client itself"),
        ({"headers": ("Host=env:A",)}, r"'host' is set by the client itself"),
        ({"headers": ("authorization=env:A",), "auth_token": "env:B"}, r"given twice"),
        ({"restricted_keys": ("k=env:A", "K=file:/b")}, r"restricted_keys: a key is given twice"),
        ({"restricted_keys": ("admin-key=hunter2",)}, r"restricted_keys \(admin-key\) must say where"),
    ],
)
def test_options_refuse_what_would_show_a_secret_or_cannot_be_a_header(given: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        options(**given)
    assert "hunter2" not in str(info.value)
    assert "plain-token" not in str(info.value)


def test_headers_per_protocol_and_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"MTO_TOKEN": "t0k", "MTO_KEY": "k3y", "MTO_API": "ap1"}
    creds = load_credentials(
        options(auth_token=TOKEN_REFERENCE, restricted_keys=("Admin-Key=env:MTO_KEY",), headers=("X-Api=env:MTO_API",)),
        env,
    )
    assert creds.headers_for("http") == {"authorization": "Bearer t0k", "x-api": "ap1", "admin-key": "k3y"}
    assert creds.headers_for("grpc") == {
        "authorization": "Bearer t0k",
        "x-api": "ap1",
        "triton-grpc-protocol-admin-key": "k3y",
    }
    assert creds.describe_headers("grpc") == "authorization, triton-grpc-protocol-admin-key, x-api"
    plugin = creds.plugin("grpc")
    assert isinstance(plugin, HeaderPlugin)
    request = type("Request", (), {"headers": {"x-other": "1"}})()
    plugin(request)
    assert request.headers["triton-grpc-protocol-admin-key"] == "k3y"
    assert request.headers["x-other"] == "1"
    for text in (repr(plugin), repr(creds)):
        assert not [value for value in env.values() if value in text]
    assert load_credentials(options(), {}).plugin("http") is None


def test_redaction_takes_every_secret_read_out_of_a_text_and_an_exception() -> None:
    value = secrets.token_urlsafe(20)
    load_credentials(options(auth_token=TOKEN_REFERENCE), {"MTO_TOKEN": value})
    assert redact(f"401: got 'Bearer {value}'") == f"401: got '{REDACTED}'"  # the longest match first
    assert redact(f"echo {value}!") == f"echo {REDACTED}!"
    exc = OSError(f"reset after {value}")
    assert value not in str(scrub(exc))

    foreign = InferenceServerException(f"[401] {value}", status="401", debug_details=f"sent {value}")
    clean = scrub(foreign)  # tritonclient's exception keeps its text apart: made anew through its public API
    assert isinstance(clean, InferenceServerException)
    assert value not in str(clean)
    assert value not in clean.message()
    assert value not in clean.debug_details()
    assert clean.status() == "401"


def test_a_client_key_may_be_in_the_certificate_file(tmp_path: Path) -> None:
    pair = authority(tmp_path, "ca").issue(tmp_path, "client", server=False)
    combined = tmp_path / "combined.pem"
    combined.write_bytes(pair.cert.read_bytes() + pair.key.read_bytes())
    creds = load_credentials(options(client_certificate=combined), {})
    assert creds.client_key_pem == pair.key.read_bytes()
    assert creds.client_chain_pem is not None
    assert b"PRIVATE KEY" not in creds.client_chain_pem
    assert b"BEGIN CERTIFICATE" in creds.client_chain_pem
    with pytest.raises(ConfigError, match=r"holds no private key: give client_key too"):
        load_credentials(options(client_certificate=pair.cert), {})
    with pytest.raises(ConfigError, match=r"client_key is given without client_certificate"):
        load_credentials(options(client_key=pair.key), {})
    with pytest.raises(ConfigError, match=r"root_certificates '/nonexistent/ca.pem' cannot be read"):
        load_credentials(options(root_certificates=Path("/nonexistent/ca.pem")), {})


def test_a_root_certificates_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    from monai_triton_ops.client.tls import client_context

    (tmp_path / "ca.pem").write_text("not a certificate\n")
    creds = load_credentials(options(root_certificates=tmp_path / "ca.pem"), {})
    with pytest.raises(ConfigError, match=r"root_certificates .*ca\.pem' holds no PEM certificate"):
        client_context(creds, "grpc")


def test_only_values_read_are_remembered_for_redaction() -> None:
    before = set(credentials._in_use)
    with pytest.raises(ConfigError):
        read_secret("auth_token", "env:MTO_UNIT_NOT_THERE", {})
    assert credentials._in_use == before
    read_secret("auth_token", "env:MTO_UNIT_THERE", {"MTO_UNIT_THERE": "remembered-value"})
    assert credentials._in_use == before | {"remembered-value"}
    assert Secret("x", "env:A") == Secret("y", "env:A")  # a secret's value takes no part in comparisons either


def test_the_janitor_gets_the_clients_material_and_headers_and_shows_none_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pool hands the shared-memory janitor (on its pipe): the PEM bytes and every header, values included,
    through one line of text; its repr names the URL only. An HTTPS client certificate loads from a temporary file
    (mkstemp: 0600) that is gone once loaded (ssl reads certificates from files only). Real servers: test_auth.py."""
    from monai_triton_ops.backends.remote.shm import janitor
    from monai_triton_ops.backends.remote.shm.pool import janitor_access
    from monai_triton_ops.client import tls
    from monai_triton_ops.client.endpoints import Endpoint
    from monai_triton_ops.client.transports.base import TransportSettings
    from monai_triton_ops.client.transports.grpc import GrpcTransport

    ca = authority(tmp_path, "ca")
    pair = ca.issue(tmp_path, "client", server=False)
    key = secrets.token_hex(8)
    given = options(
        root_certificates=ca.pem,
        client_certificate=pair.cert,
        client_key=pair.key,
        auth_token=TOKEN_REFERENCE,
        restricted_keys=("admin-key=env:MTO_KEY",),
    )
    creds = load_credentials(given, {"MTO_TOKEN": "the-token", "MTO_KEY": key})
    transport = GrpcTransport(Endpoint.parse("grpcs://127.0.0.1:1"), TransportSettings(credentials=creds))
    try:  # a channel connects at its first call: none is made
        access = janitor_access(transport)
    finally:
        transport.close()
    assert janitor.ServerAccess.decode(access.encode()) == access
    assert "\n" not in access.encode()
    assert access.url == "grpcs://127.0.0.1:1"
    assert dict(access.headers) == {"authorization": "Bearer the-token", "triton-grpc-protocol-admin-key": key}
    assert access.client_key == pair.key.read_bytes()
    for hidden in (key, "the-token", "PRIVATE KEY"):
        assert hidden not in repr(access)
    made: list[str] = []
    real_mkstemp = tls.tempfile.mkstemp

    def mkstemp(**kwargs: Any) -> tuple[int, str]:  # the real one, its file's mode and path noted
        fd, path = real_mkstemp(**kwargs)
        made.append(f"{os.stat(path).st_mode & 0o777:o} {path}")
        return fd, path

    monkeypatch.setattr(tls.tempfile, "mkstemp", mkstemp)
    context = tls.http_context_factory(janitor.credentials_of(access))()
    assert context.verify_mode.name == "CERT_REQUIRED"
    assert len(made) == 1
    mode, path = made[0].split(" ", 1)
    assert mode == "600"
    assert not os.path.exists(path)  # the key's temporary file went once loaded
