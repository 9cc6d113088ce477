"""A watcher process that unregisters and unlinks this process's shared memory regions once it is gone, however.

``atexit`` and a SIGTERM handler cover a Python exit; they do not cover SIGKILL, an exit from C++
(Holoscan handles SIGTERM itself and then leaves with ``exit()`` after its 3-second grace, so Python's
``atexit`` never runs) or a handler installed outside Python. So the first region a process creates
also starts this janitor: a small Python process in its own session (a signal to the app's process
group does not reach it) that reads ``add NAME URL`` / ``drop NAME`` lines on a pipe. When the pipe
ends (the client exited, whatever way), it unregisters what is still listed on its server (2 s each)
and unlinks it, then exits.

    python .../backends/remote/shm/janitor.py PID      (stdlib only until it cleans up)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

_SHM_DIR = Path("/dev/shm")  # noqa: S108 - only names of the watched process are unlinked
_UNREGISTER_TIMEOUT_S = 2.0
#: How long unregistering is retried (a request cut off mid-run keeps its region "in use" until it ends).
_GIVE_UP_S = 30.0
_RETRY_S = 0.25


class Janitor:
    """The client side: starts the watcher once per process and tells it what to clean up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: IO[str] | None = None
        self._pid = 0

    def add(self, name: str, url: str) -> None:
        self._send(f"add {name} {url}\n")

    def drop(self, name: str) -> None:
        if self._pid == os.getpid():
            self._send(f"drop {name}\n")

    def _send(self, line: str) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: a watcher of its own
                self._start()
            if self._pipe is None:
                return
            try:
                self._pipe.write(line)
                self._pipe.flush()
            except (BrokenPipeError, OSError) as exc:
                logger.debug("shared memory janitor is gone: %s", exc)
                self._pipe = None

    def _start(self) -> None:
        self._pid = os.getpid()
        self._pipe = None
        # The file itself, not ``-m``: importing the package would load torch into a process that only waits.
        command = [sys.executable, os.path.abspath(__file__), str(os.getpid())]
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
                close_fds=True,
            )
        except OSError as exc:
            logger.warning("no shared memory janitor (%s): a killed client may leave regions in /dev/shm", exc)
            return
        self._pipe = process.stdin


janitor = Janitor()


def _unregister(name: str, url: str) -> None:
    scheme, _, address = url.partition("://")
    if scheme in ("grpc", "grpcs"):
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(address, ssl=scheme == "grpcs")
        try:
            client.unregister_system_shared_memory(name, client_timeout=_UNREGISTER_TIMEOUT_S)
        finally:
            client.close()
        return
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        address,
        ssl=scheme == "https",
        connection_timeout=_UNREGISTER_TIMEOUT_S,
        network_timeout=_UNREGISTER_TIMEOUT_S,
    )
    try:
        client.unregister_system_shared_memory(name)
    finally:
        client.close()


def main(argv: list[str]) -> int:
    """Follow the pipe until it ends, then clean up what the watched process left."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    pid = argv[0]
    live: dict[str, str] = {}
    for line in sys.stdin:
        verb, _, rest = line.strip().partition(" ")
        if verb == "add":
            name, _, url = rest.partition(" ")
            live[name] = url
        elif verb == "drop":
            live.pop(rest, None)
    deadline = time.monotonic() + _GIVE_UP_S
    while live and time.monotonic() < deadline:  # "in use" while the server still runs a cut-off request
        for name, url in list(live.items()):
            try:
                _unregister(name, url)
            except Exception as exc:  # the server may be busy with it, or gone too: try again, then unlink anyway
                logger.debug("unregister %s: %s", name, exc)
            else:
                live.pop(name)
        if live:
            time.sleep(_RETRY_S)
    for path in _SHM_DIR.glob(f"mto_{pid}_*"):
        with contextlib.suppress(OSError):
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
