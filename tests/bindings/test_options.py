"""``TRITONSERVER_ServerOptions``: every setter, on a server that then starts, serves and stops."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monai_triton_ops import bindings as b

from .. import triton_models
from .conftest import run_case
from .harness import Started, infer, stop_server, stub_pids

pytestmark = pytest.mark.triton


def _options_table(log: str) -> dict[str, str]:
    """Triton's start-up table of the options it runs with (``| option | value |``)."""
    table = log[log.index("| Option ") :]
    rows = (line.split("|") for line in table.splitlines() if line.startswith("| "))
    return {row[1].strip(): row[2].strip() for row in rows if len(row) > 3}


_TABLE_OPTIONS = (  # each shows its value in Triton's options table, in its backends' command line, or in use
    "ServerOptionsNew",
    "ServerOptionsSetServerId",
    "ServerOptionsSetModelRepositoryPath",
    "ServerOptionsSetBackendDirectory",
    "ServerOptionsSetModelControlMode",
    "ServerOptionsSetStartupModel",
    "ServerOptionsSetStrictModelConfig",
    "ServerOptionsSetModelConfigName",
    "ServerOptionsSetModelNamespacing",
    "ServerOptionsSetRateLimiterMode",
    "ServerOptionsAddRateLimiterResource",
    "ServerOptionsSetPinnedMemoryPoolByteSize",
    "ServerOptionsSetCudaMemoryPoolByteSize",
    "ServerOptionsSetMinSupportedComputeCapability",
    "ServerOptionsSetModelLoadDeviceLimit",
    "ServerOptionsSetStrictReadiness",
    "ServerOptionsSetExitTimeout",
    "ServerOptionsSetLogFile",
    "ServerOptionsSetLogFormat",
    "ServerOptionsSetLogInfo",
    "ServerOptionsSetLogWarn",
    "ServerOptionsSetLogError",
    "ServerOptionsSetLogVerbose",
    "ServerOptionsSetMetrics",
    "ServerOptionsSetCpuMetrics",
    "ServerOptionsSetMetricsConfig",
    "ServerOptionsSetBackendConfig",
    "ServerNew",
    "ServerDelete",
)


