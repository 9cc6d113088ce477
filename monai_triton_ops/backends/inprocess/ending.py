"""How an in-process Triton server ends: ``close()`` with a deadline, retiring, interpreter exit, a signal.

Every way the end can go is decided here, by one object per server (:class:`End`), through one set of phases::

    RUNNING --close()--> CLOSING --drained--> ENDING --> CLOSED          (models unloaded, server deleted)
                            \\--deadline--> RETIRING --Triton let go--> ENDING --> CLOSED
                                              |  \\--the next open (same settings)--> RUNNING   (reused)
                                              \\--exit or signal--> ENDING --> CLOSED          (forced)

1. ``close(timeout_s)``: refuse new requests; wait for those in flight until ``timeout_s`` (default
   ``exit_timeout_s``). Drained: the models are unloaded and the server deleted, before ``close()`` returns.
2. Requests still in Triton at the deadline: each is cancelled (what a dynamic batcher still queues fails at
   once; a Python model already executing runs on) and the server **retires**: ``close()`` returns, and one
   thread waits for Triton to let go of them, then ends the server as in 1 (its models unloaded, the server
   deleted, its temporary folder, shared memory and environment gone). Nothing is killed: a server whose
   stub was killed can never be deleted on 2.51, and its threads would stay with the process. The next open
   with the same settings takes the retiring server back instead (its models still loaded), so a
   long-running process that opens and closes with work in flight never holds more than one server.
3. A stub that died (crashed, or killed at exit), or a model stuck loading: Triton 2.51 can never unload that
   model, so the server cannot be deleted (its stop would time out, and deleting after a failed stop
   crashes). It is left undeleted (safe once nothing is in flight); its other stubs are killed.
4. Interpreter exit with the server running or retiring: drain until ``exit_timeout_s`` (not again for a
   retiring server: its owner's ``close()`` waited), then cancel what is out and kill the stubs executing it
   (Triton cannot interrupt a Python model, and deleting a server under a request crashes); Triton fails
   what it holds at about one request per second and model instance. What has not landed within the grace
   (``FORCE_GRACE_S``; ``exit_timeout_s`` for a retiring server) would call into a finalizing interpreter:
   the process ends at once (``os._exit(STRANDED_EXIT_CODE)``), never crashes.
5. A signal handled by ``interrupts`` (``install_signal_handlers``): the same forced end at once, no drain
   (the process ends right after, ``os._exit``), so the temporary folder, shared memory and stubs go too.
6. Always at CLOSED: the environment restored, this server's shared-memory regions and temporary folder
   removed, the stub output pipe closed, the exit hook and the signal cleanup unregistered.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ... import interrupts
from . import stubs
from .flights import Flights

if TYPE_CHECKING:
    from ... import bindings

logger = logging.getLogger("monai_triton_ops.backends.inprocess.server")

#: Once nothing is in flight, the least time models get to unload (else the server is left undeleted).
UNLOAD_MIN_S = 3.0
UNLOAD_POLL_S = 0.02
_LIVE_STATES = ("READY", "LOADING", "UNLOADING")
#: After the forced end (requests cancelled, stubs killed), how long Triton may take to fail what it holds:
#: about one request a second per model instance (a Python model's execution waits a second on a dead stub).
FORCE_GRACE_S = 3.0
#: ``ServerDelete`` once every model unloaded: its stop has nothing left to wait for.
DELETE_EXIT_TIMEOUT_S = 2
#: The exit code of a process that had to end with requests still in flight (``End.at_exit``).
STRANDED_EXIT_CODE = 70


class Phase(enum.Enum):
    RUNNING = "running"
    CLOSING = "closing"
    RETIRING = "retiring"
    ENDING = "ending"
    CLOSED = "closed"


@dataclass(frozen=True)
class Ending:
    """How the server ended, or is ending (for logs and tests)."""

    deleted: bool
    """Triton deleted the server; otherwise it is retiring, or left to the process's exit with nothing in flight."""
    killed_stubs: tuple[int, ...] = ()
    stranded: int = 0
    """Requests still out after the forced end: the process must not finalize under them (``at_exit``)."""
    retiring: int = 0
    """Requests still in Triton at ``close()``'s deadline: the server ends once they land (or is reused)."""
    reason: str = ""


class Ended(Protocol):
    """What :class:`End` needs of its server."""

    flights: Flights
    server: bindings.TRITONSERVER_Server
    models: set[str]
    stuck: list[str]
    known_stubs: set[int]
    shm_prefix: str

    def cleanup(self) -> None:
        """Restore the environment; remove the shared memory, the temporary folder, the stub output pipe."""


