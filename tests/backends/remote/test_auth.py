"""TLS and auth against real servers: Triton's own gRPC TLS (mutual), its restricted protocols, and nginx in front.

One Triton for the module: gRPC with ``--grpc-use-ssl-mutual`` and every gRPC protocol restricted to a key;
HTTP (plaintext: Triton has no HTTPS) with inference, metadata, config, statistics and shared memory
restricted to the same key. One nginx for the module (``proxy.py``): ``https://`` to Triton's HTTP port and
gRPC over TLS to Triton's gRPC port (mutual TLS upstream), both behind a bearer token. Certificates are made
here (``certs.py``). Secrets come from environment variables and files, as a deployment gives them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from monai_triton_ops import create_backend
from monai_triton_ops.backends.remote.shm import region as shm
from monai_triton_ops.client.transports.base import TransportSettings
from monai_triton_ops.errors import ConfigError, MonaiTritonError
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ... import triton_models
from ...server.conftest import wait_until
from . import certs, proxy
from .conftest import Open, serve

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[3]
MODEL = "ident"
KEY_HEADER = "admin-key"
TOKEN_ENV, KEY_ENV = "MTO_TEST_TRITON_TOKEN", "MTO_TEST_TRITON_ADMIN_KEY"
GRPC_RESTRICTED = "health,metadata,inference,shared-memory,model-config,model-repository,statistics"
HTTP_RESTRICTED = "metadata,inference,shared-memory,model-config,statistics"  # not health: the launcher polls it


@dataclass(frozen=True)
class Pki:
    ca: certs.Authority
    other: certs.Authority  # a CA nobody here trusts
    server: certs.Pair
    client: certs.Pair
    rogue: certs.Pair  # a client certificate from the other CA
    combined: Path  # the client's certificate and key in one PEM file


@dataclass(frozen=True)
class Secrets:
    token: str
    key: str


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = certs.authority(folder, "ca"), certs.authority(folder, "other-ca")
    client = ca.issue(folder, "client", server=False)
    combined = folder / "client-combined.pem"
    combined.write_bytes(client.cert.read_bytes() + client.key.read_bytes())
    return Pki(
        ca, other, ca.issue(folder, "server", server=True), client, other.issue(folder, "rogue", server=False), combined
    )


@pytest.fixture(scope="module")
def secret_values() -> Secrets:
    return Secrets(token=secrets.token_urlsafe(24), key=secrets.token_hex(16))


@pytest.fixture(scope="module")
def server(
    triton_install: TritonInstall, pki: Pki, secret_values: Secrets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTritonServer]:
    repo = tmp_path_factory.mktemp("auth") / "repo"
    triton_models.identity(repo, MODEL, dims=(-1, -1))
    key = f"{KEY_HEADER}={secret_values.key}"
    args = [
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={pki.server.cert}",
        f"--grpc-server-key={pki.server.key}",
        f"--grpc-root-cert={pki.ca.pem}",
        f"--grpc-restricted-protocol={GRPC_RESTRICTED}:{key}",
        f"--http-restricted-api={HTTP_RESTRICTED}:{key}",
    ]
    yield from serve(repo, tmp_path_factory.mktemp("auth_tmp"), extra_args=args)


@pytest.fixture(scope="module")
def nginx(
    server: LocalTritonServer, pki: Pki, secret_values: Secrets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[proxy.Proxy]:
    with proxy.nginx(
        tmp_path_factory.mktemp("nginx"),
        server=pki.server,
        token=secret_values.token,
        triton_http=server.http_port,
        triton_grpc=server.grpc_port,
        upstream_client=pki.client,
        upstream_ca=pki.ca.pem,
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, secret_values: Secrets) -> None:
    monkeypatch.setenv(TOKEN_ENV, secret_values.token)
    monkeypatch.setenv(KEY_ENV, secret_values.key)


def grpcs(server: LocalTritonServer) -> str:
    return f"grpcs://127.0.0.1:{server.grpc_port}"


def mutual(pki: Pki, **more: Any) -> dict[str, Any]:
    """Options of a client that mutual TLS and the restricted protocols accept."""
    return {
        "root_certificates": pki.ca.pem,
        "client_certificate": pki.client.cert,
        "client_key": pki.client.key,
        "restricted_keys": (f"{KEY_HEADER}=env:{KEY_ENV}",),
        **more,
    }


def _identity(backend: Any) -> None:
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_array_equal(backend.infer({"INPUT__0": x})["OUTPUT__0"], x)


def _inferences(backend: Any) -> int:
    """The model's inference count: Triton counts a request a moment after answering, and a count of 0 is left out of
    the reply (protobuf JSON omits zero fields), which is what CI once read right after the answer."""
    return int(backend.statistics()["model_stats"][0].get("inference_count", 0))


# -- TLS: Triton's own gRPC endpoint -------------------------------------------------------------------
def test_mutual_tls_with_the_right_ca_and_certificate_infers(
    server: LocalTritonServer, pki: Pki, open_backend: Open
) -> None:
    backend = open_backend(grpcs(server), MODEL, **mutual(pki))
    _identity(backend)
    assert backend.shared_memory == "system"  # the shared-memory protocol is restricted: the key opens it
    # statistics over the same mutual-TLS channel count the request
    assert wait_until(lambda: _inferences(backend) >= 1, timeout_s=10), backend.statistics()
    combined = mutual(pki, client_certificate=pki.combined, client_key=None)  # certificate and key in one file
    _identity(open_backend(f"{grpcs(server)}?shared_memory=none", MODEL, **combined))


def test_a_wrong_ca_fails_naming_the_server_and_the_ca_file(
    server: LocalTritonServer, pki: Pki, open_backend: Open
) -> None:
    with pytest.raises(ConfigError, match="TLS certificate is not trusted") as info:
        open_backend(grpcs(server), MODEL, **mutual(pki, root_certificates=pki.other.pem))
    assert grpcs(server) in str(info.value)
    assert str(pki.other.pem) in str(info.value)


def test_mutual_tls_without_a_client_certificate_is_refused(
    server: LocalTritonServer, pki: Pki, open_backend: Open
) -> None:
    options = mutual(pki, client_certificate=None, client_key=None)
    with pytest.raises(ConfigError, match=r"requires a client certificate .* set client_certificate and client_key"):
        open_backend(grpcs(server), MODEL, **options)
    rogue = mutual(pki, client_certificate=pki.rogue.cert, client_key=pki.rogue.key)
    with pytest.raises(ConfigError, match=r"does not accept this client's certificate .*rogue\.pem"):
        open_backend(grpcs(server), MODEL, **rogue)


# -- Triton's restricted protocols ------------------------------------------------------------------
@pytest.mark.parametrize("key", [None, "wrong"], ids=["missing-key", "wrong-key"])
@pytest.mark.parametrize("scheme", ["grpcs", "http"])
def test_a_missing_or_wrong_restricted_key_is_refused_clearly(
    server: LocalTritonServer,
    pki: Pki,
    open_backend: Open,
    scheme: str,
    key: str | None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    options = mutual(pki) if scheme == "grpcs" else {"restricted_keys": (f"{KEY_HEADER}=env:{KEY_ENV}",)}
    if key is None:
        options["restricted_keys"] = ()
    else:
        (tmp_path / "key").write_text(key + "\n")
        options["restricted_keys"] = (f"{KEY_HEADER}=file:{tmp_path / 'key'}",)
    url = grpcs(server) if scheme == "grpcs" else server.http_url
    header = f"triton-grpc-protocol-{KEY_HEADER}" if scheme == "grpcs" else KEY_HEADER
    # A refusal, not a server that is away: no readiness wait of 60 s, no retry; it names the header to send.
    with pytest.raises(ConfigError, match=rf"refused access .*expecting header '{header}'.*restricted_keys"):
        open_backend(f"{url}?ready_timeout_s=60", MODEL, **options)


def test_the_restricted_key_opens_http_too(server: LocalTritonServer, open_backend: Open) -> None:
    backend = open_backend(server.http_url, MODEL, restricted_keys=(f"{KEY_HEADER}=env:{KEY_ENV}",))
    _identity(backend)
    assert backend.shared_memory == "system"


def test_a_batch_size_the_server_contradicts_is_refused(
    server: LocalTritonServer, pki: Pki, open_backend: Open
) -> None:
    with pytest.raises(ConfigError, match=r"max_batch_size=4, but .* serves it with max_batch_size 0"):
        open_backend(grpcs(server), MODEL, **mutual(pki, max_batch_size=4))


# -- behind a TLS-terminating proxy (nginx) -----------------------------------------------------------
@pytest.mark.parametrize("scheme", ["https", "grpcs"])
def test_through_a_proxy_with_a_bearer_token(
    nginx: proxy.Proxy, pki: Pki, open_backend: Open, scheme: str, tmp_path: Path
) -> None:
    url = nginx.https_url if scheme == "https" else nginx.grpcs_url
    (tmp_path / "token").write_text(f"{os.environ[TOKEN_ENV]}\n")
    options = {
        "root_certificates": pki.ca.pem,
        "auth_token": f"file:{tmp_path / 'token'}",
        "restricted_keys": (f"{KEY_HEADER}=env:{KEY_ENV}",),
        "shared_memory": "none",
    }
    _identity(open_backend(url, MODEL, **options))
    with pytest.raises(ConfigError, match=r"refused access"):
        open_backend(url, MODEL, **{**options, "auth_token": None})
    (tmp_path / "token").write_text("not-the-token")
    with pytest.raises(ConfigError, match=r"refused access"):
        open_backend(url, MODEL, **options)
    with pytest.raises(ConfigError, match="TLS certificate is not trusted") as info:
        open_backend(url, MODEL, **{**options, "root_certificates": pki.other.pem})
    assert str(pki.other.pem) in str(info.value)


@pytest.mark.usefixtures("restore_console")
def test_repo_check_reaches_a_mutual_tls_server_and_one_behind_a_bearer_token(
    server: LocalTritonServer, nginx: proxy.Proxy, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    """``repo check --server`` speaks through the client layer the backend uses: the same TLS material, token and
    restricted keys (named, never given) reach the same servers; without them it is refused clearly (exit 2)."""
    from monai_triton_ops.cli import main

    key = ["--restricted-key", f"{KEY_HEADER}=env:{KEY_ENV}"]
    ca = ["--root-certificates", str(pki.ca.pem)]
    certificate = ["--client-certificate", str(pki.client.cert), "--client-key", str(pki.client.key)]
    token = ["--auth-token", f"env:{TOKEN_ENV}"]
    for url, given in ((grpcs(server), [*ca, *certificate, *key]), (nginx.https_url, [*ca, *token, *key])):
        assert main(["repo", "check", "--server", url, *given]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"server {url}"
        assert out[2].split()[:3] == [MODEL, "1", "READY"]
    assert main(["repo", "check", "--server", nginx.https_url, *ca, *key]) == 2
    assert "refused access" in capsys.readouterr().err
    assert main(["repo", "check", "--server", grpcs(server), *ca, *key]) == 2
    assert "client certificate" in capsys.readouterr().err


# -- several TLS servers behind one backend (a fleet) ------------------------------------------------
def test_every_server_of_a_tls_fleet_is_reached_with_the_same_material_and_headers(
    server: LocalTritonServer, nginx: proxy.Proxy, pki: Pki, open_backend: Open
) -> None:
    """Triton's mutual-TLS port and nginx's gRPC over TLS in one spec: the CA, client certificate, bearer token and
    restricted key reach both, or a request sent to one of them would be refused (never failed over)."""
    fleet = f"grpcs://127.0.0.1:{server.grpc_port},127.0.0.1:{nginx.grpcs_port}"
    backend = open_backend(fleet, MODEL, **mutual(pki, auth_token=f"env:{TOKEN_ENV}"))
    for _ in range(4):  # round robin: two requests on each server
        _identity(backend)
    assert set(backend.servers.values()) == {"up"}, backend.servers  # type: ignore[attr-defined]
    assert backend.events["failed_over"] == 0  # type: ignore[attr-defined]


@contextlib.contextmanager
def _tls_port(pair: certs.Pair) -> Iterator[int]:
    """A loopback port that completes TLS handshakes with ``pair``'s certificate and then says nothing."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                context.wrap_socket(conn, server_side=True)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_a_server_of_a_tls_fleet_whose_certificate_is_not_trusted_fails_the_open_naming_it(
    server: LocalTritonServer, pki: Pki, open_backend: Open, tmp_path: Path
) -> None:
    """Each server gets the handshake of its own, not only the first: a TLS problem is no wait on any of them."""
    with _tls_port(pki.other.issue(tmp_path, "impostor", server=True)) as port:
        spec = f"grpcs://127.0.0.1:{server.grpc_port},127.0.0.1:{port}?ready_timeout_s=60"
        with pytest.raises(ConfigError, match="TLS certificate is not trusted") as info:
            open_backend(spec, MODEL, **mutual(pki))
    assert str(info.value).startswith(f"grpcs://127.0.0.1:{port}: "), info.value
    assert str(pki.ca.pem) in str(info.value)


