"""The Python backend's stub processes of the in-process server: their output, their health, their end.

Each Python-backend model instance runs in a ``triton_python_backend_stub`` process that Triton forks from
this process (through ``bash -c "exec <stub> ..."``). Whether a stub can start at all is asked before a
load by the one check every server shares (``server.stub.stub_problem``: Triton 2.51 waits for a new stub's
first message without a deadline, so a stub that cannot link would block the load forever). Two things
about the stubs only this process can see:

- **Whether a stub died.** A dead stub stays a zombie child of this process until Triton tears its model
  instance down, which for a stub that died it never completes (the model stays "UNLOADING"): a zombie
  whose command is the stub's is a dead stub, with its exit status (:func:`stub_children`).
- **What a stub said.** A stub's stderr is this process's; the backend folder gets a wrapper instead of
  the stub (:class:`StubOutput`) that sends it through a pipe read here: each chunk is written on to this
  process's stderr as before, and a bounded tail is kept for the error that quotes a failing stub.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ...discovery import STUB_COMM, STUB_NAME
from ...server.process import proc_stat

logger = logging.getLogger(__name__)

#: What Triton forks to start a stub; a zombie ``bash`` child is a stub launch that failed before the exec.
LAUNCHER_COMM = "bash"
#: How much of the stubs' output is kept for error messages.
TAIL_BYTES = 16 << 10
#: How often a model load looks for a stub that died.
LOAD_POLL_S = 0.1
#: After a stub died during a load, how long Triton may take to fail the load itself (it notices a stub
#: that stops answering within seconds; one that never answered it waits for forever).
DEATH_GRACE_S = 10.0

__all__ = ["STUB_NAME", "Child", "StubOutput", "kill", "stub_children", "stub_pids", "watch_load"]


@dataclass(frozen=True)
class Child:
    """A child process of this one, as ``/proc/<pid>/stat`` shows it."""

    pid: int
    comm: str
    zombie: bool
    exit_status: int
    """For a zombie: the status ``waitpid`` will report (exit code << 8, or the signal)."""

    def how_it_ended(self) -> str:
        if os.WIFSIGNALED(self.exit_status):
            number = os.WTERMSIG(self.exit_status)
            with contextlib.suppress(ValueError):
                return f"was killed by signal {number} ({signal.Signals(number).name})"
            return f"was killed by signal {number}"
        return f"exited with status {os.WEXITSTATUS(self.exit_status)}"


def children() -> list[Child]:
    """This process's children (stubs are forked by Triton's threads, so every thread's list is read)."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in Path(f"/proc/self/task/{task}/children").read_text().split())
    found = []
    for pid in sorted(pids):
        child = _read_stat(pid)
        if child is not None:
            found.append(child)
    return found


def _read_stat(pid: int) -> Child | None:
    stat = proc_stat(pid)
    if stat is None:
        return None
    comm, fields = stat  # fields[0] is field 3 (state); exit_code is field 52
    return Child(pid=pid, comm=comm, zombie=fields[0] == "Z", exit_status=int(fields[-1]) if len(fields) >= 50 else 0)


def stub_children() -> list[Child]:
    """Children that are stubs (alive or zombies) or a launcher shell that became a zombie."""
    return [c for c in children() if c.comm == STUB_COMM or (c.zombie and c.comm == LAUNCHER_COMM)]


def stub_pids(prefix: str) -> list[int]:
    """Live stubs of the server whose shared-memory prefix is ``prefix`` (it is in their command line)."""
    found = []
    for child in stub_children():
        if child.zombie:
            continue
        with contextlib.suppress(OSError):
            if prefix.encode() in Path(f"/proc/{child.pid}/cmdline").read_bytes():
                found.append(child.pid)
    return found


