"""The one owner of an in-process Triton server's whole life: start, models, requests, close and process exit.

The binding (``bindings/``) is the C API with its ownership rules and no policy; every decision about
*when* and *how long* lives here, in one class, so one place says when the server goes away::

    InProcessServer(settings, repository)   start: library, stub environment, backend folder, server
    .load(model, repository)                explicit load; fails fast when a Python-backend stub cannot start
    .submit(request) -> Future[None]        lend a request to Triton (refused once closing)
    .unload(model)
    .close(timeout_s)                       drain until the deadline, then force, then delete (never raises)
    at interpreter exit                     the same close(), registered with ``atexit`` while the server runs

``close(timeout_s)`` handles every way the end can go, in this order, and is the only code that does:

1. Refuse new requests; wait for those in flight until ``timeout_s`` (default ``exit_timeout_s``).
2. Requests still in flight: all at once, each is cancelled in Triton (what a dynamic batcher still queues
   fails at once) and the stubs are killed (Triton cannot interrupt a Python model that is executing, and
   deleting the server under a request crashes). Triton then fails what it holds at about one request per
   second and model instance; what has not landed after ``FORCE_GRACE_S`` is abandoned (``stranded``).
3. A stub that died (killed here, or crashed earlier), or a model stuck loading: Triton 2.51 can never
   unload that model, so the server cannot be deleted (its stop would time out, and deleting after a
   failed stop crashes). It is left undeleted (safe once nothing is in flight); its other stubs are killed.
4. Otherwise the models are unloaded, within what is left of ``timeout_s`` (at least ``UNLOAD_MIN_S``; else
   as in 3), and the server is deleted (``TRITONSERVER_ServerDelete``).
5. Always: the environment restored, this server's shared-memory regions and temporary folder removed, the
   stub output pipe closed. Abandoned requests would call into a finalizing interpreter: the exit hook stays
   registered while any is out, waits for them at interpreter exit (up to ``exit_timeout_s`` after an
   earlier ``close()``), then ends the process at once (``os._exit(STRANDED_EXIT_CODE)``), never crashes.

Around the server, exactly what the local server launcher sets up (``server.environment``): a backend folder
with the Python backend (its stub behind ``stubs.StubOutput``'s wrapper), the stub environment, a
shared-memory prefix of our own, and a symlink mirror of each repository (``server.mirror``), refreshed per
model load (the stubs' isolated interpreters would write ``__pycache__`` into the user's repository).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import enum
import logging
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailableError, ServerNotFoundError
from ...repository.servable import load_failure
from ...server.environment import (
    assemble_backend_dir,
    remove_leftovers_of_dead_launchers,
    remove_shm_regions,
    server_environment,
    shm_prefix,
    temp_folder,
)
from ...server.logs import last_line, stub_failure
from ...server.mirror import mirror_repository
from ...server.stub import model_stub, stub_problem
from . import stubs
from .settings import ServerSettings as ServerSettings
from .settings import server_options

if TYPE_CHECKING:
    from ... import bindings

logger = logging.getLogger(__name__)

#: Environment variables the stubs inherit, set in this process while the server runs (``server_environment``
#: says why each): the library and Python paths, OpenMP threads that sleep between requests, and glibc keeping
#: freed tensor buffers for reuse. This process's own allocator read its settings at start and is unaffected.
STUB_ENVIRON = ("LD_LIBRARY_PATH", "PATH", "OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
#: Once nothing is in flight, the least time models get to unload (else the server is left undeleted).
UNLOAD_MIN_S = 3.0
UNLOAD_POLL_S = 0.02
_LIVE_STATES = ("READY", "LOADING", "UNLOADING")
#: After the forced end (requests cancelled, stubs killed), how long Triton may take to fail what it holds:
#: about one request a second per model instance (a Python model's execution waits a second on a dead stub).
FORCE_GRACE_S = 3.0
#: ``ServerDelete`` once every model unloaded: its stop has nothing left to wait for.
DELETE_EXIT_TIMEOUT_S = 2
#: The exit code of a process that had to end with requests still in flight (see ``_at_exit``).
STRANDED_EXIT_CODE = 70


class Phase(enum.Enum):
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True)
class Ending:
    """How ``close()`` ended the server (for logs and tests)."""

    deleted: bool
    """Triton deleted the server; otherwise it is left to the process's exit, with nothing in flight."""
    killed_stubs: tuple[int, ...] = ()
    stranded: int = 0
    """Requests still out after the forced end: the process must not finalize under them (``_at_exit``)."""
    reason: str = ""