# -- shared memory of a client that was killed: the janitor speaks as the client did ---------------------
def _registered(server: LocalTritonServer, key: str, pid: int) -> list[str]:
    """Regions of process ``pid`` the server still holds (asked over HTTP, with the restricted key)."""
    client = httpclient.InferenceServerClient(server.http_address, connection_timeout=10, network_timeout=10)
    try:
        regions = client.get_system_shared_memory_status(headers={KEY_HEADER: key})
    finally:
        client.close()
    return sorted(r["name"] for r in regions if r["name"].startswith(f"{shm.PREFIX}{pid}_"))


def _janitor_command_line(pid: int) -> str:
    """The command line of the janitor watching process ``pid`` (what ``ps`` shows of it)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            words = (entry / "cmdline").read_bytes().decode().split("\0")
            if any(w.endswith("janitor.py") for w in words) and str(pid) in words:
                return " ".join(words)
    raise AssertionError(f"no janitor watches process {pid}")


@pytest.mark.parametrize("scheme", ["grpcs", "https"])
def test_the_regions_of_a_killed_client_are_unregistered_with_its_tls_and_keys(
    server: LocalTritonServer, nginx: proxy.Proxy, pki: Pki, secret_values: Secrets, scheme: str
) -> None:
    """SIGKILL leaves no cleanup of the client's own: its janitor unregisters the regions on a server that takes
    only the client's credentials (gRPC: mutual TLS and the restricted key; HTTPS through nginx: the CA, the
    bearer token and the key of Triton's restricted shared-memory API), then unlinks them. The secrets reach the
    janitor on its pipe, never on its command line."""
    if scheme == "grpcs":
        url, options = grpcs(server), mutual(pki)
    else:
        url = nginx.https_url
        options = {
            "root_certificates": pki.ca.pem,
            "auth_token": f"env:{TOKEN_ENV}",
            "restricted_keys": (f"{KEY_HEADER}=env:{KEY_ENV}",),
        }
    options = {k: v if isinstance(v, tuple | str) else str(v) for k, v in options.items()}
    command = [sys.executable, "-m", "tests.backends.remote.child", "hold", f"{url}?shared_memory=system", MODEL]
    child = subprocess.Popen(
        [*command, json.dumps(options)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("ready"), line
        regions = json.loads(line.split(" ", 1)[1])
        assert regions
        assert _registered(server, secret_values.key, child.pid) == regions
        janitor = _janitor_command_line(child.pid)
        for text in (secret_values.key, secret_values.token, str(pki.client.key), "-----BEGIN"):
            assert text not in janitor
        child.kill()
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait(timeout=30)

    def gone() -> bool:
        files = list(shm.SHM_DIR.glob(f"{shm.PREFIX}{child.pid}_*"))
        return not files and not _registered(server, secret_values.key, child.pid)

    assert wait_until(gone, timeout_s=60), _registered(server, secret_values.key, child.pid)


# -- secrets stay secret ----------------------------------------------------------------------------
def test_no_secret_in_any_log_line_error_or_repr(
    server: LocalTritonServer,
    nginx: proxy.Proxy,
    pki: Pki,
    secret_values: Secrets,
    open_backend: Open,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Every path a secret travels, right and wrong, at DEBUG; then every captured line is searched for it."""
    wrong = secrets.token_urlsafe(24)
    (tmp_path / "wrong").write_text(wrong)
    texts: list[str] = []
    proxied = {"root_certificates": pki.ca.pem, "restricted_keys": (f"{KEY_HEADER}=env:{KEY_ENV}",)}
    attempts = [
        (nginx.https_url, {**proxied, "auth_token": f"env:{TOKEN_ENV}"}),
        (nginx.https_url, {**proxied, "auth_token": f"file:{tmp_path / 'wrong'}"}),  # nginx echoes it in its 401
        (nginx.grpcs_url, {**proxied, "auth_token": f"file:{tmp_path / 'wrong'}"}),
        (grpcs(server), mutual(pki)),
        (grpcs(server), mutual(pki, restricted_keys=(f"{KEY_HEADER}=file:{tmp_path / 'wrong'}",))),
        (server.http_url, {"restricted_keys": (f"{KEY_HEADER}=file:{tmp_path / 'wrong'}",)}),
    ]
    with caplog.at_level(logging.DEBUG):
        for url, options in attempts:
            try:
                backend = open_backend(url, MODEL, **options)
                texts += [repr(backend), repr(backend.options)]
                _identity(backend)
            except MonaiTritonError as exc:
                texts.append("".join(traceback.format_exception(exc)))  # the whole chain, causes included
            texts.append(repr(TransportSettings.from_options(create_backend(url, MODEL, **options).options)))  # type: ignore[arg-type]
    texts += [record.getMessage() for record in caplog.records]
    captured = capfd.readouterr()
    texts += [captured.out, captured.err]
    assert any("refused access" in text for text in texts)  # the wrong ones were refused...
    assert any("unauthorized: <redacted>" in text for text in texts)  # ...and nginx's echo of one was redacted
    for secret in (secret_values.token, secret_values.key, wrong):
        leaks = [text for text in texts if secret in text]
        assert not leaks, f"a secret leaked into: {leaks[0][:500]}"


