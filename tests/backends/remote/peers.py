"""What the peer servers (``mlserver.py``, ``kserve.py``) share: a process of their own virtualenv on loopback,
waited for until it answers, stopped with its whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from monai_triton_ops.server.process import die_with_parent


def start(command: Sequence[str], *, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """``command`` in a session of its own, its output in ``log``; the kernel ends it with the test process.

    Our interpreter's ``PYTHON*`` and ``VIRTUAL_ENV`` settings stay out: the peer runs its own virtualenv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    with open(log, "wb") as out:
        return subprocess.Popen(
            list(command),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )


def wait_until(
    ready: Callable[[], bool], process: subprocess.Popen[bytes], *, name: str, log: Path, timeout_s: float
) -> None:
    """Return once ``ready()``; raise with the log's tail when the process exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{name} not ready within {timeout_s:g} s:\n{log.read_text()[-3000:]}")


def ok(url: str) -> bool:
    """Whether ``GET url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def listening(port: int) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT to the process group, SIGKILL after 15 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)
