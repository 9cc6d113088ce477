"""``LocalTritonServer``: the real ``tritonserver`` as a child process of this one, for development and tests.

Lifecycle: ``NEW -> start() -> RUNNING -> stop() -> STOPPED``, or ``with LocalTritonServer(repo) as server:``.
``stop()`` is idempotent and a stopped server cannot be started again (make a new one): its ports, log and
temporary folder are gone, and reusing the object would hide that. A failed ``start()`` leaves it
``STOPPED`` with nothing running and no temporary folder left. There is no ``__del__``: an object dropped
without ``stop()`` leaves its server running until this process exits, when the kernel kills it.

What ``start()`` does, in order::

    find tritonserver      server_path > $TRITONSERVER_HOME > nvidia-pytriton wheel    (ServerNotFoundError)
    check given ports      127.0.0.1 only; others picked free                          (PortInUseError)
    temp folder            backends/python/ (symlinks), repository/ (a symlink mirror: nothing is written into
                           the user's repository, see mirror.py) + tritonserver.log
    stub check             the Python backend stub links here, if the repository has Python models
                                                                                       (ServerStartError)
    launch                 argv list, own process group, SIGKILL when this thread dies (Linux, prctl)
    wait, ONE deadline     process alive; no model load failure and no stub failure in the log (Triton 2.51
                           waits forever for a stub that cannot start); /v2/health/live and /ready;
                           every model ready (/v2/models/NAME/ready; repository index for the reason)
                                                                                       (ServerStartError + log tail)

``stop()`` sends SIGINT, waits ``stop_timeout_s + 5`` s, then SIGKILLs the whole process group (the
server and its Python backend stubs) and removes the temporary folder.

The parent-death signal is tied to the *thread* that called ``start()``: start the server from a thread
that lives as long as the server (the main thread, usually).
"""

from __future__ import annotations

import enum
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from ..client import loopback
from ..discovery import TritonInstall, find_tritonserver
from ..errors import ConfigError, ModelNotFoundError, PortInUseError, ServerError, ServerStartError
from . import logs, readiness
from .environment import (
    assemble_backend_dir,
    remove_leftovers_of_dead_launchers,
    remove_shm_regions,
    server_environment,
    shm_prefix,
)
from .mirror import mirror_repository
from .options import ModelControlMode, Ports, ServerOptions, build_argv
from .ports import LOOPBACK, pick_free_ports, port_is_free
from .process import die_with_parent, terminate

logger = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.1
_PROBE_TIMEOUT_S = 1.0
_PORT_ATTEMPTS = 3
#: Starts of a server whose Python backend aborted it while loading (``readiness.LoadAborted``): one more try.
_LOAD_ATTEMPTS = 2
#: Grace after SIGINT when a start failed: the server is of no use, do not wait long for it.
_FAILED_START_GRACE_S = 5.0