def test_a_secret_is_never_an_option_value(open_backend: Open, tmp_path: Path) -> None:
    secret = secrets.token_urlsafe(16)
    for option, value in (("auth_token", secret), ("restricted_keys", f"{KEY_HEADER}={secret}")):
        with pytest.raises(ConfigError, match=r"env:VARIABLE or file:PATH") as info:
            create_backend(f"grpcs://127.0.0.1:1?{option}={value}", MODEL)
        assert secret not in str(info.value)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"auth_token": "env:MTO_TEST_NOT_SET"}, r"auth_token: environment variable MTO_TEST_NOT_SET is not set"),
        ({"auth_token": "file:/nonexistent/token"}, r"auth_token: the file '/nonexistent/token' cannot be read"),
        ({"client_key": "/some/key.pem"}, r"client_key is given without client_certificate"),
        ({"headers": ("x-api-key=env:MTO_TEST_EMPTY",)}, r"headers \(x-api-key\): env:MTO_TEST_EMPTY is empty"),
    ],
)
def test_a_secret_that_cannot_be_had_fails_at_open(
    options: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MTO_TEST_EMPTY", "")
    backend = create_backend("grpcs://127.0.0.1:1?ready_timeout_s=1", MODEL, **options)
    with pytest.raises(ConfigError, match=match):
        backend.open()


def test_tls_files_for_a_plaintext_server_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"root_certificates given, but grpc://127\.0\.0\.1:1 does not use TLS"):
        create_backend("grpc://127.0.0.1:1", MODEL, root_certificates="/ca.pem")
