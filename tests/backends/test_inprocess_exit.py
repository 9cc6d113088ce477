"""The ``triton`` backend's end with 8 requests in flight, as a user's process meets it: exit without ``close()``,
``close()`` with a short timeout, SIGTERM. Each in a fresh interpreter, timed against the bounds
``docs/inprocess.md`` gives: the exit phase (from the program's last line to the end of the process) within
``exit_timeout_s`` + 5 s and within 25 s with the defaults (a Kubernetes pod's 30 s grace period),
``close(timeout_s=T)`` within T + 5 s; afterwards no crash, no stub, no shared-memory region and no temporary
folder of the process.
"""

from __future__ import annotations

import os
import signal
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from monai_triton_ops import exits
from monai_triton_ops.backends.inprocess import server as inprocess_server

from .. import triton_models
from .exit_child import Child, exit_phase
from .test_inprocess import CRASH_SIGNS, _stubs_of

pytestmark = [pytest.mark.triton]

#: The exit phase with the defaults must fit a pod's grace period (30 s) with room for the rest of the app.
DEFAULTS_BOUND_S = 25.0
#: What the end may take beyond its deadline: the forced end's grace (3 s) and the server's own stop.
BEYOND_S = 5.0
#: The exit code of a process that had to end with requests still out (``docs/inprocess.md``).
STRANDED_EXIT_CODE = exits.STRANDED


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inprocess_exit") / "repo"
    triton_models.passthrough(path, "very_slow", delay_s=4.0)  # one instance: requests run one after another
    triton_models.passthrough(path, "endless", delay_s=120.0)  # outlives any exit timeout
    return path


#: 8 requests in flight, then the end the test names (``{end}``); the last line prints the monotonic clock.
CHILD = """
import os, sys, threading, time
import numpy as np
from monai_triton_ops import create_backend, install_signal_handlers, interrupts
{install}
backend = create_backend("triton{query}", "{model}", model_repository=sys.argv[1], max_in_flight={max_in_flight}).open()
{register}
futures = [backend.submit({{"INPUT__0": np.ones(4, np.float32)}}) for _ in range(8)]
print("pid", os.getpid(), flush=True)
{end}
print("last line", time.monotonic(), flush=True)
"""


#: What the inference operator registers for a signal; a program that embeds a backend registers nothing.
REGISTER_CLOSE = "interrupts.register(lambda: backend.close(timeout_s=0.5))"


def run_child(tmp_path: Path, repo: Path, *, end: str = "", query: str = "", model: str = "very_slow",
              max_in_flight: int = 8, install: bool = False, register: str = REGISTER_CLOSE) -> Child:  # fmt: skip
    code = CHILD.format(
        install="install_signal_handlers()" if install else "",
        register=register,
        query=query,
        model=model,
        max_in_flight=max_in_flight,
        end=textwrap.dedent(end),
    )
    return Child(repo, code, tmp_path / "stderr.txt")


