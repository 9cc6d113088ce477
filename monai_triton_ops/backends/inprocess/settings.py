"""What the process's in-process Triton server is started with, and the C API's server options made from them.

Every backend that shares the server (``shared``) must ask for the same ``ServerSettings``. The options
are fixed ones (explicit model control, strict readiness, no pinned memory pool, no GPU metrics, the Python
backend's shared-memory prefix of this server) and the settings' own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ... import bindings


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """What the process's server is started with; every backend sharing it must ask for the same."""

    library_path: Path | None = None
    log_verbose: int = 0
    log_file: Path | None = None
    exit_timeout_s: int = 15
    backend_config: tuple[tuple[str, str, str], ...] = ()  # (backend, setting, value)
    buffer_manager_thread_count: int | None = None
    model_load_thread_count: int | None = None


def server_options(
    settings: ServerSettings, *, backends: Path, repository: Path, log_path: Path, shm_prefix: str
) -> bindings.TRITONSERVER_ServerOptions:
    """``TRITONSERVER_ServerOptions`` for a server over ``repository`` with the backend folder ``backends``; the
    caller deletes them once the server is made."""
    from ... import bindings

    s = settings
    options = bindings.TRITONSERVER_ServerOptions()
    options.set_model_repository_path(repository).set_backend_directory(backends)
    options.set_model_control_mode(bindings.TRITONSERVER_ModelControlMode.EXPLICIT)
    options.set_exit_timeout(s.exit_timeout_s).set_strict_readiness(True)
    options.set_log_file(log_path).set_log_verbose(s.log_verbose)
    options.set_log_info(s.log_verbose > 0).set_log_warn(True).set_log_error(True)
    options.set_pinned_memory_pool_byte_size(0).set_gpu_metrics(False)
    options.set_backend_config("python", "shm-region-prefix-name", shm_prefix)
    for backend, setting, value in s.backend_config:
        options.set_backend_config(backend, setting, value)
    if s.buffer_manager_thread_count is not None:
        options.set_buffer_manager_thread_count(s.buffer_manager_thread_count)
    if s.model_load_thread_count is not None:
        options.set_model_load_thread_count(s.model_load_thread_count)
    return options
