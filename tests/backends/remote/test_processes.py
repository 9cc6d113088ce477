"""Shared memory across processes: unique names, no attach to a foreign key, SIGTERM and fork leave nothing behind."""

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
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ... import triton_models
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


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_sigterm_mid_run_leaves_no_region_in_dev_shm_or_on_the_server(server: LocalTritonServer, scheme: str) -> None:
    spec = (server.grpc_url if scheme == "grpc" else server.http_url) + "?shared_memory=system"
    child = _child("loop", spec)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("ready"), child.stderr.read() if child.stderr else line
        assert json.loads(line.split(" ", 1)[1])  # it holds a region while it runs
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM  # dies of SIGTERM, as without our handler
    finally:
        child.kill()
        child.wait(timeout=30)
    assert not _files_of(child.pid)
    # A region the dying process could not unregister (its last request still ran) is the janitor's: it
    # unregisters it once the server lets go, within its 30 s.
    deadline = time.monotonic() + 40
    while registered_by_us(server, child.pid) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not registered_by_us(server, child.pid)


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
    assert not set(theirs) & set(shm.live_regions())  # pid + random part: no collision
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
        assert foreign.name not in shm.live_regions()
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
