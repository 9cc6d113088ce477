"""The one owner of an in-process Triton server's life: start, models, the requests in flight, and its end.

The binding (``bindings/``) is the C API with its ownership rules and no policy; every decision about
*when* and *how long* lives here and in ``ending`` (how the server ends), so one place says when the server
goes away::

    InProcessServer(settings, repository)   start: library, stub environment, backend folder, server
    .load(model, repository)                explicit load; fails fast when a Python-backend stub cannot start
    .submit(request, key, answer)           lend a request to Triton (refused unless running); ``flights``
                                            tracks it until it lands, then deletes it
    .cancel(key)                            best effort, at a deadline
    .unload(model)
    .close(timeout_s)                       drain until the deadline, then end, or retire (``ending``)
    .revive()                               the next open takes a retiring server back
    at interpreter exit, at a signal        the forced end (``ending``), registered while the server lives

Around the server, exactly what the local server launcher sets up (``server.environment``): a backend folder
with the Python backend (its stub behind ``stubs.StubOutput``'s wrapper), the stub environment, a
shared-memory prefix of our own, and a symlink mirror of each repository (``server.mirror``), refreshed per
model load (the stubs' isolated interpreters would write ``__pycache__`` into the user's repository).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
import shutil
from collections.abc import Hashable
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
from .ending import STRANDED_EXIT_CODE as STRANDED_EXIT_CODE
from .ending import End, Ending, Phase
from .flights import Answer, Flights, delete
from .settings import ServerSettings as ServerSettings
from .settings import server_options

if TYPE_CHECKING:
    from ... import bindings

logger = logging.getLogger(__name__)

#: Environment variables the stubs inherit, set in this process while the server runs (``server_environment``
#: says why each): the library and Python paths, OpenMP threads that sleep between requests, and glibc keeping
#: freed tensor buffers for reuse. This process's own allocator read its settings at start and is unaffected.
STUB_ENVIRON = ("LD_LIBRARY_PATH", "PATH", "OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

__all__ = ["STRANDED_EXIT_CODE", "Ending", "InProcessServer", "Phase", "ServerSettings"]


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
        self.stuck: list[str] = []  # models whose load never ended (a stub died before Triton heard from it)
        self.known_stubs: set[int] = set()  # stub pids seen alive: one that is a zombie now died
        self.flights = Flights()
        self._stub_checked: str | None = None  # why the backend folder's stub cannot start ("" if it can)
        self._workdir = temp_folder("inprocess")
        self._saved_environ = {key: os.environ.get(key) for key in STUB_ENVIRON}
        self._output: stubs.StubOutput | None = None
        try:
            self._start(library.install, repository)
        except BaseException:
            self.cleanup()
            raise
        self._end = End(self, settings.exit_timeout_s)  # from here the exit hook and the signal cleanup hold it
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
        return len(self.flights)

    @property
    def phase(self) -> Phase:
        return self._end.phase

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

        self._end.admit()
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
        self.known_stubs.update(stubs.stub_pids(self.shm_prefix))

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
    def submit(
        self,
        request: bindings.TRITONSERVER_InferenceRequest,
        key: Hashable | None = None,
        answer: Answer | None = None,
    ) -> concurrent.futures.Future[None]:
        """Lend ``request`` to Triton: from here it is the server's, tracked in ``flights`` under ``key`` (default
        the request) until Triton lets go of it, then deleted; ``answer`` fails if the flight failed unanswered.
        Returns the flight's future (landed).

        Raises:
            bindings.UnavailableError: the server is not running (closing, retiring, closed); the request is
                deleted, as is one that Triton refused.
        """
        key = request if key is None else key
        try:
            self.flights.add(key, request, answer or _NO_ANSWER, self._end.admit)
        except BaseException:
            _delete_unlent(request)
            raise
        try:
            landed = self.server.infer_async(request)
        except BaseException:
            self.flights.withdraw(key)
            raise
        landed.add_done_callback(functools.partial(self.flights.land, key))
        return landed

    def cancel(self, key: Hashable) -> None:
        """Ask Triton to cancel the request submitted under ``key``, best effort."""
        self.flights.cancel(key)

    # -- the end (``ending``) -------------------------------------------------------------------------------
    def close(self, timeout_s: float | None = None) -> Ending:
        """End the server within ``timeout_s`` (default ``exit_timeout_s``), or retire it while Triton still
        holds cut-off requests (see ``ending``); idempotent, never raises, returns how it ended."""
        return self._end.close(timeout_s)

    def revive(self) -> bool:
        """Take a retiring server back (the next open with the same settings); False when it is not retiring."""
        return self._end.revive()

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait (bounded) for a server that ends on its retiring thread; whether it is closed."""
        return self._end.wait_closed(timeout_s)

    @property
    def ending(self) -> Ending | None:
        """How the server ended or is ending; None while it runs."""
        return self._end.ending

    def cleanup(self) -> None:
        """Restore the environment; remove the shared memory, the temporary folder, the stub output pipe."""
        for key, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self._output is not None:
            self._output.close()
        remove_shm_regions(self.shm_prefix)
        shutil.rmtree(self._workdir, ignore_errors=True)


class _NoAnswer:
    """The answer of a request submitted without one (the owner reads the flight's future instead)."""

    def fail(self, error: BaseException) -> None:
        """Nothing to fail: the flight's future carries ``error``."""


_NO_ANSWER = _NoAnswer()


def _delete_unlent(request: bindings.TRITONSERVER_InferenceRequest) -> None:
    """Delete a request that was never lent (refused before Triton saw it)."""
    with contextlib.suppress(Exception):
        delete(request)
