"""A real TLS-terminating proxy in front of a local Triton: nginx from Debian's packages, on loopback.

Triton's HTTP endpoint has no TLS of its own, so ``https://`` is what a deployment puts in front of it:
an ingress or a proxy. This one terminates TLS with a certificate the tests made, checks a bearer token
(``401`` otherwise, with a body that echoes the ``authorization`` header it got, as careless proxies do:
the client must keep that out of its errors), and forwards HTTP to Triton's HTTP port and gRPC (HTTP/2)
to Triton's gRPC port, itself over mutual TLS when Triton's gRPC is.

nginx is installed with apt-get when missing (as root; ``nginx-light``, a few seconds once the package
lists are there); elsewhere the tests that need it fail with the command to run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from monai_triton_ops.packaging.programs import ensure_programs
from monai_triton_ops.server.ports import pick_free_ports
from monai_triton_ops.server.process import die_with_parent

from .certs import Pair

START_TIMEOUT_S = 30.0

CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    client_max_body_size 0;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    server {{
        listen 127.0.0.1:{https_port} ssl;
        location / {{
            if ($http_authorization != "Bearer {token}") {{ return 401 "unauthorized: $http_authorization\\n"; }}
            proxy_pass http://127.0.0.1:{triton_http};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
    server {{
        listen 127.0.0.1:{grpcs_port} ssl http2;
        location / {{
            if ($http_authorization != "Bearer {token}") {{ return 401; }}
            grpc_pass {upstream};
{upstream_tls}
        }}
    }}
}}
"""

UPSTREAM_TLS = """\
            grpc_ssl_certificate {client_cert};
            grpc_ssl_certificate_key {client_key};
            grpc_ssl_trusted_certificate {ca};
            grpc_ssl_verify on;
            grpc_ssl_name localhost;"""


@dataclass(frozen=True)
class Proxy:
    https_port: int
    grpcs_port: int
    folder: Path

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"

    @property
    def grpcs_url(self) -> str:
        return f"grpcs://127.0.0.1:{self.grpcs_port}"


@contextlib.contextmanager
def nginx(
    folder: Path,
    *,
    server: Pair,
    token: str,
    triton_http: int,
    triton_grpc: int,
    upstream_client: Pair | None = None,
    upstream_ca: Path | None = None,
) -> Iterator[Proxy]:
    """nginx on two free loopback ports (HTTPS and gRPC over TLS), stopped afterwards."""
    ensure_programs({"nginx": "nginx-light"}, why="the https:// tests (a TLS-terminating proxy)")
    program = shutil.which("nginx") or "/usr/sbin/nginx"
    folder.mkdir(parents=True, exist_ok=True)
    https_port, grpcs_port = pick_free_ports(2)
    upstream_tls = ""
    if upstream_client is not None:
        upstream_tls = UPSTREAM_TLS.format(
            client_cert=upstream_client.cert, client_key=upstream_client.key, ca=upstream_ca
        )
    conf = folder / "nginx.conf"
    conf.write_text(
        CONF.format(
            dir=folder,
            cert=server.cert,
            key=server.key,
            token=token,
            https_port=https_port,
            grpcs_port=grpcs_port,
            triton_http=triton_http,
            upstream=f"{'grpcs' if upstream_client else 'grpc'}://127.0.0.1:{triton_grpc}",
            upstream_tls=upstream_tls,
        )
    )
    conf.chmod(0o600)  # it holds the token
    with open(folder / "stderr.log", "wb") as out:
        process = subprocess.Popen(
            [program, "-p", str(folder), "-c", str(conf), "-e", str(folder / "error.log")],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
    try:
        _wait_listening(process, folder, (https_port, grpcs_port))
        yield Proxy(https_port, grpcs_port, folder)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _wait_listening(process: subprocess.Popen[bytes], folder: Path, ports: tuple[int, ...]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (folder / "error.log").read_text(errors="replace") if (folder / "error.log").exists() else ""
            raise RuntimeError(f"nginx exited with {process.returncode}:\n{log[-3000:]}")
        if all(_listening(port) for port in ports):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nginx did not listen on {ports} within {START_TIMEOUT_S:g} s")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
