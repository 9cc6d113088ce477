"""Whether another process still runs: the local server's launcher and the shared memory regions both ask it of
the process that named a leftover (a stub's folder, a ``/dev/shm`` file) before they remove it."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """Whether a process with ``pid`` exists (signal 0 probes without touching it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
