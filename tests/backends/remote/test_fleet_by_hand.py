"""A fleet as hospital IT runs one: ``tritonserver`` started from its own command line on two addresses behind one
name, one of them killed at a random moment the client does not know of, then started again.

The name ``fleet-b.test`` resolves to 127.0.0.1 and 127.0.0.2 (the same ports on each, as every pod of a headless
Service listens on the same port) through the system resolver, in a client process with its own mount namespace
and its own ``/etc/hosts`` (``unshare -m``; the machine's file is not touched). The client runs
``fleet_child.py``: requests one after another, each checked. Nothing is mocked.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from monai_triton_ops.server import TritonInstall

from ... import triton_models
from ...server.conftest import wait_until
from .replicas import HandServer

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[3]
NAME = "fleet-b.test"
ADDRESSES = ("127.0.0.1", "127.0.0.2")


UNSHARE = shutil.which("unshare")


def _can_unshare() -> bool:
    if UNSHARE is None:
        return False
    return subprocess.run([UNSHARE, "-m", "true"], capture_output=True, check=False).returncode == 0


def _free_ports(count: int) -> tuple[int, ...]:
    """Ports free on every address (each server binds its own address, the same port numbers)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind((ADDRESSES[0], 0))
            port = probe.getsockname()[1]
        try:
            with socket.socket() as other:
                other.bind((ADDRESSES[1], port))
        except OSError:
            continue
        if port not in ports:
            ports.append(port)
    return tuple(ports)


@pytest.fixture(scope="module")
def servers(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[HandServer]]:
    if not _can_unshare():
        pytest.skip("needs unshare -m (a mount namespace) to give the client its own /etc/hosts")
    folder = tmp_path_factory.mktemp("by_hand")
    repo = folder / "repo"
    triton_models.passthrough(repo, "pt")
    ports = _free_ports(3)
    started = [HandServer(repo, address, ports, folder) for address in ADDRESSES]  # type: ignore[arg-type]
    try:
        for server in started:
            server.start()
        yield started
    finally:
        for server in started:
            server.kill()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hosts") / "hosts"
    lines = Path("/etc/hosts").read_text() + "".join(f"{address} {NAME}\n" for address in ADDRESSES)
    path.write_text(lines)
    return path


def _client(hosts: Path, *args: str) -> subprocess.Popen[str]:
    """``fleet_child.py`` with its own ``/etc/hosts``, in a mount namespace of its own."""
    child_argv = [sys.executable, "-m", "tests.backends.remote.fleet_child", *args]
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return subprocess.Popen(
        [str(UNSHARE), "-m", "/bin/sh", "-c", script, str(hosts), *child_argv],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _answered(server: HandServer) -> int:
    client = httpclient.InferenceServerClient(f"{server.address}:{server.http}", network_timeout=10)
    try:
        stats = client.get_inference_statistics("pt")
    finally:
        client.close()
    return sum(int(e.get("inference_count", 0)) for e in stats.get("model_stats", []))


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_name_with_two_addresses_is_two_servers_and_one_killed_at_random_loses_nothing(
    servers: list[HandServer], hosts: Path, scheme: str
) -> None:
    victim = servers[1]
    port = victim.grpc if scheme == "grpc" else victim.http
    spec = f"{scheme}://{NAME}:{port}?probe_backoff_s=0.1&max_probe_backoff_s=0.5"
    client = _client(hosts, spec, "pt")
    try:
        assert client.stdout is not None
        assert client.stdin is not None
        line = client.stdout.readline()
        assert line.startswith("ready"), client.stderr.read() if client.stderr else line
        labels = sorted(json.loads(line.split(" ", 1)[1]))
        assert labels == [f"{scheme}://{NAME}:{port} ({address})" for address in ADDRESSES]
        time.sleep(random.uniform(0.2, 1.5))  # noqa: S311 - a moment the client does not choose
        victim.kill()
        time.sleep(0.5)
        victim.start()
        deadline = time.monotonic() + 60
        while _answered(victim) == 0 and time.monotonic() < deadline:  # the new server is used again
            time.sleep(0.1)
        assert _answered(victim) > 0
        client.stdin.write("stop\n")
        client.stdin.flush()
        out, err = client.communicate(timeout=120)
    finally:
        client.kill()
    done = json.loads(out.split("done ", 1)[1])
    assert done["errors"] == [], err[-3000:]
    assert done["wrong"] == 0
    assert done["answered"] == done["sent"] > 0
    assert set(done["servers"].values()) == {"up"}


def test_the_round_robin_channel_of_a_name_with_several_addresses_spreads_over_them(
    servers: list[HandServer], hosts: Path
) -> None:
    """The channel a TLS name with several addresses gets (one server by name, gRPC's ``round_robin`` inside),
    shown here over the plaintext name: both addresses answer a share."""
    before = [_answered(server) for server in servers]
    port = servers[0].grpc
    client = _client(hosts, "balanced", f"grpc://{NAME}:{port}", "pt")
    out, err = client.communicate(timeout=120)
    assert out.startswith("done 40"), err[-3000:]

    def shares() -> list[int]:
        return [_answered(server) - b for server, b in zip(servers, before, strict=True)]

    wait_until(lambda: sum(shares()) >= 41, timeout_s=10)  # a server counts a request a little after its answer
    counted = shares()
    assert sum(counted) == 41  # the one that connects, and the 40
    assert min(counted) >= 10, counted  # round robin: about half each (pick_first would give one all 41)
