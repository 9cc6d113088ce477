"""A watcher process that unregisters and unlinks this process's shared memory regions once it is gone, however.

``atexit`` covers a Python exit; it does not cover a signal's default action (SIGTERM with no handler:
the library installs none, see ``interrupts.py``), SIGKILL, an exit from C++ (Holoscan handles SIGTERM
itself and then leaves with ``exit()`` after its 3-second grace) or a host program's own handler that
ends the process with ``os._exit``. So the first region a process registers also starts this janitor: a
small Python process in its own session (a signal to the app's process group does not reach it) that reads
lines on a pipe (its stdin)::

    server N <json>     how to reach server N: the client's own endpoint, TLS material and headers
    add NAME N          region NAME is registered on server N
    drop NAME           the client unregistered NAME itself
    retire NAME         the client gave up on NAME at a close (the server still holds it for a request it runs):
                        unregister it as soon as the server lets go, while the client runs on

When the pipe ends (the client exited, whatever way), it unregisters what is still listed, on the server
each region is on and with the client's own connection settings (a server with TLS, mutual TLS,
Triton's restricted shared-memory protocol or a proxy that wants a token refuses anyone else), 2 s a call,
retried for ``_GIVE_UP_S`` while the server still holds a region "in use"; then it unlinks the files.

Secrets (a client key, auth headers) travel only on the pipe, which nobody else can read: never on the
janitor's command line, which ``ps`` shows. The watcher speaks through the client layer's transports
(``client/``) with what the client sent, its TLS material as PEM bytes (``client/tls.py`` loads a client
certificate from a 0600 temporary file, deleted right after: the ``ssl`` module takes one from a file only).

    python .../backends/remote/shm/janitor.py PID      (stdlib only until it cleans up)
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monai_triton_ops.client.credentials import Credentials

logger = logging.getLogger(__name__)

_SHM_DIR = Path("/dev/shm")  # noqa: S108 - only names of the watched process are unlinked
_UNREGISTER_TIMEOUT_S = 2.0
#: How long unregistering is retried (a request cut off mid-run keeps its region "in use" until it ends).
_GIVE_UP_S = 30.0
_RETRY_S = 0.25
_PEM_FIELDS = ("root_certificates", "client_chain", "client_key")


@dataclass(frozen=True)
class ServerAccess:
    """How the janitor reaches the server a region is registered on: what the client itself used.

    ``url`` is ``scheme://host:port``; the PEM material is the bytes the client read at open (``None``: the
    system's CAs, no client certificate); ``headers`` are every header of a call, values included (the
    protocol's own names: Triton's restricted gRPC keys carry their ``triton-grpc-protocol-`` prefix already).
    """

    url: str
    root_certificates: bytes | None = field(default=None, repr=False)
    client_chain: bytes | None = field(default=None, repr=False)
    client_key: bytes | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def encode(self) -> str:
        """One line of JSON (PEM bytes in base64)."""
        fields: dict[str, Any] = {"url": self.url, "headers": [list(h) for h in self.headers]}
        for name in _PEM_FIELDS:
            data = getattr(self, name)
            fields[name] = None if data is None else base64.b64encode(data).decode("ascii")
        return json.dumps(fields)

    @classmethod
    def decode(cls, text: str) -> ServerAccess:
        fields = json.loads(text)
        pem = {n: None if fields[n] is None else base64.b64decode(fields[n]) for n in _PEM_FIELDS}
        return cls(url=fields["url"], headers=tuple((k, v) for k, v in fields["headers"]), **pem)

    @property
    def scheme(self) -> str:
        return self.url.partition("://")[0]

    @property
    def address(self) -> str:
        return self.url.partition("://")[2]


class Janitor:
    """The client side: starts the watcher once per process and tells it what to clean up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: IO[str] | None = None
        self._pid = 0
        self._servers: dict[ServerAccess, int] = {}  # what this process's watcher was told, and its number

    def add(self, name: str, access: ServerAccess) -> None:
        """Region ``name`` is registered on the server ``access`` reaches (its settings are sent once)."""
        with self._lock:
            self._started()
            number = self._servers.get(access)
            lines = ""
            if number is None:
                number = self._servers[access] = len(self._servers)
                lines = f"server {number} {access.encode()}\n"
            self._write(f"{lines}add {name} {number}\n")

    def drop(self, name: str) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._write(f"drop {name}\n")

    def retire(self, name: str) -> None:
        """The client gave up on region ``name`` (unlinked; the server still holds it): unregister it once the
        server lets go, now rather than once this process is gone (a long-lived process closes backends too)."""
        with self._lock:
            if self._pid == os.getpid():
                self._write(f"retire {name}\n")

    def _started(self) -> None:
        if self._pid != os.getpid():  # first use, or a forked child: a watcher of its own
            self._start()

    def _write(self, text: str) -> None:
        if self._pipe is None:
            return
        try:
            self._pipe.write(text)
            self._pipe.flush()
        except (BrokenPipeError, OSError) as exc:
            logger.debug("shared memory janitor is gone: %s", exc)
            self._pipe = None

    def _start(self) -> None:
        self._pid = os.getpid()
        self._pipe = None
        self._servers = {}
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


