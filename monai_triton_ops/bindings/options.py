"""``TRITONSERVER_ServerOptions``: everything a server is created with (write-only in the C API: setters)."""

from __future__ import annotations

import ctypes
import os

from ._library import lib
from ._object import TritonObject
from .enums import (
    TRITONSERVER_InstanceGroupKind,
    TRITONSERVER_LogFormat,
    TRITONSERVER_ModelControlMode,
    TRITONSERVER_RateLimitMode,
)

PathLike = str | os.PathLike[str]
#: Triton's default exit timeout (``--exit-timeout-secs``).
DEFAULT_EXIT_TIMEOUT_S = 30
#: ``--model-load-retry-count`` and ``--enable-peer-access`` defaults of the tritonserver program.
DEFAULT_MODEL_LOAD_RETRY_COUNT = 0
DEFAULT_ENABLE_PEER_ACCESS = True


def _s(value: str | os.PathLike[str]) -> bytes:
    return os.fsencode(value)


class TRITONSERVER_ServerOptions(TritonObject):
    """``TRITONSERVER_ServerOptionsNew``; pass to ``TRITONSERVER_Server`` (which copies what it needs)."""

    _c_delete = "TRITONSERVER_ServerOptionsDelete"

    def __init__(self) -> None:
        out = ctypes.c_void_p()
        lib().TRITONSERVER_ServerOptionsNew(ctypes.byref(out))
        super().__init__(out.value or 0)
        self.exit_timeout_s = DEFAULT_EXIT_TIMEOUT_S
        """What ``set_exit_timeout`` set (the C API has no getters): the server waits this long at stop."""
        # Triton 2.51's options constructor leaves these two fields uninitialised (the tritonserver program
        # always sets them from its command line): heap garbage made a failed load retry millions of times.
        # Set them to the program's defaults; the setters below may change them.
        self.set_model_load_retry_count(DEFAULT_MODEL_LOAD_RETRY_COUNT)
        self.set_enable_peer_access(DEFAULT_ENABLE_PEER_ACCESS)

    def _set(self, function: str, *args: object) -> TRITONSERVER_ServerOptions:
        getattr(lib(), f"TRITONSERVER_ServerOptions{function}")(self._ptr(), *args)
        return self

    # Each setter returns self so that options read as one chain.
    def set_server_id(self, server_id: str) -> TRITONSERVER_ServerOptions:
        return self._set("SetServerId", server_id.encode())

    def set_model_repository_path(self, path: PathLike) -> TRITONSERVER_ServerOptions:
        return self._set("SetModelRepositoryPath", _s(path))

    def set_model_control_mode(self, mode: TRITONSERVER_ModelControlMode) -> TRITONSERVER_ServerOptions:
        return self._set("SetModelControlMode", int(mode))

    def set_startup_model(self, model_name: str) -> TRITONSERVER_ServerOptions:
        return self._set("SetStartupModel", model_name.encode())

    def set_strict_model_config(self, strict: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetStrictModelConfig", bool(strict))

    def set_model_config_name(self, name: str) -> TRITONSERVER_ServerOptions:
        return self._set("SetModelConfigName", name.encode())

    def set_rate_limiter_mode(self, mode: TRITONSERVER_RateLimitMode) -> TRITONSERVER_ServerOptions:
        return self._set("SetRateLimiterMode", int(mode))

    def add_rate_limiter_resource(self, name: str, count: int, device: int) -> TRITONSERVER_ServerOptions:
        return self._set("AddRateLimiterResource", name.encode(), int(count), int(device))

    def set_pinned_memory_pool_byte_size(self, size: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetPinnedMemoryPoolByteSize", int(size))

    def set_cuda_memory_pool_byte_size(self, gpu_device: int, size: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetCudaMemoryPoolByteSize", int(gpu_device), int(size))

    def set_cuda_virtual_address_size(self, gpu_device: int, size: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetCudaVirtualAddressSize", int(gpu_device), int(size))

    def set_response_cache_byte_size(self, size: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetResponseCacheByteSize", int(size))

    def set_cache_config(self, cache_name: str, config_json: str) -> TRITONSERVER_ServerOptions:
        return self._set("SetCacheConfig", cache_name.encode(), config_json.encode())

    def set_cache_directory(self, cache_dir: PathLike) -> TRITONSERVER_ServerOptions:
        return self._set("SetCacheDirectory", _s(cache_dir))

    def set_min_supported_compute_capability(self, cc: float) -> TRITONSERVER_ServerOptions:
        return self._set("SetMinSupportedComputeCapability", float(cc))

    def set_exit_on_error(self, exit_on_error: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetExitOnError", bool(exit_on_error))

    def set_strict_readiness(self, strict: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetStrictReadiness", bool(strict))

    def set_exit_timeout(self, timeout_s: int) -> TRITONSERVER_ServerOptions:
        self._set("SetExitTimeout", int(timeout_s))
        self.exit_timeout_s = int(timeout_s)
        return self

    def set_buffer_manager_thread_count(self, count: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetBufferManagerThreadCount", int(count))

    def set_model_load_thread_count(self, count: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetModelLoadThreadCount", int(count))

    def set_model_load_retry_count(self, count: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetModelLoadRetryCount", int(count))

    def set_model_namespacing(self, enable: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetModelNamespacing", bool(enable))

    def set_enable_peer_access(self, enable: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetEnablePeerAccess", bool(enable))

    def set_log_file(self, path: PathLike) -> TRITONSERVER_ServerOptions:
        return self._set("SetLogFile", _s(path))

    def set_log_info(self, log: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetLogInfo", bool(log))

    def set_log_warn(self, log: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetLogWarn", bool(log))

    def set_log_error(self, log: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetLogError", bool(log))

    def set_log_format(self, log_format: TRITONSERVER_LogFormat) -> TRITONSERVER_ServerOptions:
        return self._set("SetLogFormat", int(log_format))

    def set_log_verbose(self, level: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetLogVerbose", int(level))

    def set_metrics(self, enable: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetMetrics", bool(enable))

    def set_gpu_metrics(self, enable: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetGpuMetrics", bool(enable))

    def set_cpu_metrics(self, enable: bool) -> TRITONSERVER_ServerOptions:
        return self._set("SetCpuMetrics", bool(enable))

    def set_metrics_interval(self, interval_ms: int) -> TRITONSERVER_ServerOptions:
        return self._set("SetMetricsInterval", int(interval_ms))

    def set_backend_directory(self, path: PathLike) -> TRITONSERVER_ServerOptions:
        return self._set("SetBackendDirectory", _s(path))

    def set_repo_agent_directory(self, path: PathLike) -> TRITONSERVER_ServerOptions:
        return self._set("SetRepoAgentDirectory", _s(path))

    def set_model_load_device_limit(
        self, kind: TRITONSERVER_InstanceGroupKind, device_id: int, fraction: float
    ) -> TRITONSERVER_ServerOptions:
        return self._set("SetModelLoadDeviceLimit", int(kind), int(device_id), float(fraction))

    def set_backend_config(self, backend_name: str, setting: str, value: str) -> TRITONSERVER_ServerOptions:
        return self._set("SetBackendConfig", backend_name.encode(), setting.encode(), value.encode())

    def set_host_policy(self, policy_name: str, setting: str, value: str) -> TRITONSERVER_ServerOptions:
        return self._set("SetHostPolicy", policy_name.encode(), setting.encode(), value.encode())

    def set_metrics_config(self, name: str, setting: str, value: str) -> TRITONSERVER_ServerOptions:
        return self._set("SetMetricsConfig", name.encode(), setting.encode(), value.encode())
