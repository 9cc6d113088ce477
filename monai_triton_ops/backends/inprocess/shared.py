"""The one in-process Triton server of this process, shared by every ``triton`` backend.

Triton keeps process-wide state (memory pools, metrics; pitfall A11), so a process runs one server:
the first backend that opens starts it, each backend holds a reference to it and to its model, and the
last one to close it ends it. Models are loaded explicitly (``EXPLICIT`` model control): a model is loaded
when its first backend opens and unloaded when its last one closes, so the app runs exactly the models
it opened from a repository that may hold many.

This module only counts who holds what. The server's life (start, load, drain, delete, interpreter exit)
is :class:`~.server.InProcessServer`'s, and only its.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError
from .server import InProcessServer, Phase, ServerSettings

__all__ = ["InProcessServer", "ServerSettings", "acquire", "current", "release"]

logger = logging.getLogger(__name__)


@dataclass
class _Holds:
    """The process's server (at most one running) and who holds it: backends per model."""

    server: InProcessServer | None = None
    models: dict[str, set[int]] = field(default_factory=dict)  # model -> ids of the backends holding it


#: Held for a whole load too: models load one after another. With several loads at once Triton 2.51 starts their
#: stubs from several threads, and now and then one instance never finishes initialising (its load never ends).
_lock = threading.RLock()
_holds = _Holds()


def acquire(settings: ServerSettings, repository: Path, model: str, holder: object) -> InProcessServer:
    """The process's server with ``model`` loaded, started on first use; one hold per ``holder``.

    Raises:
        ConfigError: the server already runs with other settings.
        BackendUnavailableError: no Triton library here (how to install one).
        bindings.TritonError: the model failed to load (``UnavailableError``: its stub could not start).
    """
    with _lock:
        server = _holds.server
        if server is not None and server.phase is not Phase.RUNNING:  # ended under us (interpreter exit)
            server = _holds.server = None
            _holds.models.clear()
        if server is None:
            server = InProcessServer(settings, repository)
            _holds.server = server
        elif server.settings != settings:
            raise ConfigError(
                "the in-process Triton server of this process already runs with other server options "
                f"({server.settings}); every 'triton' backend of a process must use the same ones, got {settings}"
            )
        try:
            if not _holds.models.get(model):
                server.load(model, repository)
        except BaseException:
            if not any(_holds.models.values()):
                _holds.server = None
                server.close()
            raise
        _holds.models.setdefault(model, set()).add(id(holder))
        return server


def release(model: str, holder: object, timeout_s: float | None = None) -> None:
    """Give back ``holder``'s hold: unload ``model`` at its last, end the server at the very last, within
    ``timeout_s`` (see ``InProcessServer.close``; default the server's ``exit_timeout_s``)."""
    with _lock:
        server = _holds.server
        holders = _holds.models.get(model)
        if server is None or not holders or id(holder) not in holders:
            return
        holders.discard(id(holder))
        if holders:
            return
        del _holds.models[model]
        if any(_holds.models.values()):
            server.unload(model)
            return
        _holds.server = None
        server.close(timeout_s)  # under the lock: the next acquire starts a new server only once this one is gone


def current() -> InProcessServer | None:
    """The running server, if any (for tests and diagnostics)."""
    return _holds.server
