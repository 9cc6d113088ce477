"""Process hygiene for the server: dies with its parent, own process group, SIGINT then SIGKILL of the group.

The Python backend's stubs are children of the server in its process group. A clean server exit stops
them; after a crash or a SIGKILL they would linger (they poll their parent for a while), so the group is
killed and waited for, zombies included, before anything that belonged to the server is removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
#: How long to wait for processes after SIGKILL (the kernel is quick; init reaps orphans).
KILL_WAIT_S = 10.0


def proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """``(comm, fields)`` of ``/proc/<pid>/stat``, else None (gone). ``comm`` is the executable's first 15
    characters, also for a zombie; ``fields`` start at the state (field 3): ``fields[1]`` is the parent pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the thread that started it dies (Linux).

    ``None`` elsewhere. The tie is to the calling *thread*, not the process: start from a long-lived thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork: the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def terminate(process: subprocess.Popen[bytes], *, grace_s: float, name: str = "tritonserver") -> None:
    """SIGINT, wait ``grace_s``, SIGKILL the process group; then kill and wait out what is left of the group.

    ``process`` must lead its own process group (``start_new_session=True``). Call once per process: after
    this its pid may be reused.
    """
    pid = process.pid
    if process.poll() is None:
        logger.info("stopping %s (pid %d)", name, pid)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s (pid %d) still running %.0f s after SIGINT: SIGKILL", name, pid, grace_s)
            kill_group(pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILL_WAIT_S)
    # A clean exit has stopped the stubs; a crash or a kill has not.
    kill_group(pid)
    wait_group_gone(pid, timeout_s=KILL_WAIT_S)
    logger.info("%s (pid %d) stopped with exit code %s", name, pid, process.returncode)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def wait_group_gone(pgid: int, *, timeout_s: float) -> bool:
    """Wait until no process of the group is left, zombies included; whether that happened in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):  # none left, or none of ours
            return True
        if time.monotonic() >= deadline:
            logger.warning("processes of group %d still exist after %.0f s", pgid, timeout_s)
            return False
        time.sleep(0.02)