class End:
    """One server's end (see the module docstring); its ``phase`` changes only under the registry's lock."""

    def __init__(self, owner: Ended, exit_timeout_s: float) -> None:
        self.phase = Phase.RUNNING
        self.ending: Ending | None = None
        self._owner = owner
        self._exit_timeout_s = exit_timeout_s
        self._lock = owner.flights.locked()
        self._close_lock = threading.Lock()  # one close() at a time
        self._retiring: threading.Thread | None = None
        atexit.register(self.at_exit)
        self._signal_key = interrupts.register(self.interrupted)

    def admit(self) -> None:
        """Raise ``UnavailableError`` unless the server takes requests (called under the registry's lock)."""
        from ... import bindings as b

        if self.phase is not Phase.RUNNING:
            raise b.UnavailableError(f"the in-process Triton server is {self.phase.value}: it takes no new requests")

    def _move(self, to: Phase, *, only_from: tuple[Phase, ...]) -> bool:
        with self._lock:
            if self.phase not in only_from:
                return False
            self.phase = to
            self._owner.flights.wake()
            return True

    # -- close and retire -------------------------------------------------------------------------------
    def close(self, timeout_s: float | None) -> Ending:
        """Drain until ``timeout_s`` (default ``exit_timeout_s``), then end, or retire; idempotent, never raises."""
        with self._close_lock:
            if not self._move(Phase.CLOSING, only_from=(Phase.RUNNING,)):
                return self.ending or Ending(deleted=False, reason=f"already {self.phase.value}")
            drain_s = self._exit_timeout_s if timeout_s is None else max(0.0, timeout_s)
            deadline = time.monotonic() + drain_s
            if self._owner.flights.wait_empty(drain_s):
                if self._move(Phase.ENDING, only_from=(Phase.CLOSING,)):
                    return self._finish(deadline)
                return self.ending or Ending(deleted=False, reason=f"ended meanwhile ({self.phase.value})")
            left = self._owner.flights.cancel_all()
            with self._lock:
                if self.phase is not Phase.CLOSING:  # an exit or a signal took over
                    return self.ending or Ending(deleted=False, reason=f"ended meanwhile ({self.phase.value})")
                self.phase = Phase.RETIRING
                self.ending = Ending(deleted=False, retiring=left, reason=f"retiring: {left} request(s) in Triton")
            self._retiring = threading.Thread(target=self._retire, name="triton-inprocess-retire", daemon=True)
            self._retiring.start()
            logger.warning(
                "in-process Triton server: %d request(s) still in Triton at close()'s deadline: cancelled; the "
                "server ends once Triton lets go of them, or the next open takes it back",
                left,
            )
            return self.ending

    def _retire(self) -> None:
        """The retiring server's one thread: once Triton let go of every request, end the server."""
        flights = self._owner.flights
        flights.wait_empty(None, or_until=lambda: self.phase is not Phase.RETIRING)
        with self._lock:
            if self.phase is not Phase.RETIRING or flights.count_held():  # taken back, or taken over
                return
            self.phase = Phase.ENDING
        self._finish(time.monotonic() + max(self._exit_timeout_s, UNLOAD_MIN_S))

    def revive(self) -> bool:
        """Take a retiring server back for a new holder (it runs on, its models still loaded); False when not
        retiring. A server that is ending meanwhile is waited for (``wait_closed``)."""
        with self._lock:
            if self.phase is not Phase.RETIRING:
                return False
            self.phase = Phase.RUNNING
            self.ending = None
            self._owner.flights.wake()
        logger.info("in-process Triton server taken back while its cut-off requests finish")
        return True

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait (bounded) for a server that is ending on its retiring thread; whether it is closed."""
        thread = self._retiring
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        return self.phase is Phase.CLOSED

    # -- the end itself ---------------------------------------------------------------------------------
    def _finish(self, deadline: float, killed: tuple[int, ...] = (), stranded: int = 0) -> Ending:
        """ENDING -> CLOSED: delete the server, or leave it undeleted (see 3), then clean up; never raises."""
        try:
            if stranded:
                ending = Ending(deleted=False, killed_stubs=killed, stranded=stranded, reason="stranded")
            else:
                ending = self._delete_or_abandon(deadline, killed)
        except Exception as exc:  # a bug must not keep the process from ending
            logger.exception("closing the in-process Triton server failed")
            ending = Ending(deleted=False, killed_stubs=killed, reason=f"close failed: {exc!r}")
        finally:
            self._owner.cleanup()
            interrupts.unregister(self._signal_key)
            with self._lock:
                self.phase = Phase.CLOSED
                in_flight = self._owner.flights.count_held()
            if not in_flight:  # else the exit hook must still keep the interpreter from finalizing
                atexit.unregister(self.at_exit)
        self.ending = ending
        (logger.info if ending.deleted else logger.warning)("in-process Triton server stopped: %s", ending)
        return ending

    def _delete_or_abandon(self, deadline: float, killed: tuple[int, ...]) -> Ending:
        owner = self._owner
        dead = [c for c in stubs.stub_children() if c.zombie and c.pid in owner.known_stubs]
        if killed or dead or owner.stuck:
            why = f"models stuck loading {owner.stuck}" if owner.stuck else f"{len(killed or dead)} stub(s) died"
            return self._abandon(killed, f"{why}: Triton cannot unload them")
        return self._delete(max(deadline - time.monotonic(), UNLOAD_MIN_S))

    def _delete(self, unload_s: float) -> Ending:
        """Unload every model (polled: Triton's own stop checks once a second), then delete the server."""
        from ... import bindings as b

        server = self._owner.server
        try:
            for name in list(self._owner.models):
                server.unload_model(name)
            deadline = time.monotonic() + unload_s
            while (live := self._live_models()) and time.monotonic() < deadline:
                time.sleep(UNLOAD_POLL_S)
            if live:
                return self._abandon((), f"models {live} did not unload within {unload_s:.1f} s")
            server.set_exit_timeout(DELETE_EXIT_TIMEOUT_S)
            server.delete()
        except b.TritonError as exc:
            return self._abandon((), f"Triton could not stop: {exc}")
        return Ending(deleted=True)

    def _live_models(self) -> list[str]:
        return [m["name"] for m in self._owner.server.model_index().json() if m.get("state") in _LIVE_STATES]

    def _abandon(self, killed: tuple[int, ...], reason: str) -> Ending:
        """Leave the server undeleted (safe: nothing is in flight) and end its stubs ourselves."""
        more = stubs.kill(stubs.stub_pids(self._owner.shm_prefix))
        return Ending(deleted=False, killed_stubs=tuple(killed) + tuple(more), reason=reason)

    def _force(self) -> tuple[int, ...]:
        """End every request in flight at once: cancel each in Triton, then kill the stubs executing them."""
        cancelled = self._owner.flights.cancel_all()
        killed = stubs.kill(stubs.stub_pids(self._owner.shm_prefix))
        if cancelled:
            logger.warning("%d request(s) in flight at the end: cancelled, stubs %s killed", cancelled, killed)
        return tuple(killed)

    def _take_over(self) -> Phase | None:
        """For the exit or a signal: move any live phase to ENDING; the phase it was in, or None when the
        server is closed or ending on its retiring thread (waited for, bounded)."""
        with self._lock:
            was = self.phase
            if was in (Phase.RUNNING, Phase.CLOSING, Phase.RETIRING):
                self.phase = Phase.ENDING
                self._owner.flights.wake()
                return was
        if was is Phase.ENDING:
            self.wait_closed(self._exit_timeout_s + UNLOAD_MIN_S + DELETE_EXIT_TIMEOUT_S)
        return None

    def interrupted(self) -> None:
        """A signal's cleanup (``interrupts``): the process ends right after; end the server now (see 5)."""
        if self._take_over() is None:
            return
        killed = self._force()
        self._finish(time.monotonic(), killed, stranded=len(self._owner.flights))

    def at_exit(self) -> None:
        """Interpreter exit with the server running or retiring (see 4)."""
        flights = self._owner.flights
        if self.phase is Phase.RUNNING and self._move(Phase.CLOSING, only_from=(Phase.RUNNING,)):
            flights.wait_empty(self._exit_timeout_s)  # new requests refused meanwhile (queued ones too)
        was = self._take_over()
        if was is not None:
            killed = self._force() if len(flights) else ()
            grace = self._exit_timeout_s if was is Phase.RETIRING else FORCE_GRACE_S
            flights.wait_empty(grace if killed else 0.0)
            self._finish(time.monotonic(), killed, stranded=len(flights))
        if not flights.wait_empty(self._exit_timeout_s if was is None else 0.0):
            _end_process(len(flights), self.ending)


def _end_process(in_flight: int, ending: Any) -> None:
    logger.critical(
        "in-process Triton: %d request(s) still in flight after the deadline (%s); ending the process now "
        "(exit code %d): a finalizing interpreter would crash under their callbacks",
        in_flight,
        getattr(ending, "reason", ""),
        STRANDED_EXIT_CODE,
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(STRANDED_EXIT_CODE)