class InProcessServer:
    """A running in-process Triton server and everything around it; see the module docstring."""

    def __init__(self, settings: ServerSettings, repository: Path) -> None:
        from ... import bindings as b

        try:
            library = b.load_library(settings.library_path)
        except ServerNotFoundError as exc:
            raise BackendUnavailableError(f"the 'triton' backend needs libtritonserver: {exc}") from exc
        if library.install is None:
            raise BackendUnavailableError(
                f"{library.path} is not inside a Triton install (no backends folder next to it); set "
                "TRITONSERVER_HOME to the install folder, or install nvidia-pytriton"
            )
        self.settings = settings
        self.install = library.install
        self.repositories: dict[Path, Path] = {}  # the user's repository -> the mirror the server reads
        self.models: set[str] = set()
        self.shm_prefix = shm_prefix()
        self.phase = Phase.RUNNING
        self.stuck: list[str] = []  # models whose load never ended (a stub died before Triton heard from it)
        self._known_stubs: set[int] = set()  # stub pids seen alive: one that is a zombie now died
        self._stub_checked: str | None = None  # why the backend folder's stub cannot start ("" if it can)
        self._flights: dict[int, bindings.TRITONSERVER_InferenceRequest] = {}
        self._landed = threading.Condition()
        self._close_lock = threading.Lock()
        self._ending: Ending | None = None
        self._workdir = temp_folder("inprocess")
        self._saved_environ = {key: os.environ.get(key) for key in STUB_ENVIRON}
        self._output: stubs.StubOutput | None = None
        try:
            self._start(library.install, repository)
        except BaseException:
            self._cleanup()
            raise
        atexit.register(self._at_exit)
        logger.info("in-process Triton server started on %s (library %s)", repository, library.path)

    def _start(self, install: Any, repository: Path) -> None:
        from ... import bindings as b

        remove_leftovers_of_dead_launchers()
        stub_env = server_environment(install)
        os.environ.update({key: stub_env[key] for key in STUB_ENVIRON})
        backends = assemble_backend_dir(install, self._workdir / "backends")
        self._stub = backends / "python" / stubs.STUB_NAME
        if self._stub.is_symlink():  # the stub's stderr through our pipe (stubs.StubOutput)
            real = self._stub.resolve()
            self._output = stubs.StubOutput(self._workdir / "stub-output")
            self._stub.unlink()
            self._output.wrap(real, self._stub)
            self._stub = real
        options = server_options(
            self.settings,
            backends=backends,
            repository=self._mirror(repository),
            log_path=self.log_path,
            shm_prefix=self.shm_prefix,
        )
        try:
            self.server = b.TRITONSERVER_Server(options)
        finally:
            options.delete()

    @property
    def log_path(self) -> Path:
        return self.settings.log_file or self._workdir / "triton.log"

    @property
    def in_flight(self) -> int:
        with self._landed:
            return len(self._flights)

    def _mirror(self, repository: Path) -> Path:
        """A symlink mirror of ``repository`` for the server: the stubs' ``__pycache__`` lands there, not in it."""
        mirror = mirror_repository(repository, self._workdir / "repositories" / str(len(self.repositories)))
        self.repositories[repository] = mirror
        return mirror

    def _refresh(self, name: str, repository: Path) -> Path:
        """Mirror the model's folder anew before it loads: files added or removed since are seen."""
        mirrored = self.repositories[repository] / name
        shutil.rmtree(mirrored, ignore_errors=True)
        if (repository / name).is_dir():
            mirror_repository(repository / name, mirrored)
        return mirrored

    # -- models -------------------------------------------------------------------------------------------
    def load(self, name: str, repository: Path) -> None:
        """Load ``name`` from ``repository`` (registered on first use) and wait until it is ready.

        Raises:
            bindings.UnavailableError: a Python-backend stub of the model cannot start or died while it
                loaded; the message quotes why (the loader's or the stub's own words).
            bindings.TritonError: Triton refused the model (its own message).
        """
        from ... import bindings as b

        self._require_running()
        if repository not in self.repositories:
            self.server.register_model_repository(self._mirror(repository))
        folder = self._refresh(name, repository)
        problem = self._stub_problem(folder)
        if problem:
            raise b.UnavailableError(f"model {name!r}: {problem}")
        offset = self._output.written if self._output is not None else 0
        try:
            stubs.watch_load(
                lambda: self.server.load_model(name),
                name,
                lambda: self._stub_said(offset),
                lambda: self.stuck.append(name),
            )
        except b.UnavailableError:
            raise
        except b.TritonError as exc:  # where the model's config.pbtxt explains it, the error names the fix
            hint = load_failure(repository / name, self.install, str(exc), where="the in-process Triton server")
            if hint is not None:
                raise hint from exc
            raise
        self.models.add(name)
        self._known_stubs.update(stubs.stub_pids(self.shm_prefix))

    def _stub_problem(self, folder: Path) -> str | None:
        """Why the stub this model would start cannot run (a model may ship its own, next to its config)."""
        stub = model_stub(folder, self._stub if self._stub.exists() else None)
        if stub is None:
            return None
        if stub != self._stub:  # the model's own, linked from the mirror: named as the user knows it
            return stub_problem(stub.resolve(), os.environ)
        if self._stub_checked is None:  # once: every model without its own stub starts this one
            self._stub_checked = stub_problem(stub, os.environ) or ""
        return self._stub_checked or None

    def _stub_said(self, offset: int) -> str:
        said = self._output.tail(offset) if self._output is not None else ""
        logged = ""
        with contextlib.suppress(OSError):
            logged = self.log_path.read_text(errors="replace")[-(64 << 10) :]
        return stub_failure(said) or last_line(said) or stub_failure(logged) or ""

    def unload(self, name: str) -> None:
        """Start unloading ``name``; requests in flight keep it until they land."""
        self.models.discard(name)
        if self.phase is not Phase.RUNNING:
            return
        try:
            self.server.unload_model(name)
        except Exception:  # the server keeps running; the next load reports anything real
            logger.warning("unloading model %r failed", name, exc_info=True)

    # -- requests -----------------------------------------------------------------------------------------
    def submit(self, request: bindings.TRITONSERVER_InferenceRequest) -> concurrent.futures.Future[None]:
        """``infer_async``, counted: ``close()`` waits for what was submitted here.

        Raises:
            bindings.UnavailableError: the server is closing or closed.
        """
        with self._landed:
            self._require_running()
            key = id(request)
            self._flights[key] = request
        try:
            landed = self.server.infer_async(request)
        except BaseException:
            self._land(key)
            raise
        landed.add_done_callback(lambda _: self._land(key))
        return landed

    def _land(self, key: int) -> None:
        with self._landed:
            self._flights.pop(key, None)
            if not self._flights:
                self._landed.notify_all()

    def _wait_landed(self, timeout_s: float) -> bool:
        with self._landed:
            return self._landed.wait_for(lambda: not self._flights, timeout=max(0.0, timeout_s))

    def _require_running(self) -> None:
        from ... import bindings as b

        if self.phase is not Phase.RUNNING:
            raise b.UnavailableError(f"the in-process Triton server is {self.phase.value}: it takes no new requests")

    # -- the end ------------------------------------------------------------------------------------------
    def close(self, timeout_s: float | None = None) -> Ending:
        """End the server within ``timeout_s`` (default ``exit_timeout_s``) plus the forced end's
        ``FORCE_GRACE_S`` (see the module docstring); idempotent, never raises, returns how it ended."""
        with self._close_lock:
            if self._ending is not None:
                return self._ending
            with self._landed:
                self.phase = Phase.CLOSING
            drain_s = self.settings.exit_timeout_s if timeout_s is None else max(0.0, timeout_s)
            try:
                self._ending = self._end(time.monotonic() + drain_s)
            except Exception as exc:  # a bug must not keep the process from ending
                logger.exception("closing the in-process Triton server failed")
                self._ending = Ending(deleted=False, reason=f"close failed: {exc!r}")
            finally:
                self._cleanup()
                self.phase = Phase.CLOSED
                if not self.in_flight:  # else the exit hook must still keep the interpreter from finalizing
                    atexit.unregister(self._at_exit)
            log = logger.info if self._ending.deleted else logger.warning
            log("in-process Triton server stopped: %s", self._ending)
            return self._ending

    def _end(self, deadline: float) -> Ending:
        killed: list[int] = []
        if not self._wait_landed(deadline - time.monotonic()):
            killed = self._force()
            if not self._wait_landed(FORCE_GRACE_S):
                return Ending(deleted=False, killed_stubs=tuple(killed), stranded=self.in_flight, reason="stranded")
        dead = [c for c in stubs.stub_children() if c.zombie and c.pid in self._known_stubs]
        if killed or dead or self.stuck:
            why = f"models stuck loading {self.stuck}" if self.stuck else f"{len(killed or dead)} stub(s) died"
            return self._abandon(killed, f"{why}: Triton cannot unload them")
        return self._delete(max(deadline - time.monotonic(), UNLOAD_MIN_S))

    def _force(self) -> list[int]:
        """End every request in flight at once: cancel each in Triton, then kill the stubs executing them."""
        with self._landed:
            flights = list(self._flights.values())
        for request in flights:
            with contextlib.suppress(Exception):  # released meanwhile: nothing to cancel
                request.cancel()
        killed = stubs.kill(stubs.stub_pids(self.shm_prefix))
        logger.warning("%d request(s) in flight at the deadline: cancelled, stubs %s killed", len(flights), killed)
        return killed

    def _delete(self, unload_s: float) -> Ending:
        """Unload every model (polled: Triton's own stop checks once a second), then delete the server."""
        from ... import bindings as b

        try:
            for name in list(self.models):
                self.server.unload_model(name)
            deadline = time.monotonic() + unload_s
            while (live := self._live_models()) and time.monotonic() < deadline:
                time.sleep(UNLOAD_POLL_S)
            if live:
                return self._abandon([], f"models {live} did not unload within {unload_s:.1f} s")
            self.server.set_exit_timeout(DELETE_EXIT_TIMEOUT_S)
            self.server.delete()
        except b.TritonError as exc:
            return self._abandon([], f"Triton could not stop: {exc}")
        return Ending(deleted=True)

    def _live_models(self) -> list[str]:
        return [m["name"] for m in self.server.model_index().json() if m.get("state") in _LIVE_STATES]

    def _abandon(self, killed: list[int], reason: str) -> Ending:
        """Leave the server undeleted (safe: nothing is in flight) and end its stubs ourselves."""
        more = stubs.kill(stubs.stub_pids(self.shm_prefix))
        return Ending(deleted=False, killed_stubs=tuple(killed + more), reason=reason)

    def _cleanup(self) -> None:
        for key, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self._output is not None:
            self._output.close()
        remove_shm_regions(self.shm_prefix)
        shutil.rmtree(self._workdir, ignore_errors=True)

    def _at_exit(self) -> None:
        """Interpreter exit with the server running, or with requests a ``close()`` abandoned still out: close
        (a no-op after a close), wait a last grace for what is out, else end the process before it finalizes."""
        closed_before = self._ending is not None
        ending = self.close()
        if self._wait_landed(self.settings.exit_timeout_s if closed_before else 0.0):
            return
        logger.critical(
            "in-process Triton: %d request(s) still in flight after the deadline (%s); ending the process now "
            "(exit code %d): a finalizing interpreter would crash under their callbacks",
            self.in_flight,
            ending.reason,
            STRANDED_EXIT_CODE,
        )
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(STRANDED_EXIT_CODE)