class ServerState(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"


class LocalTritonServer:
    """A ``tritonserver`` serving ``model_repository`` on 127.0.0.1, started and stopped by this object.

    >>> with LocalTritonServer("model_repository") as server:  # doctest: +SKIP
    ...     client = tritonclient.grpc.InferenceServerClient(server.grpc_address)

    Options are those of :class:`ServerOptions`; see the module docstring for what start and stop do.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        server_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        log_verbose: int = 0,
        log_path: str | os.PathLike[str] | None = None,
        model_control_mode: ModelControlMode = "none",
        models: Sequence[str] = (),
        model_load_thread_count: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.options = ServerOptions(
            model_repository=Path(model_repository),
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            server_path=Path(server_path) if server_path is not None else None,
            startup_timeout_s=startup_timeout_s,
            stop_timeout_s=stop_timeout_s,
            log_verbose=log_verbose,
            log_path=Path(log_path) if log_path is not None else None,
            model_control_mode=model_control_mode,
            models=_strings("models", models),
            model_load_thread_count=model_load_thread_count,
            extra_args=_strings("extra_args", extra_args),
        )
        self._state = ServerState.NEW
        self._state_lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._log_path: Path | None = None
        self._ports: Ports | None = None
        self._shm_prefix = shm_prefix()
        self._terminated: set[int] = set()
        self._install: TritonInstall | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> LocalTritonServer:
        """Start the server and wait until it and its models are ready; returns ``self``.

        Raises:
            ServerNotFoundError: no ``tritonserver`` where it was looked for.
            PortInUseError: a requested port is bound by another process.
            ServerStartError: the server exited, a model failed to load, or the deadline passed.
            ServerError: the server was started before.
        """
        with self._state_lock:
            if self._state is not ServerState.NEW:
                raise ServerError(f"cannot start a LocalTritonServer that is {self._state.value}; create a new one")
            self._state = ServerState.STARTING
        try:
            self._start()
        except BaseException:
            self._shutdown(grace_s=_FAILED_START_GRACE_S)
            with self._state_lock:
                self._state = ServerState.STOPPED
            raise
        with self._state_lock:
            if self._state is ServerState.STARTING:  # not stopped meanwhile from another thread
                self._state = ServerState.RUNNING
        return self

    def stop(self) -> None:
        """SIGINT, then SIGKILL after the grace period; remove the temporary folder. Idempotent."""
        with self._state_lock:
            if self._state is ServerState.STOPPED:
                return
            self._state = ServerState.STOPPED
        self._shutdown(grace_s=self.options.stop_timeout_s + 5.0)

    def __enter__(self) -> LocalTritonServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what callers read --------------------------------------------------------------------
    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def pid(self) -> int | None:
        """The server's process id (also its process group id); kept after stop; ``None`` before start."""
        return self._process.pid if self._process is not None else None

    def is_alive(self) -> bool:
        """Whether the server process is running now."""
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """The server's exit status once it has exited (negative: killed by that signal), else ``None``."""
        return self._process.poll() if self._process is not None else None

    @property
    def ports(self) -> Ports:
        if self._ports is None:
            raise ServerError("the server has no ports before start()")
        return self._ports

    @property
    def http_port(self) -> int:
        return self.ports.http

    @property
    def grpc_port(self) -> int:
        return self.ports.grpc

    @property
    def metrics_port(self) -> int:
        return self.ports.metrics

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:PORT``: a backend spec, and the base of the HTTP/REST API."""
        return f"http://{LOOPBACK}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        """``grpc://127.0.0.1:PORT``: a backend spec (``tritonclient`` itself wants :attr:`grpc_address`)."""
        return f"grpc://{self.grpc_address}"

    @property
    def grpc_address(self) -> str:
        """``127.0.0.1:PORT``, as ``tritonclient.grpc.InferenceServerClient(url=...)`` wants it."""
        return f"{LOOPBACK}:{self.ports.grpc}"

    @property
    def http_address(self) -> str:
        """``127.0.0.1:PORT``, as ``tritonclient.http.InferenceServerClient(url=...)`` wants it."""
        return f"{LOOPBACK}:{self.ports.http}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.metrics}/metrics"

    @property
    def log_path(self) -> Path | None:
        """The server log; inside :attr:`workdir` (removed on stop) unless ``log_path`` was given."""
        return self._log_path

    @property
    def workdir(self) -> Path | None:
        """The temporary folder this server owns (backend folder, log); ``None`` once removed."""
        return self._workdir

    def __repr__(self) -> str:
        where = f" {self.http_url} {self.grpc_url}" if self._ports else ""
        repo = str(self.options.model_repository)
        return f"<LocalTritonServer {self._state.value} pid={self.pid}{where} repo={repo!r}>"

    # -- start --------------------------------------------------------------------------------
    def _start(self) -> None:
        options = self.options
        repo = options.model_repository
        if not repo.is_dir():
            raise ModelNotFoundError(f"model repository {str(repo)!r} is not a folder")
        install = self._install = find_tritonserver(options.server_path)
        given = {"http_port": options.http_port, "grpc_port": options.grpc_port, "metrics_port": options.metrics_port}
        for name, port in given.items():
            if port is not None and not port_is_free(port):
                raise PortInUseError(f"{name} {port} on {LOOPBACK} is already in use by another process")
        self._workdir = Path(tempfile.mkdtemp(prefix="monai-triton-server-"))
        backend_dir = assemble_backend_dir(install, self._workdir / "backends")
        served = replace(options, model_repository=mirror_repository(repo, self._workdir / "repository"))
        env = server_environment(install)
        readiness.check_stub(install, env, self.options)
        remove_leftovers_of_dead_launchers()
        self._log_path = options.log_path or self._workdir / "tritonserver.log"
        deadline = time.monotonic() + options.startup_timeout_s
        started = time.monotonic()
        taken = aborts = 0
        while True:
            self._ports = self._choose_ports()
            argv = build_argv(
                served,
                server_path=install.server_path,
                backend_dir=backend_dir,
                ports=self._ports,
                exit_timeout_s=max(1, int(options.stop_timeout_s)),
                shm_prefix=self._shm_prefix,
            )
            process = self._launch(argv, env, self._log_path)
            try:
                self._wait_ready(process, self._log_path, deadline)
                break
            except readiness.PortTaken:
                taken += 1
                if taken == _PORT_ATTEMPTS:
                    raise ServerStartError(
                        f"tritonserver could not bind free ports in {_PORT_ATTEMPTS} attempts",
                        log_tail=logs.read_tail(self._log_path),
                    ) from None
                logger.info("a picked port was taken before tritonserver bound it; retrying with other ports")
            except readiness.LoadAborted as exc:
                aborts += 1
                if aborts == _LOAD_ATTEMPTS or time.monotonic() >= deadline:
                    raise
                logger.warning("%s; starting it again", str(exc).splitlines()[0])
            self._terminate(grace_s=_FAILED_START_GRACE_S)
        logger.info(
            "tritonserver ready in %.1f s (pid %d): %s %s, log %s",
            time.monotonic() - started,
            self.pid,
            self.http_url,
            self.grpc_url,
            self._log_path,
        )

    def _choose_ports(self) -> Ports:
        o = self.options
        given = tuple(p for p in (o.http_port, o.grpc_port, o.metrics_port) if p is not None)
        free = iter(pick_free_ports(3 - len(given), exclude=given))
        return Ports(
            http=o.http_port or next(free), grpc=o.grpc_port or next(free), metrics=o.metrics_port or next(free)
        )

    def _launch(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        logger.info("starting tritonserver for %s: %s", self.options.model_repository, argv[0])
        logger.debug("tritonserver argv: %s", argv)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log_file:
            try:
                self._process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self._workdir,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                    close_fds=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise ServerStartError(f"cannot run {argv[0]!r}: {exc}") from exc
        logger.info("tritonserver launched (pid %d); waiting until it and its models are ready", self._process.pid)
        return self._process

    def _wait_ready(self, process: subprocess.Popen[bytes], log_path: Path, deadline: float) -> None:
        """Poll until the server and every wanted model are ready; raise as soon as that cannot happen."""
        base, offset = self.http_url, 0
        while True:
            code = process.poll()
            if code is not None:
                readiness.raise_exited(code, self.options, log_path, self._install)
            text, offset = logs.read_from(log_path, offset)
            readiness.raise_load_failures(text, self.options, log_path, self._install)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerStartError(
                    f"tritonserver was not ready within {self.options.startup_timeout_s:g} s",
                    log_tail=logs.read_tail(log_path),
                )
            probe = min(_PROBE_TIMEOUT_S, remaining)
            if (
                loopback.is_live(base, timeout_s=probe)
                and loopback.is_ready(base, timeout_s=probe)
                and loopback.http_status(self.metrics_url, timeout_s=probe) == 200  # the last service to start
                and readiness.models_ready(base, self.options, log_path, self._install, timeout_s=probe)
            ):
                return
            time.sleep(min(_POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))

    # -- stop ---------------------------------------------------------------------------------
    def _shutdown(self, *, grace_s: float) -> None:
        try:
            self._terminate(grace_s=grace_s)
        finally:
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
                if self._log_path is not None and self.options.log_path is None:
                    self._log_path = None

    def _terminate(self, *, grace_s: float) -> None:
        """Stop the current process and its group, once; remove the shared memory it leaves."""
        process = self._process
        if process is None or process.pid in self._terminated:
            return
        terminate(process, grace_s=grace_s)
        self._terminated.add(process.pid)
        if remove_shm_regions(self._shm_prefix):
            logger.info("removed the shared memory tritonserver (pid %d) left behind", process.pid)


def _strings(name: str, value: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)):
        raise ConfigError(f"{name} must be a sequence of strings, not one string: {value!r}")
    return tuple(value)
