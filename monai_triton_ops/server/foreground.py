"""Run a ``LocalTritonServer`` in the foreground until SIGINT or SIGTERM (what ``monai-triton serve`` does)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

from ..errors import ServerError
from . import logs
from .local import LocalTritonServer

logger = logging.getLogger(__name__)

#: Exit status of a run interrupted while the server was still starting (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def run_in_foreground(
    server: LocalTritonServer,
    *,
    on_ready: Callable[[LocalTritonServer], None] | None = None,
    poll_s: float = 0.5,
) -> int:
    """Start ``server``, call ``on_ready``, block until SIGINT/SIGTERM, then stop it; returns an exit status.

    While the server starts, SIGINT and SIGTERM interrupt the start (which cleans up) and 130 is returned.
    Once it is ready they only ask for a clean stop, so a second Ctrl-C cannot cut the stop short, and 0 is
    returned. Must run in the main thread (signal handlers), which is also the thread the server's
    parent-death signal is tied to.

    Raises:
        ServerError: the server exited on its own while serving (the message carries its log tail).
    """
    stop_requested = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logger.info("%s received: stopping", signal.Signals(signum).name)
        stop_requested.set()

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for sig in previous:
            signal.signal(sig, interrupt)
        try:
            server.start()
        except KeyboardInterrupt:
            logger.info("interrupted while starting")
            return INTERRUPTED
        for sig in previous:
            signal.signal(sig, request_stop)
        if on_ready is not None:
            on_ready(server)
        while not stop_requested.wait(poll_s):
            if not server.is_alive():
                log_path = server.log_path
                tail = logs.read_tail(log_path) if log_path is not None else ""
                raise ServerError(
                    f"tritonserver exited on its own with code {server.returncode}\n"
                    f"--- tritonserver log tail ---\n{tail}"
                )
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
