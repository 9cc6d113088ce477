"""Shared memory across processes: unique names, no attach to a foreign key; SIGTERM (no handler of ours, or the host's
own), a refused unregister and fork leave nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from monai_triton_ops.backends.remote.shm import region as shm
from monai_triton_ops.backends.remote.shm.owner import owner
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ... import triton_models
from ...server.conftest import wait_until
from .conftest import Open, registered_by_us, serve

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def server(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    repo = tmp_path_factory.mktemp("processes") / "repo"
    triton_models.identity(repo, "ident", dims=(-1,))
    yield from serve(repo, tmp_path_factory.mktemp("server_tmp"))


def _child(mode: str, spec: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.backends.remote.child", mode, spec, "ident"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _files_of(pid: int) -> list[str]:
    return sorted(p.name for p in shm.SHM_DIR.glob(f"{shm.PREFIX}{pid}_*"))


def _gone(server: LocalTritonServer, pid: int) -> bool:
    """Neither a file in /dev/shm nor a registration on the server is left of process ``pid``'s regions."""
    return not _files_of(pid) and not registered_by_us(server, pid)


def _ready(child: subprocess.Popen[str]) -> tuple[str, list[str]]:
    """The child's ``ready <handler> <regions>`` line: whose SIGTERM handler it has, and the regions it holds."""
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("ready"), child.stderr.read() if child.stderr else line
    _, who, regions = line.split(" ", 2)
    return who, json.loads(regions)


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_sigterm_mid_run_leaves_no_region_in_dev_shm_or_on_the_server(server: LocalTritonServer, scheme: str) -> None:
    """No handler of ours: the process dies of SIGTERM as it would without the library, and the janitor removes
    its regions (one still "in use" by the cut-off request once the server lets go, within the janitor's 30 s)."""
    spec = (server.grpc_url if scheme == "grpc" else server.http_url) + "?shared_memory=system"
    child = _child("loop", spec)
    try:
        who, regions = _ready(child)
        assert who == "default"  # the library installed no SIGTERM handler
        assert regions  # it holds a region while it runs
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait(timeout=30)
    assert wait_until(lambda: _gone(server, child.pid), timeout_s=40), (_files_of(child.pid), registered_by_us(server))


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_host_programs_own_sigterm_handler_runs_and_the_janitor_removes_the_regions(
    server: LocalTritonServer, when: str
) -> None:
    """A program embedding a backend keeps its SIGTERM handler, set before or after the backend opens; it ends
    the process with ``os._exit`` (no cleanup of ours runs) and the janitor removes the regions."""
    child = _child(f"host-{when}", f"{server.grpc_url}?shared_memory=system")
    try:
        assert child.stdout is not None
        if when == "after":
            assert child.stdout.readline().strip() == "default before the host's"  # nothing of ours to replace
        who, regions = _ready(child)
        assert who == "host"
        assert regions
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 7
        assert child.stdout.read().strip() == "host handler ran"
    finally:
        child.kill()
        child.wait(timeout=30)
    assert wait_until(lambda: _gone(server, child.pid), timeout_s=40), (_files_of(child.pid), registered_by_us(server))


def test_opening_a_backend_installs_no_signal_handler(server: LocalTritonServer, open_backend: Open) -> None:
    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    backend = open_backend(f"{server.grpc_url}?shared_memory=system", "ident")
    x = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(backend.infer({"INPUT__0": x})["OUTPUT__0"], x)
    assert owner.names()
    assert {number: signal.getsignal(number) for number in before} == before


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_region_the_server_would_not_let_go_is_unregistered_by_the_janitor_after_exit(
    server: LocalTritonServer, scheme: str
) -> None:
    spec = (server.grpc_url if scheme == "grpc" else server.http_url) + "?shared_memory=system"
    child = _child("stuck", spec)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    regions = json.loads(out.split("closed ", 1)[1])
    assert regions
    assert not _files_of(child.pid)  # the files go at close whatever the server says
    deadline = time.monotonic() + 40
    while registered_by_us(server, child.pid) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not registered_by_us(server, child.pid)


def test_two_processes_get_their_own_regions_and_one_closing_leaves_the_other_working(
    server: LocalTritonServer, open_backend: Open
) -> None:
    mine = open_backend(f"{server.grpc_url}?shared_memory=system", "ident")
    x = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(mine.infer({"INPUT__0": x})["OUTPUT__0"], x)
    child = _child("run", f"{server.grpc_url}?shared_memory=system")
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    theirs = json.loads(out.split("regions ", 1)[1])
    assert theirs
    assert not set(theirs) & set(owner.names())  # pid + random part: no collision
    for i in range(200):  # the other process closing never unregistered ours
        np.testing.assert_array_equal(mine.infer({"INPUT__0": x + i})["OUTPUT__0"], x + i)
    assert not _files_of(child.pid)


def test_fork_child_uses_its_own_backend_and_leaves_the_parents_regions(server: LocalTritonServer) -> None:
    child = _child("fork", f"{server.grpc_url}?shared_memory=system")
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    assert "fork 0 parent regions intact" in out, out + err[-3000:]
    assert not _files_of(child.pid)


def test_a_taken_name_is_never_attached_to(
    server: LocalTritonServer, open_backend: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    foreign = shm.SHM_DIR / f"{shm.PREFIX}{os.getpid()}_taken_0"
    foreign.write_bytes(b"someone else's")
    names = iter([foreign.name])
    real = shm._name
    monkeypatch.setattr(shm, "_name", lambda: next(names, None) or real())
    try:
        backend = open_backend(f"{server.grpc_url}?shared_memory=system", "ident")
        x = np.ones(64, np.float32)
        np.testing.assert_array_equal(backend.infer({"INPUT__0": x})["OUTPUT__0"], x)
        assert foreign.name not in owner.names()
        assert foreign.read_bytes() == b"someone else's"
    finally:
        foreign.unlink()


def test_regions_of_dead_processes_are_removed_at_open(server: LocalTritonServer, open_backend: Open) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = shm.SHM_DIR / f"{shm.PREFIX}{int(dead.stdout)}_abcd1234_0"
    stale.write_bytes(b"left by a killed client")
    foreign = shm.SHM_DIR / "triton_python_backend_shm_region_x"
    foreign.write_bytes(b"not ours")
    try:
        open_backend(f"{server.grpc_url}?shared_memory=system", "ident")
        assert not stale.exists()
        assert foreign.exists()
    finally:
        stale.unlink(missing_ok=True)
        foreign.unlink(missing_ok=True)


def test_a_client_that_sends_numpy_never_imports_torch(server: LocalTritonServer) -> None:
    """``import torch`` is 2.5 s of CPU: a process that sends numpy to a server over shared memory, and ``repo check
    --server``, import none of it (nor MONAI or Holoscan)."""
    probe = (
        "import sys\nimport numpy as np\nfrom monai_triton_ops import create_backend\n"
        "from monai_triton_ops.cli import main\n"
        f"with create_backend({server.grpc_url + '?shared_memory=system'!r}, 'ident') as backend:\n"
        "    x = np.arange(64, dtype=np.float32)\n"
        "    assert np.array_equal(backend.infer({'INPUT__0': x})['OUTPUT__0'], x)\n"
        f"code = main(['repo', 'check', '--server', {server.http_url!r}])\n"
        "print(code, sorted(m for m in ('torch', 'monai', 'holoscan') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "0 []", result.stdout