def assert_nothing_left(child: Child, codes: tuple[int, ...]) -> None:
    """The documented exit code, no crash on the way out, and no stub, region or temporary folder of the child."""
    stderr, pid = child.stderr(), child.pid
    assert child.process.returncode in codes, f"exit code {child.process.returncode}\n{stderr[-3000:]}"
    for sign in CRASH_SIGNS:
        assert sign not in stderr, stderr[-3000:]
    deadline = time.monotonic() + 5  # a killed stub is reaped by its parent's end: gone at once, or very soon
    while _stubs_of(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _stubs_of(pid), f"stubs of {pid} left: {_stubs_of(pid)}"
    assert not list(Path("/dev/shm").glob(f"monai_triton_{pid}_*"))
    assert not list(Path(tempfile.gettempdir()).glob(f"monai_triton_inprocess_{pid}_*"))


def test_the_stranded_exit_code_is_the_documented_one() -> None:
    assert inprocess_server.STRANDED_EXIT_CODE == exits.STRANDED
    assert exits.STRANDED in exits.MEANINGS


def stranded(child: Child) -> bool:
    return "still in flight after the deadline" in child.stderr()


def test_exit_without_close_with_the_defaults_ends_within_25_s(repo: Path, tmp_path: Path) -> None:
    """Defaults (``max_in_flight=2``): 2 requests in Triton and 6 queued; the queued ones are refused at exit
    and must not keep the model loaded (they did: the unload then waited 30 s, a 37.8 s exit)."""
    child = run_child(tmp_path, repo, max_in_flight=2)
    ended = child.finish()
    assert_nothing_left(child, (0,))
    assert exit_phase(child, ended) <= DEFAULTS_BOUND_S, child.stderr()[-3000:]


@pytest.mark.slow
def test_exit_without_close_with_the_defaults_and_a_model_slower_than_the_exit_timeout(
    repo: Path, tmp_path: Path
) -> None:
    child = run_child(tmp_path, repo, model="endless", max_in_flight=2)
    ended = child.finish()
    assert_nothing_left(child, (STRANDED_EXIT_CODE,) if stranded(child) else (0,))
    assert exit_phase(child, ended) <= DEFAULTS_BOUND_S, child.stderr()[-3000:]


def test_exit_without_close_ends_within_the_exit_timeout_plus_5_s(repo: Path, tmp_path: Path) -> None:
    """8 requests in Triton, 1 s to finish: the rest are cancelled and their stub killed at once; Triton fails
    them one a second, so what is still out after the grace is abandoned and the process ends with code 70."""
    child = run_child(tmp_path, repo, query="?exit_timeout_s=1")
    ended = child.finish()
    assert_nothing_left(child, (STRANDED_EXIT_CODE,) if stranded(child) else (0,))
    assert exit_phase(child, ended) <= 1 + BEYOND_S, child.stderr()[-3000:]


def test_close_with_a_short_timeout_returns_within_it_plus_5_s_and_the_exit_is_clean(
    repo: Path, tmp_path: Path
) -> None:
    """What ``close(timeout_s=1)`` abandoned lands while the program goes on; the exit waits for it (within the
    exit timeout, 15 s by default) and keeps the program's own exit code."""
    end = """
    started = time.monotonic()
    backend.close(timeout_s=1)
    print("close took", time.monotonic() - started, flush=True)
    """
    child = run_child(tmp_path, repo, end=end)
    took = float(child.expect("close took ").split()[2])
    ended = child.finish()
    assert_nothing_left(child, (0,))
    assert took <= 1 + BEYOND_S, child.stderr()[-3000:]
    assert exit_phase(child, ended) <= 15 + BEYOND_S, child.stderr()[-3000:]


def test_sigterm_ends_the_process_within_5_s_with_exit_143_and_nothing_left(repo: Path, tmp_path: Path) -> None:
    """The app's handler (``interrupts``) closes the backend with 0.5 s to spare: the server must end by then
    plus its forced end, well inside the handler's own deadline (8 s), so its temporary folder goes too."""
    end = """
    print("ready", flush=True)
    threading.Event().wait()
    """
    child = run_child(tmp_path, repo, end=end, install=True)
    child.expect("ready")
    sent = time.monotonic()
    child.process.send_signal(signal.SIGTERM)
    ended = child.finish()
    assert_nothing_left(child, (128 + signal.SIGTERM,))
    assert "error: terminated (SIGTERM)" in child.stderr()
    assert ended - sent <= 0.5 + BEYOND_S, child.stderr()[-3000:]


def test_sigterm_with_only_the_signal_handlers_installed_leaves_no_temporary_folder(repo: Path, tmp_path: Path) -> None:
    """A program that calls ``install_signal_handlers()`` as the quickstart says and registers nothing of its own:
    the server's own signal cleanup ends it (requests cancelled, stubs killed) before the process ends, so its
    temporary folder, shared memory and stubs go too, within ``exit_timeout_s`` + 5 s."""
    end = """
    print("ready", flush=True)
    threading.Event().wait()
    """
    child = run_child(tmp_path, repo, end=end, install=True, register="", query="?exit_timeout_s=2")
    child.expect("ready")
    sent = time.monotonic()
    child.process.send_signal(signal.SIGTERM)
    ended = child.finish()
    assert_nothing_left(child, (128 + signal.SIGTERM,))
    assert "error: terminated (SIGTERM)" in child.stderr()
    assert ended - sent <= 2 + BEYOND_S, child.stderr()[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("MONAI_TRITON_STRESS"), reason="20 fresh interpreters (~4 min): set MONAI_TRITON_STRESS=1"
)
def test_close_with_a_short_timeout_then_exit_20_runs(repo: Path, tmp_path: Path) -> None:
    """Deleting a server under requests in flight crashed now and then (SIGSEGV, a stub and a region left)."""
    for run in range(20):
        try:
            test_close_with_a_short_timeout_returns_within_it_plus_5_s_and_the_exit_is_clean(repo, tmp_path)
        except AssertionError as exc:
            raise AssertionError(f"run {run + 1} of 20: {exc}") from exc
