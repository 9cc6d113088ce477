"""The launcher's configuration and the ``tritonserver`` command line built from it."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from .load_settings import needs_auto_complete
from .ports import LOOPBACK

ModelControlMode = Literal["none", "explicit"]
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """How to run one local ``tritonserver``. Ports left ``None`` are picked free on loopback at start."""

    model_repository: Path
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    server_path: Path | None = None
    """A ``tritonserver`` binary or install folder; default ``$TRITONSERVER_HOME``, then the wheel."""
    startup_timeout_s: float = 120.0
    """One deadline for the process to start, the server to be ready and every model to be ready."""
    stop_timeout_s: float = 30.0
    """Grace after SIGINT (also the server's ``--exit-timeout-secs``) before SIGKILL."""
    log_verbose: int = 0
    log_path: Path | None = None
    """Keep the server log here (overwritten at start, kept after stop); default a file in the temp folder."""
    model_control_mode: ModelControlMode = "none"
    models: tuple[str, ...] = ()
    """Models to wait for (``none``: default every model in the repository) or to load (``explicit``)."""
    model_load_thread_count: int | None = None
    """How many models load at once; default Triton's own (4)."""
    extra_args: tuple[str, ...] = field(default=())
    """Appended to the command line as they are."""

    def __post_init__(self) -> None:
        _set = object.__setattr__
        _set(self, "model_repository", Path(self.model_repository).expanduser())
        for name in ("server_path", "log_path"):
            value = getattr(self, name)
            if value is not None:
                _set(self, name, Path(value).expanduser())
        for name in ("models", "extra_args"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ConfigError(f"{name} must be a sequence of strings, got {value!r}")
            if not all(isinstance(item, str) for item in value):
                raise ConfigError(f"{name} must hold only strings, got {value!r}")
            _set(self, name, tuple(value))
        self._validate()

    def _validate(self) -> None:
        given: dict[int, str] = {}
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if port is None:
                continue
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ConfigError(f"{name} must be an int in 1..65535, got {port!r}")
            if port in given:
                raise ConfigError(f"{name} and {given[port]} are both {port}; each service needs its own port")
            given[port] = name
        for name in ("startup_timeout_s", "stop_timeout_s"):
            value = getattr(self, name)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (is_number and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if isinstance(self.log_verbose, bool) or not isinstance(self.log_verbose, int) or self.log_verbose < 0:
            raise ConfigError(f"log_verbose must be an int >= 0, got {self.log_verbose!r}")
        count = self.model_load_thread_count
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ConfigError(f"model_load_thread_count must be an int >= 1, got {count!r}")
        if self.model_control_mode not in ("none", "explicit"):
            raise ConfigError(f"model_control_mode must be 'none' or 'explicit', got {self.model_control_mode!r}")
        bad = [m for m in self.models if not _MODEL_NAME.match(m)]
        if bad:
            raise ConfigError(f"models holds names Triton cannot serve: {bad!r}")


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int


def build_argv(
    options: ServerOptions,
    *,
    server_path: Path,
    backend_dir: Path,
    ports: Ports,
    exit_timeout_s: int,
    shm_prefix: str | None = None,
) -> list[str]:
    """The ``tritonserver`` command line: loopback only, explicit ports, fail fast on a model that fails, models
    loaded as ``load_settings`` says (``extra_args`` come last, so a flag given there wins)."""
    argv = [
        os.fspath(server_path),
        f"--model-repository={os.fspath(options.model_repository.resolve())}",
        f"--backend-directory={os.fspath(backend_dir)}",
        f"--http-address={LOOPBACK}",
        f"--http-port={ports.http}",
        f"--grpc-address={LOOPBACK}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={LOOPBACK}",
        f"--metrics-port={ports.metrics}",
        f"--model-control-mode={options.model_control_mode}",
        "--exit-on-error=true",
        "--strict-readiness=true",
        f"--exit-timeout-secs={exit_timeout_s}",
        f"--log-verbose={options.log_verbose}",
    ]
    if shm_prefix:
        argv.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix}")
    if options.model_load_thread_count is not None:
        argv.append(f"--model-load-thread-count={options.model_load_thread_count}")
    if not needs_auto_complete(options.model_repository):
        argv.append("--disable-auto-complete-config")
    if options.model_control_mode == "explicit":
        argv += [f"--load-model={name}" for name in options.models]
    return argv + list(options.extra_args)
