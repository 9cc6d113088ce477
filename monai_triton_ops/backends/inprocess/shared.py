"""The one in-process Triton server of this process, shared by every ``triton`` backend.

Triton keeps process-wide state (memory pools, metrics; pitfall A11), so a process runs one server:
the first backend that opens starts it, each backend holds a reference to it and to its model, and the
last one to close it ends it. Models are loaded explicitly (``EXPLICIT`` model control): a model is loaded
when its first backend opens and unloaded when its last one closes, so the app runs exactly the models
it opened from a repository that may hold many.

A server whose last holder closed while Triton still held cut-off requests retires (``ending``); the next
open with the same settings takes it back, its models still loaded, instead of starting a second one. A
backend dropped without ``close()`` holds nothing: holds are weak, and the next open finds the server running
(reused) or a model no live backend holds (still loaded, reused too). So a long-running process that opens
and closes backends, with work in flight or not, closed or dropped, has at most one server.

This module only counts who holds what. The server's life (start, load, drain, delete, retire, exit) is
:class:`~.server.InProcessServer`'s and ``ending``'s, and only theirs.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError
from .server import InProcessServer, Phase, ServerSettings

__all__ = ["InProcessServer", "ServerSettings", "acquire", "current", "release"]

logger = logging.getLogger(__name__)


@dataclass
class _Holds:
    """The process's server (at most one alive) and who holds it: live backends per model."""

    server: InProcessServer | None = None
    models: dict[str, weakref.WeakSet[object]] = field(default_factory=dict)  # model -> the backends holding it
    retiring: InProcessServer | None = None  # closed by its last holder, Triton still holding its requests

    def held(self) -> bool:
        return any(len(holders) for holders in self.models.values())


#: Held for a whole load too: models load one after another. With several loads at once Triton 2.51 starts their
#: stubs from several threads, and now and then one instance never finishes initialising (its load never ends).
_lock = threading.RLock()
_holds = _Holds()
#: How long an open waits for a server that is ending on its own (unloading, deleting) before it starts one.
ENDED_WAIT_S = 30.0


def acquire(settings: ServerSettings, repository: Path, model: str, holder: object) -> InProcessServer:
    """The process's server with ``model`` loaded, started on first use (or a retiring one taken back); one
    hold per ``holder``, held weakly (a dropped holder holds nothing).

    Raises:
        ConfigError: the server runs, or still retires, with other settings.
        BackendUnavailableError: no Triton library here (how to install one).
        bindings.TritonError: the model failed to load (``UnavailableError``: its stub could not start).
    """
    with _lock:
        server = _running(settings, repository)
        try:
            if not _holds.models.get(model) and model not in server.models:
                server.load(model, repository)
        except BaseException:
            if not _holds.held():
                _holds.server = None
                _holds.models.clear()
                server.close()
            raise
        _holds.models.setdefault(model, weakref.WeakSet()).add(holder)
        return server


def _running(settings: ServerSettings, repository: Path) -> InProcessServer:
    """The server to hold: the running one, the retiring one taken back, or a new one (lock held)."""
    server = _holds.server
    if server is not None and server.phase is not Phase.RUNNING:  # ended under us (interpreter exit, signal)
        server = _holds.server = None
        _holds.models.clear()
    if server is None and (retiring := _holds.retiring) is not None:
        _holds.retiring = None
        if retiring.settings == settings and retiring.revive():
            server = _holds.server = retiring
        elif retiring.phase is Phase.RETIRING and retiring.settings != settings:
            _holds.retiring = retiring
            raise ConfigError(
                "the in-process Triton server of this process still ends requests cut off by its last close() "
                f"({retiring.in_flight} in Triton) and runs with other server options ({retiring.settings}); "
                f"open with the same ones, or once it has ended; got {settings}"
            )
        else:
            retiring.wait_closed(ENDED_WAIT_S)  # ending on its own: one server at a time
    if server is None:
        server = _holds.server = InProcessServer(settings, repository)
    elif server.settings != settings:
        raise ConfigError(
            "the in-process Triton server of this process already runs with other server options "
            f"({server.settings}); every 'triton' backend of a process must use the same ones, got {settings}"
        )
    return server


def release(model: str, holder: object, timeout_s: float | None = None) -> None:
    """Give back ``holder``'s hold: unload ``model`` at its last, end the server at the very last, within
    ``timeout_s`` (see ``InProcessServer.close``; default the server's ``exit_timeout_s``)."""
    with _lock:
        server = _holds.server
        holders = _holds.models.get(model)
        if server is None or holders is None or holder not in holders:
            return
        holders.discard(holder)
        if holders:
            return
        del _holds.models[model]
        if _holds.held():
            server.unload(model)
            return
        _holds.server = None
        _holds.models.clear()  # models only dropped backends held: the server ends with them
        ending = server.close(timeout_s)  # under the lock: the next acquire sees it running, retiring or gone
        if ending.retiring:
            _holds.retiring = server


def current() -> InProcessServer | None:
    """The running server, if any (for tests and diagnostics)."""
    return _holds.server


def retiring() -> InProcessServer | None:
    """The server that retires (its last holder closed with requests still in Triton), if any."""
    server = _holds.retiring
    return server if server is not None and server.phase is Phase.RETIRING else None
