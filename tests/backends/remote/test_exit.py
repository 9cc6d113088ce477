"""The remote backends' end with 8 requests in flight, as a user's process meets it: exit without ``close()``,
``close()`` with a short timeout, SIGTERM with the app's handlers and without them. Over gRPC and HTTP, with and
without shared memory, against a real tritonserver whose model takes 1 s a request (one instance: the 8 requests
keep it busy for 8 s). Each in a fresh interpreter, timed against the bounds ``docs/remote.md`` gives: work in
flight is abandoned at once (the server still runs it; nobody reads it), so the exit phase (from the program's last
line to the end of the process) ends within 5 s, ``close(timeout_s=T)`` returns within T + 5 s; afterwards no
crash, no region in ``/dev/shm``, none registered on the server once it has run the abandoned requests (the
janitor unregisters them), no janitor process and no temporary folder of the process.
"""

from __future__ import annotations

import os
import signal
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from monai_triton_ops import create_backend
from monai_triton_ops.backends.remote.shm import region as shm
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ... import triton_models
from ...server.conftest import wait_until
from ..exit_child import Child, exit_phase
from ..test_inprocess import CRASH_SIGNS
from .conftest import MODE_IDS, MODES, registered_by_us, serve, url

pytestmark = pytest.mark.triton

#: What an end may take beyond the time it waits for requests (none at exit; T for ``close(timeout_s=T)``).
BEYOND_S = 5.0
#: The exit phase with the defaults must fit a pod's grace period (30 s) with room for the rest of the app.
DEFAULTS_BOUND_S = 25.0
#: How long the server takes to run what was abandoned (8 requests of 1 s), and the janitor to unregister it.
JANITOR_S = 45.0