@pytest.mark.checks(*(f"TRITONSERVER_{name}" for name in _TABLE_OPTIONS))
def test_a_server_built_with_every_option(triton_library: Any, tmp_path: Path) -> None:
    """Every setter on one server that starts and serves; each value is then read back where Triton shows it.
    (Those with nothing to show on a machine without a GPU are listed in ``test_coverage.py``.)"""
    from monai_triton_ops.server.environment import assemble_backend_dir, server_environment, shm_prefix

    repo = triton_models.passthrough(tmp_path / "repo", "fast")
    environ = server_environment(triton_library.install)
    options = b.TRITONSERVER_ServerOptions()
    options.set_server_id("every-option").set_model_repository_path(repo)
    options.set_backend_directory(assemble_backend_dir(triton_library.install, tmp_path / "backends"))
    options.set_repo_agent_directory(tmp_path / "repoagents").set_cache_directory(tmp_path / "caches")
    options.set_model_control_mode(b.TRITONSERVER_ModelControlMode.EXPLICIT).set_startup_model("fast")
    options.set_strict_model_config(False).set_model_config_name("alternative").set_model_namespacing(True)
    options.set_rate_limiter_mode(b.TRITONSERVER_RateLimitMode.EXEC_COUNT).add_rate_limiter_resource("R1", 4, -1)
    options.set_pinned_memory_pool_byte_size(0).set_cuda_memory_pool_byte_size(0, 12345)
    options.set_cuda_virtual_address_size(0, 0).set_response_cache_byte_size(0)
    options.set_min_supported_compute_capability(7.5).set_enable_peer_access(False)
    options.set_model_load_device_limit(b.TRITONSERVER_InstanceGroupKind.GPU, 0, 0.9)
    options.set_exit_on_error(True).set_strict_readiness(False).set_exit_timeout(17)
    options.set_buffer_manager_thread_count(0).set_model_load_thread_count(2).set_model_load_retry_count(0)
    log = tmp_path / "triton.log"
    options.set_log_file(log).set_log_info(True).set_log_warn(False).set_log_error(True).set_log_verbose(1)
    options.set_log_format(b.TRITONSERVER_LogFormat.ISO8601)
    options.set_metrics(True).set_gpu_metrics(False).set_cpu_metrics(True).set_metrics_interval(1000)
    options.set_metrics_config("", "summary_latencies", "true")  # (section, setting, value)
    prefix = shm_prefix()
    options.set_backend_config("python", "shm-region-prefix-name", prefix)
    options.set_host_policy("cpu_policy", "numa-node", "0")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in environ.items():
            mp.setenv(key, value)
        server = b.TRITONSERVER_Server(options)
        options.delete()
        started = Started(server=server, workdir=tmp_path, log_path=log, shm_prefix=prefix)
        try:
            assert server.model_is_ready("fast")  # the startup model
            assert (
                b.TRITONSERVER_LogIsEnabled(b.TRITONSERVER_LogLevel.WARN),
                b.TRITONSERVER_LogIsEnabled(b.TRITONSERVER_LogLevel.VERBOSE),
            ) == (False, True)
            np.testing.assert_array_equal(
                infer(server, "fast", {"INPUT__0": np.ones(2, np.float32)})["OUTPUT__0"], [1, 1]
            )
            metrics = server.metrics()
            text = metrics.formatted()
            metrics.delete()
            assert "nv_cpu_utilization" in text  # CPU metrics on
            assert "nv_inference_request_summary_us" in text  # the summary_latencies metrics config
            assert len(stub_pids(prefix)) == 1  # the Python backend got our shared-memory prefix
        finally:
            stop_server(started)  # deletes it; no stub and no region of the prefix may be left
    text = log.read_text()
    table = _options_table(text)
    assert table["server_id"] == "every-option"
    assert table["model_repository_path[0]"] == str(repo)
    assert table["model_control_mode"] == "MODE_EXPLICIT"
    assert table["startup_models_0"] == "fast"
    assert (table["strict_model_config"], table["model_config_name"]) == ("0", "alternative")
    assert table["rate_limit"] == "EXEC_COUNT"
    assert table["rate_limit_resource[0]"] == '{"name":"R1", "count":4 "device":-1}'
    assert table["pinned_memory_pool_byte_size"] == "0"
    assert table["cuda_memory_pool_byte_size{0}"] == "12345"
    assert table["min_supported_compute_capability"] == "7.5"
    assert (table["strict_readiness"], table["exit_timeout"]) == ("0", "17")
    backend_cmdline = re.search(r'"cmdline":(\{[^}]*\})', text)
    assert backend_cmdline, "the Python backend's configuration is not in the log"
    cmdline = json.loads(backend_cmdline.group(1))
    assert cmdline["backend-directory"] == str(tmp_path / "backends")
    assert cmdline["model-load-gpu-limit-device-0"] == "0.900000"
    assert cmdline["shm-region-prefix-name"] == prefix
    assert f"loading: {repo}::fast:1" in text  # model namespacing: names carry their repository
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IEV] ", text, re.MULTILINE)  # ISO 8601 records
    assert '"model configuration:' in text  # verbose 1: the Python backend's verbose records
    assert re.search(r"^\S+ E ", text, re.MULTILINE)  # errors on (CUDA is missing here)
    assert not re.search(r"^\S+ W ", text, re.MULTILINE)  # warnings off