def kill(pids: Iterable[int]) -> list[int]:
    """SIGKILL each pid still alive; returns those signalled (Triton reaps its own children)."""
    killed = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def watch_load(load: Callable[[], None], name: str, said: Callable[[], str], on_stuck: Callable[[], None]) -> None:
    """Run ``load`` (a blocking ``TRITONSERVER_ServerLoadModel``) on a thread of its own and wait for it,
    looking for a stub that dies meanwhile: the load then ends within :data:`DEATH_GRACE_S` with why.

    A load Triton never ends (the stub died before its first message) is left blocked on its daemon thread
    and ``on_stuck`` is called: that model can never unload, so its server can no longer be deleted.

    Raises:
        bindings.UnavailableError: a stub died while the model loaded; ``said()`` tells what it printed.
        bindings.TritonError: Triton refused the model for another reason (its own error).
    """
    from ... import bindings as b

    # Stubs that run already belong to other models (one being unloaded exits meanwhile, a zombie for a moment
    # until Triton reaps it): only a stub started during this load can be this model's.
    before = {c.pid for c in stub_children()}
    outcome: concurrent.futures.Future[None] = concurrent.futures.Future()
    threading.Thread(target=_run_into, args=(outcome, load), name=f"triton-load-{name}", daemon=True).start()
    dead: Child | None = None
    dead_at = 0.0
    while True:
        try:
            outcome.result(timeout=LOAD_POLL_S)
            return
        except concurrent.futures.TimeoutError:
            pass
        except b.TritonError as exc:
            if dead is None:
                raise
            raise b.UnavailableError(_died(name, dead, said())) from exc
        if dead is None or dead.exit_status == 0:
            # a stub that exited 0 may be one of Triton's own short-lived launches: one that failed explains more
            found = _new_zombies(before)
            if dead is None and found:
                dead_at = time.monotonic()
            dead = next((c for c in found if c.exit_status != 0), dead or (found[0] if found else None))
        if dead is not None and time.monotonic() - dead_at > DEATH_GRACE_S:
            on_stuck()
            raise b.UnavailableError(_died(name, dead, said()) + "; Triton never ended the load")


def _new_zombies(before: set[int]) -> list[Child]:
    return [c for c in stub_children() if c.zombie and c.pid not in before]


def _run_into(outcome: concurrent.futures.Future[None], load: Callable[[], None]) -> None:
    try:
        load()
    except BaseException as exc:
        outcome.set_exception(exc)
    else:
        outcome.set_result(None)


def _died(name: str, dead: Child, cause: str) -> str:
    again = _read_stat(dead.pid)  # read once more: the zombie's status as it is now
    dead = again if again is not None and again.zombie else dead
    what = "stub" if dead.comm == STUB_COMM else "stub's launcher"
    text = f"model {name!r}: its Python backend {what} (pid {dead.pid}) {dead.how_it_ended()} while the model loaded"
    return f"{text}: {cause}" if cause else text


class StubOutput:
    """The stubs' stderr, through a pipe: forwarded to this process's stderr, its tail kept for errors.

    :meth:`wrap` writes the script that Triton starts in place of the stub: it ``exec``s the stub (same pid,
    so Triton's health checks and kills reach it) with stderr opened read-write on the pipe, which never
    blocks the open. Without arguments (Triton's check that the stub runs) it leaves stderr alone.
    """

    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        os.mkfifo(fifo, 0o600)
        self._fd = os.open(fifo, os.O_RDWR)  # read-write: no EOF while no stub writes, the open never blocks
        self._tail = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()
        self._closing = False
        self._thread = threading.Thread(target=self._forward, name="triton-stub-output", daemon=True)
        self._thread.start()

    def wrap(self, stub: Path, dest: Path) -> None:
        """Write the wrapper for ``stub`` at ``dest`` (the backend folder's ``triton_python_backend_stub``)."""
        real, fifo = shlex.quote(str(stub)), shlex.quote(str(self.fifo))
        dest.write_text(
            "#!/bin/sh\n"
            "# monai_triton_ops: the Python backend stub, its stderr through the in-process server's pipe\n"
            f'if [ "$#" -eq 0 ]; then exec {real}; fi\n'
            f'exec {real} "$@" 2<>{fifo}\n'
        )
        dest.chmod(0o755)

    def tail(self, since: int = 0) -> str:
        """The kept output written after byte ``since`` (as far as it is kept)."""
        with self._lock:
            start = max(0, since - self._dropped)
            return bytes(self._tail[start:]).decode(errors="replace")

    @property
    def written(self) -> int:
        """Bytes the stubs wrote so far (a position for :meth:`tail`)."""
        with self._lock:
            return self._dropped + len(self._tail)

    def close(self) -> None:
        """Stop forwarding (once the stubs are gone: a stub writing later would block on a full pipe)."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(OSError):
            os.write(self._fd, b"\0")  # wakes the reader
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(OSError):
            self.fifo.unlink()

    def _forward(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except OSError:
                return
            if self._closing:
                data = data.replace(b"\0", b"")
            if data:
                with contextlib.suppress(OSError):
                    os.write(2, data)
                self._keep(data)
            if self._closing:
                return

    def _keep(self, data: bytes) -> None:
        with self._lock:
            self._tail += data
            excess = len(self._tail) - TAIL_BYTES
            if excess > 0:
                del self._tail[:excess]
                self._dropped += excess