@pytest.fixture(scope="module")
def server(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    repo = tmp_path_factory.mktemp("exit") / "repo"
    triton_models.slow(repo, "slow", delay_s=1.0)
    yield from serve(repo, tmp_path_factory.mktemp("server_tmp"))


@pytest.fixture(autouse=True)
def idle(server: LocalTritonServer) -> None:
    """Each test starts with the model idle: one request, queued behind whatever an earlier test abandoned (the
    server runs it all, one a second), answered once that has run. Else the janitor's 30 s may not be enough."""
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        data = grpcclient.InferInput("INPUT__0", [4], "FP32")
        data.set_data_from_numpy(np.ones(4, np.float32))
        client.infer("slow", [data], client_timeout=60)
    finally:
        client.close()


#: 8 requests in flight, then the end the test names (``{end}``); the last line prints the monotonic clock.
CHILD = """
import os, sys, threading, time
import numpy as np
from monai_triton_ops import create_backend, install_signal_handlers, interrupts
{install}
backend = create_backend(sys.argv[1], "slow").open()
interrupts.register(lambda: backend.close(timeout_s=0.5))  # what the inference operator registers
futures = [backend.submit({{"INPUT__0": np.ones(4, np.float32)}}) for _ in range(8)]
print("pid", os.getpid(), backend.in_flight, flush=True)
{end}
print("last line", time.monotonic(), flush=True)
"""


def run_child(tmp_path: Path, spec: str, *, end: str = "", install: bool = False, in_flight: int = 8) -> Child:
    code = CHILD.format(install="install_signal_handlers()" if install else "", end=textwrap.dedent(end))
    child = Child(spec, code, tmp_path / "stderr.txt")
    assert int(child.stdout[0].split()[2]) == in_flight, child.stdout  # the requests the end meets in flight
    return child


def spec_of(server: LocalTritonServer, scheme: str, memory: str, *, max_in_flight: int | None = 8) -> str:
    query = f"shared_memory={memory}" + (f"&max_in_flight={max_in_flight}" if max_in_flight else "")
    return f"{url(server, scheme)}?{query}"


def _janitors_of(pid: int) -> list[int]:
    """The shared-memory janitor processes watching process ``pid`` (``python .../janitor.py PID``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) >= 3 and argv[-3].endswith(b"janitor.py") and argv[-2] == str(pid).encode():
                found.append(int(entry))
    return found


def _files_of(pid: int) -> list[str]:
    return sorted(p.name for p in shm.SHM_DIR.glob(f"{shm.PREFIX}{pid}_*"))


def assert_nothing_left(server: LocalTritonServer, child: Child, codes: tuple[int, ...]) -> None:
    """The exit code, no crash on the way out, no region file; once the server has run what was abandoned, no
    region of the child registered on it and no janitor left; no temporary folder of the child."""
    stderr, pid = child.stderr(), child.pid
    assert child.process.returncode in codes, f"exit code {child.process.returncode}\n{stderr[-3000:]}"
    for sign in CRASH_SIGNS:
        assert sign not in stderr, stderr[-3000:]
    assert not _files_of(pid), stderr[-3000:]
    assert wait_until(lambda: not registered_by_us(server, pid) and not _janitors_of(pid), timeout_s=JANITOR_S), (
        registered_by_us(server, pid),
        _janitors_of(pid),
    )
    assert not list(Path(tempfile.gettempdir()).glob(f"monai_triton_*_{pid}_*"))


@pytest.mark.parametrize(("scheme", "memory"), MODES, ids=MODE_IDS)
def test_exit_without_close_abandons_the_requests_and_ends_within_5_s(
    server: LocalTritonServer, tmp_path: Path, scheme: str, memory: str
) -> None:
    child = run_child(tmp_path, spec_of(server, scheme, memory))
    ended = child.finish()
    assert exit_phase(child, ended) <= BEYOND_S, child.stderr()[-3000:]
    assert_nothing_left(server, child, (0,))


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_exit_without_close_with_the_defaults_ends_within_25_s(
    server: LocalTritonServer, tmp_path: Path, scheme: str
) -> None:
    """Defaults (``max_in_flight=2``, ``shared_memory=auto``: system on loopback): 2 requests out, 6 queued."""
    child = run_child(tmp_path, spec_of(server, scheme, "auto", max_in_flight=None), in_flight=2)
    ended = child.finish()
    assert exit_phase(child, ended) <= min(DEFAULTS_BOUND_S, BEYOND_S), child.stderr()[-3000:]
    assert_nothing_left(server, child, (0,))


@pytest.mark.parametrize(("scheme", "memory"), MODES, ids=MODE_IDS)
def test_close_with_a_short_timeout_returns_within_it_plus_5_s_and_the_exit_is_clean(
    server: LocalTritonServer, tmp_path: Path, scheme: str, memory: str
) -> None:
    end = """
    started = time.monotonic()
    backend.close(timeout_s=1)
    print("close took", time.monotonic() - started, sum(f.exception() is not None for f in futures), flush=True)
    """
    child = run_child(tmp_path, spec_of(server, scheme, memory), end=end)
    _, _, took, failed = child.expect("close took ").split()
    ended = child.finish()
    assert float(took) <= 1 + BEYOND_S, child.stderr()[-3000:]
    assert int(failed) >= 6  # the server runs one a second: those still out after 1 s were cut off, not awaited
    assert exit_phase(child, ended) <= BEYOND_S, child.stderr()[-3000:]
    assert_nothing_left(server, child, (0,))


@pytest.mark.parametrize(("scheme", "memory"), MODES, ids=MODE_IDS)
def test_sigterm_ends_the_process_within_5_s_with_exit_143_and_nothing_left(
    server: LocalTritonServer, tmp_path: Path, scheme: str, memory: str
) -> None:
    """The app's handlers (``install_signal_handlers``, as the CLI and ``run_app`` install them) close the backend
    with 0.5 s to spare: the close must end well inside the handler's own deadline (8 s), regions unlinked."""
    end = """
    print("ready", flush=True)
    threading.Event().wait()
    """
    child = run_child(tmp_path, spec_of(server, scheme, memory), end=end, install=True)
    child.expect("ready")
    sent = time.monotonic()
    child.process.send_signal(signal.SIGTERM)
    ended = child.finish()
    assert ended - sent <= 0.5 + BEYOND_S, child.stderr()[-3000:]
    assert "error: terminated (SIGTERM)" in child.stderr()
    assert_nothing_left(server, child, (128 + signal.SIGTERM,))


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_sigterm_without_the_apps_handlers_kills_at_once_and_the_janitor_cleans_up(
    server: LocalTritonServer, tmp_path: Path, scheme: str
) -> None:
    """A library user who installs no handler gets SIGTERM's default action: the process dies at once, and the
    janitor unregisters and unlinks its regions once the server has run the abandoned requests."""
    end = """
    print("ready", flush=True)
    threading.Event().wait()
    """
    child = run_child(tmp_path, spec_of(server, scheme, "system"), end=end)
    child.expect("ready")
    assert _files_of(child.pid)
    child.process.send_signal(signal.SIGTERM)
    child.finish()
    assert child.process.returncode == -signal.SIGTERM
    assert wait_until(lambda: not _files_of(child.pid), timeout_s=JANITOR_S), _files_of(child.pid)
    assert_nothing_left(server, child, (-signal.SIGTERM,))


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_regions_a_close_abandoned_are_unregistered_once_the_server_lets_go_while_the_process_runs_on(
    server: LocalTritonServer, scheme: str
) -> None:
    """``close(timeout_s=0)`` returns at once; the regions the server still holds (it runs the abandoned requests
    for 8 s) are unlinked at once and unregistered by the janitor as soon as it lets go, not at this process's end."""
    backend = create_backend(spec_of(server, scheme, "system"), "slow").open()
    futures = [backend.submit({"INPUT__0": np.ones(4, np.float32)}) for _ in range(8)]
    assert wait_until(lambda: len(registered_by_us(server)) >= 8, timeout_s=30)  # each request's slot is out
    started = time.monotonic()
    backend.close(timeout_s=0)
    assert time.monotonic() - started <= BEYOND_S
    assert all(f.exception() is not None for f in futures)
    assert not _files_of(os.getpid())
    assert registered_by_us(server)  # the server still runs requests: the pool could not unregister their regions
    assert wait_until(lambda: not registered_by_us(server), timeout_s=JANITOR_S), registered_by_us(server)