# -- the watcher's side ------------------------------------------------------------------------------
def _unregister(name: str, access: ServerAccess) -> None:
    """Unregister ``name`` on the server ``access`` reaches, through the client layer's transport (the client's own
    TLS material and headers); a failure raises (``CallError``).

    A transport of its own for each call, closed after it, as a client of its own would be: a connection kept open
    would hold up the server's shutdown (Triton waits for open HTTP connections). The imports are absolute and here:
    the watcher runs as a file, not as a module of the package, and waits with the standard library alone."""
    from monai_triton_ops.client.endpoints import Endpoint
    from monai_triton_ops.client.transports import connect
    from monai_triton_ops.client.transports.base import TransportSettings
    from monai_triton_ops.client.workers import Workers

    workers = Workers("janitor", 1)  # an HTTP client lives on the thread that made it, and closes as it ends
    try:
        settings = TransportSettings(credentials=credentials_of(access))
        transport = connect(Endpoint.parse(access.url), settings, workers)
        try:
            transport.unregister_system_shm(name, timeout_s=_UNREGISTER_TIMEOUT_S)
        finally:
            transport.close()
    finally:
        workers.stop(join_timeout_s=_UNREGISTER_TIMEOUT_S)


def credentials_of(access: ServerAccess) -> Credentials:
    """The client layer's ``Credentials`` of what the client sent: its PEM bytes, and its headers as they were sent
    (each protocol's own names already)."""
    from monai_triton_ops.client.credentials import Credentials, Secret

    return Credentials(
        root_certificates=access.root_certificates,
        client_chain_pem=access.client_chain,
        client_key_pem=access.client_key,
        headers=tuple((key, Secret(value, "the client")) for key, value in access.headers),
    )


class _Retirer:
    """Regions the client gave up on while it runs, unregistered on a thread of their own: retried every ``_RETRY_S``
    for ``_GIVE_UP_S``. They stay listed: the end's cleanup unregisters them again, which the server takes for done
    when it already is (unregistering a name it does not know succeeds)."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[ServerAccess, float]] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, name: str, access: ServerAccess) -> None:
        with self._changed:
            self._pending[name] = (access, time.monotonic() + _GIVE_UP_S)
            self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="retire", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
                pending = list(self._pending.items())
            for name, (access, give_up) in pending:
                try:
                    _unregister(name, access)
                except Exception as exc:  # "in use" while the server still runs the request: try again
                    logger.debug("unregister %s: %s", name, exc)
                    if time.monotonic() < give_up:
                        continue
                with self._changed:
                    self._pending.pop(name, None)
            time.sleep(_RETRY_S)


def _follow(lines: IO[str], retire: Callable[[str, ServerAccess], None]) -> dict[str, ServerAccess]:
    """Read the pipe until it ends (handing regions given up on to ``retire``); what is still registered then, and
    where."""
    servers: dict[str, ServerAccess] = {}
    live: dict[str, ServerAccess] = {}
    for line in lines:
        verb, _, rest = line.strip().partition(" ")
        first, _, second = rest.partition(" ")
        if verb == "server":
            servers[first] = ServerAccess.decode(second)
        elif verb == "add" and second in servers:
            live[first] = servers[second]
        elif verb == "drop":
            live.pop(first, None)
        elif verb == "retire" and first in live:
            retire(first, live[first])
    return live


def main(argv: list[str]) -> int:
    """Follow the pipe until it ends, then clean up what the watched process left."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    pid = argv[0]
    live = _follow(sys.stdin, _Retirer().add)
    deadline = time.monotonic() + _GIVE_UP_S
    while live and time.monotonic() < deadline:  # "in use" while the server still runs a cut-off request
        for name, access in list(live.items()):
            try:
                _unregister(name, access)
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