@pytest.mark.checks(
    "TRITONSERVER_ServerOptionsSetCacheDirectory",
    "TRITONSERVER_ServerOptionsSetResponseCacheByteSize",
    "TRITONSERVER_ServerOptionsSetCacheConfig",
    "TRITONSERVER_ServerOptionsSetRepoAgentDirectory",
    "TRITONSERVER_ServerOptionsSetExitOnError",
    "TRITONSERVER_ServerOptionsSetModelLoadRetryCount",
)
def test_options_that_show_where_they_are_used(triton_library: Any, tmp_path: Path) -> None:
    """Cache and repository-agent folders are where Triton looks for their libraries; exit-on-error decides
    whether a failing start-up model fails the start; the retry count is how often a failed load is retried."""
    from monai_triton_ops.server.environment import assemble_backend_dir, server_environment

    repo = triton_models.passthrough(tmp_path / "repo", "broken")
    config = repo / "broken" / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "python"', 'backend: "no_such_backend"'))
    triton_models.passthrough(repo, "agent")
    config = repo / "agent" / "config.pbtxt"
    config.write_text(config.read_text() + 'model_repository_agents { agents [ { name: "checksum" } ] }\n')
    backends = assemble_backend_dir(triton_library.install, tmp_path / "backends")

    def options(log: str) -> Any:
        made = b.TRITONSERVER_ServerOptions().set_model_repository_path(repo).set_backend_directory(backends)
        made.set_model_control_mode(b.TRITONSERVER_ModelControlMode.EXPLICIT).set_log_file(tmp_path / log)
        return made.set_log_verbose(0)

    with pytest.MonkeyPatch.context() as mp:
        for key, value in server_environment(triton_library.install).items():
            mp.setenv(key, value)
        for cache in ("response cache size", "cache config"):
            made = options("cache.log").set_cache_directory(tmp_path / "caches")
            if cache == "cache config":
                made.set_cache_config("local", '{"size": "1048576"}')
            else:
                made.set_response_cache_byte_size(1 << 20)
            with pytest.raises(b.InvalidArgumentError, match=f"libtritoncache_local.so.*{tmp_path / 'caches'}"):
                b.TRITONSERVER_Server(made)
            made.delete()
        made = options("start.log").set_startup_model("broken").set_exit_on_error(True)
        with pytest.raises(b.InvalidArgumentError, match="no_such_backend"):
            b.TRITONSERVER_Server(made)
        made.delete()
        made = options("start.log").set_startup_model("broken").set_exit_on_error(False)
        made.set_repo_agent_directory(tmp_path / "agents").set_model_load_retry_count(2)
        server = b.TRITONSERVER_Server(made)  # the start-up model failed: without exit-on-error, it starts
        made.delete()
        try:
            with pytest.raises(b.TritonError):
                server.load_model("agent")
            with pytest.raises(b.TritonError):
                server.load_model("broken")
        finally:
            server.delete()
    log = (tmp_path / "start.log").read_text()
    assert f"libtritonrepoagent_checksum.so' for repo agent 'checksum', searched: {tmp_path / 'agents'}" in log
    explicit = log[log.rindex("loading: broken:1") :]  # the explicit load: tried once, then retried twice
    assert explicit.count("failed to load 'broken' version 1") == 3, explicit


def test_server_creation_errors_are_raised_by_code(triton_library: Any) -> None:
    options = b.TRITONSERVER_ServerOptions()
    options.set_cache_config("local", '{"size": "1048576"}')
    with pytest.raises(b.InvalidArgumentError, match="--model-repository must be specified"):
        b.TRITONSERVER_Server(options)


def test_a_failed_load_is_tried_once_whatever_the_heap_held_before(triton_library: Any) -> None:
    """2.51 leaves the retry count (and peer access) of new options uninitialised: heap garbage made a failed
    load retry millions of times (a hang, and the log grew by 250 MB/s). The heap here is filled with a known
    value first, so the garbage is 5 retries: the binding must set both fields itself."""
    result = run_case(
        """
        import ctypes
        from monai_triton_ops import bindings as b
        from tests import triton_models
        from tests.bindings.harness import case_server

        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]

        def spray():  # freed chunks of every size the options object may take, each word holding 5
            blocks = [libc.malloc(size) for size in range(32, 4096, 16)]
            for block, size in zip(blocks, range(32, 4096, 16)):
                ctypes.memmove(block, (5).to_bytes(4, "little") * (size // 4), size // 4 * 4)
            for block in blocks:
                libc.free(block)

        def build(repo):
            triton_models.passthrough(repo, "broken")
            config = repo / "broken" / "config.pbtxt"
            config.write_text(config.read_text().replace('backend: "python"', 'backend: "no_such_backend"'))

        real_new = b.TRITONSERVER_ServerOptions.__init__
        def sprayed_new(self):
            spray()
            real_new(self)
        b.TRITONSERVER_ServerOptions.__init__ = sprayed_new
        with case_server(build, ()) as started:
            try:
                started.server.load_model("broken")
            except b.TritonError as exc:
                print("error", type(exc).__name__)
            print("attempts", started.log().count("failed to load 'broken' version 1"))
        """,
        timeout_s=120,
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["error"] == "InvalidArgumentError"
    assert lines["attempts"] == "1", result.stdout
