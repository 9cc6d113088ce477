"""The one in-process Triton server of this process, shared by every ``triton`` backend.

Triton keeps process-wide state (memory pools, metrics; pitfall A11), so a process runs one server:
the first backend that opens starts it, each backend holds a reference to it and to its model, and the
last one to close stops it. Models are loaded explicitly (``EXPLICIT`` model control): a model is loaded
when its first backend opens and unloaded when its last one closes, so the app runs exactly the models
it opened from a repository that may hold many.

Around the server, exactly what the local server launcher sets up (``server.environment``, one helper):
a backend folder holding the Python backend and its stub; the stub's environment (``LD_LIBRARY_PATH``,
``PATH``, ``OMP_WAIT_POLICY``, glibc's ``MALLOC_*_THRESHOLD_``: set in this process's environment, which
the stubs inherit, and restored at stop); a shared-memory prefix of our own, so leftovers of a killed
process can be told apart and removed; and a symlink mirror of each repository in the server's
temporary folder (``server.mirror``): the stubs' isolated interpreters ignore ``PYTHONDONTWRITEBYTECODE``
and would write ``__pycache__`` into the user's repository. A model's folder is mirrored anew each time
it loads.

At interpreter exit, backends still open are closed (requests drained up to their close deadline)
and the server is deleted before Python finalizes, so no Triton thread calls back into a finalizing
interpreter (pitfall A9).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from ..errors import BackendUnavailableError, ConfigError, ModelLoadError, ServerNotFoundError
from ..repository.servable import load_failure
from ..server.environment import (
    assemble_backend_dir,
    remove_shm_regions,
    remove_stale_shm_regions,
    server_environment,
    shm_prefix,
)
from ..server.mirror import mirror_repository

if TYPE_CHECKING:
    from ..bindings import TRITONSERVER_ServerOptions

logger = logging.getLogger(__name__)

#: Environment variables the stubs inherit, set in this process while the server runs (``server_environment``
#: says why each): the library and Python paths, OpenMP threads that sleep between requests, and glibc keeping
#: freed tensor buffers for reuse. This process's own allocator read its settings at start and is unaffected.
_STUB_ENVIRON = ("LD_LIBRARY_PATH", "PATH", "OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """What the process's server is started with; every backend sharing it must ask for the same."""

    library_path: Path | None = None
    log_verbose: int = 0
    log_file: Path | None = None
    exit_timeout_s: int = 30
    backend_config: tuple[tuple[str, str, str], ...] = ()  # (backend, setting, value)
    buffer_manager_thread_count: int | None = None
    model_load_thread_count: int | None = None


