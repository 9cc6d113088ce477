"""Fixtures for the local tritonserver: tiny Python-backend models, servers that never outlive a test.

Every server a test starts goes through ``make_server`` (or the module's shared ``server``): its
teardown stops it even when the test fails, then checks that the process, its whole process group
(the Python backend stubs) and its temporary folder are gone. Temporary folders are created under a
folder of the test's own (``tempfile.tempdir`` is patched), so a leak is seen, not guessed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from monai_triton_ops.discovery import PYTHON_BACKEND_FILES, STUB_NAME
from monai_triton_ops.errors import ServerNotFoundError
from monai_triton_ops.processes import pid_exists as process_exists
from monai_triton_ops.server import LocalTritonServer, TritonInstall, find_tritonserver
from monai_triton_ops.server.environment import SHM_DIR

T = TypeVar("T")

#: config.pbtxt of a one-input one-output model with a variable-length 1-D tensor, no batching.
CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT__0" data_type: {dtype} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: {dtype} dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

#: model.py moving tensors with DLPack only: the 2.51 stub is built against numpy 1.x, and with numpy 2
#: ``pb_utils.Tensor(name, ndarray)`` / ``.as_numpy()`` silently carry 0 bytes. numpy, not torch: a stub that
#: imports torch takes 5-25 s to load its model on this machine, one that imports numpy a fraction of a second.
MODEL_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
{initialize}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT__0"))
            y = np.array({expression}, order="C")  # a writable copy: DLPack cannot export a read-only array
            out = pb_utils.Tensor.from_dlpack("OUTPUT__0", y)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

FAIL_REASON = "deliberate failure in initialize"


def write_model(
    repo: Path, name: str, *, expression: str = "x", dtype: str = "TYPE_FP32", initialize: str = "pass"
) -> Path:
    """Write ``<repo>/<name>/config.pbtxt`` and ``<repo>/<name>/1/model.py``; returns the repository."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, dtype=dtype))
    body = textwrap.indent(initialize, " " * 8)
    (repo / name / "1" / "model.py").write_text(MODEL_PY.format(initialize=body, expression=expression))
    return repo


def write_demo_repo(repo: Path) -> Path:
    """``add_one`` (FP32, x + 1) and ``identity`` (INT64, x)."""
    write_model(repo, "add_one", expression="x + 1", dtype="TYPE_FP32")
    return write_model(repo, "identity", expression="x", dtype="TYPE_INT64")


# -- process checks without psutil ------------------------------------------------------------------
def group_members(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid`` (zombies included), from ``/proc``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        if int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


def settled(read: Callable[[], T], timeout_s: float = 5.0, interval_s: float = 0.1) -> T:
    """``read()`` once two readings ``interval_s`` apart agree (else its last one after ``timeout_s``): Triton
    counts a request in its statistics a little after the client has the answer."""
    last = read()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(interval_s)
        now = read()
        if now == last:
            return now
        last = now
    return last


def assert_server_gone(pid: int, *, timeout_s: float = 0.0) -> None:
    """The server process no longer exists (``ProcessLookupError``), nor anything in its process group."""
    assert wait_until(lambda: not process_exists(pid), timeout_s), f"tritonserver pid {pid} still exists"
    assert wait_until(lambda: not group_members(pid), timeout_s), f"left in its group: {group_members(pid)}"


def kill_group(pgid: int) -> None:
    """Last-resort cleanup of a group a failed test may have left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def triton_install() -> TritonInstall:
    """The real server, or a clean skip when it is not installed."""
    try:
        return find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")


#: The stub's own name for the library it embeds Python from; the broken copy asks for one no machine has.
LIBPYTHON = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0".encode()
MISSING_LIBPYTHON = LIBPYTHON[:-3] + b"9.9"  # the same length: the binary's string table keeps its layout


def make_broken_stub_home(install: TritonInstall, home: Path) -> Path:
    """A Triton install at ``home`` whose Python stub cannot link, as on a machine without ``libpython3.X.so.1.0``.

    The real server and backend (linked, not copied) beside a copy of the real stub whose dynamic section asks
    for ``libpython3.X.so.9.9``: the loader fails exactly as it does where libpython is missing (``--server-path``).
    """
    if install.stub_path is None or install.python_backend_dir is None:
        pytest.skip("this Triton install has no Python backend stub for this interpreter")
    (home / "bin").mkdir(parents=True)
    try:  # a hard link keeps the server's own $ORIGIN-relative library path
        os.link(install.server_path, home / "bin" / "tritonserver")
    except OSError:
        shutil.copy2(install.server_path, home / "bin" / "tritonserver")
    (home / "lib").symlink_to(install.lib_dirs[0], target_is_directory=True)
    python = home / "backends" / "python"
    python.mkdir(parents=True)
    for name in PYTHON_BACKEND_FILES:
        (python / name).symlink_to(install.python_backend_dir / name)
    stub = install.stub_path.read_bytes()
    assert stub.count(LIBPYTHON) == 1, "the stub does not name libpython once"
    (python / STUB_NAME).write_bytes(stub.replace(LIBPYTHON, MISSING_LIBPYTHON))
    (python / STUB_NAME).chmod(0o755)
    return home


@pytest.fixture(scope="session")
def broken_stub_home(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make_broken_stub_home`` once per session."""
    return make_broken_stub_home(triton_install, tmp_path_factory.mktemp("broken_stub") / "tritonserver")


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_repo(tmp_path_factory.mktemp("demo") / "repo")


@pytest.fixture
def empty_repo(tmp_path: Path) -> Path:
    """A repository without models: the quickest server to start."""
    (tmp_path / "empty_repo").mkdir()
    return tmp_path / "empty_repo"


@pytest.fixture
def server_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tempfile`` creates folders here during the test; it must be empty afterwards."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    assert not list(folder.iterdir()), f"temporary folders left: {list(folder.iterdir())}"


@pytest.fixture
def make_server(triton_install: TritonInstall, server_tmp: Path) -> Iterator[Callable[..., LocalTritonServer]]:
    """``make_server(repo, **options)`` -> a (not yet started) server, stopped and checked at teardown."""
    servers: list[LocalTritonServer] = []

    def make(repo: Path, **options: object) -> LocalTritonServer:
        server = LocalTritonServer(repo, **options)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        stop_and_check(server)


def stop_and_check(server: LocalTritonServer) -> None:
    """Stop; then the process, its group and its folder must be gone (killed anyway, so nothing leaks)."""
    pid = server.pid
    try:
        server.stop()
        if pid is not None:
            assert_server_gone(pid, timeout_s=5.0)
        assert server.workdir is None
        assert not list(SHM_DIR.glob(f"{server._shm_prefix}*")), "shared memory left in /dev/shm"
    finally:
        if pid is not None:
            kill_group(pid)


@pytest.fixture(scope="module")
def server(
    triton_install: TritonInstall, demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTritonServer]:
    """One running server with the demo models, shared by a test module."""
    folder = tmp_path_factory.mktemp("server_tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(folder))
        server = LocalTritonServer(demo_repo, startup_timeout_s=120.0)
        try:
            server.start()
            yield server
        finally:
            stop_and_check(server)
    assert not list(folder.iterdir()), f"temporary folders left: {list(folder.iterdir())}"