class SharedServer:
    """The running server: its models' reference counts, its repositories, its temporary folder."""

    def __init__(self, settings: ServerSettings, repository: Path) -> None:
        from .. import bindings as b

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
        self.models: dict[str, int] = {}
        self.shm_prefix = shm_prefix()
        self._workdir = Path(tempfile.mkdtemp(prefix="monai_triton_inprocess_"))
        self._saved_environ = {key: os.environ.get(key) for key in _STUB_ENVIRON}
        try:
            remove_stale_shm_regions()
            stub_env = server_environment(library.install)
            os.environ.update({key: stub_env[key] for key in _STUB_ENVIRON})
            backends = assemble_backend_dir(library.install, self._workdir / "backends")
            options = self._options(backends, self._mirror(repository))
            try:
                self.server = b.TRITONSERVER_Server(options)
            finally:
                options.delete()
        except BaseException:
            self._cleanup()
            raise
        logger.info("in-process Triton server started on %s (library %s)", repository, library.path)

    @property
    def log_path(self) -> Path:
        return self.settings.log_file or self._workdir / "triton.log"

    def _options(self, backends: Path, repository: Path) -> TRITONSERVER_ServerOptions:
        from .. import bindings

        s = self.settings
        options = bindings.TRITONSERVER_ServerOptions()
        options.set_model_repository_path(repository).set_backend_directory(backends)
        options.set_model_control_mode(bindings.TRITONSERVER_ModelControlMode.EXPLICIT)
        options.set_exit_timeout(s.exit_timeout_s).set_strict_readiness(True)
        options.set_log_file(self.log_path).set_log_verbose(s.log_verbose)
        options.set_log_info(s.log_verbose > 0).set_log_warn(True).set_log_error(True)
        options.set_pinned_memory_pool_byte_size(0).set_gpu_metrics(False)
        options.set_backend_config("python", "shm-region-prefix-name", self.shm_prefix)
        for backend, setting, value in s.backend_config:
            options.set_backend_config(backend, setting, value)
        if s.buffer_manager_thread_count is not None:
            options.set_buffer_manager_thread_count(s.buffer_manager_thread_count)
        if s.model_load_thread_count is not None:
            options.set_model_load_thread_count(s.model_load_thread_count)
        return options

    def _mirror(self, repository: Path) -> Path:
        """A symlink mirror of ``repository`` for the server: the stubs' ``__pycache__`` lands there, not in it."""
        mirror = mirror_repository(repository, self._workdir / "repositories" / str(len(self.repositories)))
        self.repositories[repository] = mirror
        return mirror

    def _refresh(self, name: str, repository: Path) -> None:
        """Mirror the model's folder anew before it loads: files added or removed since are seen."""
        mirrored = self.repositories[repository] / name
        shutil.rmtree(mirrored, ignore_errors=True)
        if (repository / name).is_dir():
            mirror_repository(repository / name, mirrored)

    # -- models (called under the module lock) -----------------------------------------------------
    def add_model(self, name: str, repository: Path) -> None:
        """Load ``name`` unless a backend already holds it; a new repository is registered first."""
        from .. import bindings as b

        if repository not in self.repositories:
            self.server.register_model_repository(self._mirror(repository))
        if self.models.get(name, 0) == 0:
            self._refresh(name, repository)
            try:
                self.server.load_model(name)
            except b.TritonError as exc:
                hint = load_failure(repository / name, self.install, str(exc), where="the in-process Triton server")
                raise hint or ModelLoadError(
                    f"model {name!r} failed to load in the in-process Triton server: {exc}"
                ) from exc
        self.models[name] = self.models.get(name, 0) + 1

    def drop_model(self, name: str) -> None:
        """Release one hold on ``name``; the last one unloads it (requests in flight keep it until they land)."""
        left = self.models.get(name, 0) - 1
        if left > 0:
            self.models[name] = left
            return
        self.models.pop(name, None)
        try:
            self.server.unload_model(name)
        except Exception:  # the server keeps running; the next load reports anything real
            logger.warning("unloading model %r failed", name, exc_info=True)

    def stop(self) -> None:
        """Delete the server (it waits for requests in flight up to the exit timeout) and clean up."""
        try:
            self.server.delete()
        except Exception:
            logger.warning("stopping the in-process Triton server failed", exc_info=True)
            self.server.wait_deleted(timeout_s=self.settings.exit_timeout_s + 5)
        finally:
            self._cleanup()
        logger.info("in-process Triton server stopped")

    def _cleanup(self) -> None:
        for key, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        remove_shm_regions(self.shm_prefix)
        shutil.rmtree(self._workdir, ignore_errors=True)


class _Process:
    """The process's server (at most one) and the backends holding it."""

    lock = threading.RLock()
    server: SharedServer | None = None
    holders = 0
    open_backends: ClassVar[weakref.WeakSet[Closable]] = weakref.WeakSet()
    atexit_registered = False


class Closable(Protocol):
    """What the exit hook closes: an open backend."""

    def close(self, timeout_s: float | None = None) -> None: ...


def acquire(settings: ServerSettings, repository: Path, model: str, holder: Closable) -> SharedServer:
    """The process's server with ``model`` loaded, started on first use; one hold per call.

    Raises:
        ConfigError: the server already runs with other settings.
        ModelLoadError: the model failed to load (Triton's own message).
        BackendUnavailableError: no Triton library here (how to install one).
    """
    with _Process.lock:
        server = _Process.server
        if server is None:
            server = SharedServer(settings, repository)
            _Process.server = server
            _register_atexit()
        elif server.settings != settings:
            raise ConfigError(
                "the in-process Triton server of this process already runs with other server options "
                f"({server.settings}); every 'triton' backend of a process must use the same ones, got {settings}"
            )
        try:
            server.add_model(model, repository)
        except BaseException:
            if _Process.holders == 0:
                _Process.server = None
                server.stop()
            raise
        _Process.holders += 1
        _Process.open_backends.add(holder)
        return server


def release(model: str, holder: Closable) -> None:
    """Give back one hold: unload ``model`` at its last, stop the server at the very last."""
    with _Process.lock:
        server = _Process.server
        _Process.open_backends.discard(holder)
        if server is None:
            return
        server.drop_model(model)
        _Process.holders -= 1
        if _Process.holders > 0:
            return
        _Process.server = None
    server.stop()


def current() -> SharedServer | None:
    """The running server, if any (for tests and diagnostics)."""
    return _Process.server


def _register_atexit() -> None:
    if not _Process.atexit_registered:
        # Registered after the binding's own hook (which the first server created registers), so it runs first.
        atexit.register(_close_at_exit)
        _Process.atexit_registered = True


def _close_at_exit() -> None:
    """Close every backend still open (draining its requests), which stops the server."""
    for backend in list(_Process.open_backends):
        try:
            backend.close()
        except Exception:
            logger.warning("closing %r at exit failed", backend, exc_info=True)
    with _Process.lock:
        server, _Process.server = _Process.server, None
        _Process.holders = 0
    if server is not None:
        server.stop()
