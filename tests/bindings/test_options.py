"""``TRITONSERVER_ServerOptions``: every setter, on a server that then starts, serves and stops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monai_triton_ops import bindings as b

from .. import triton_models
from .conftest import run_case
from .harness import Started, infer, stop_server

pytestmark = pytest.mark.triton


def test_a_server_built_with_every_option(triton_library: Any, tmp_path: Path) -> None:
    from monai_triton_ops.server.environment import assemble_backend_dir, server_environment, shm_prefix

    repo = triton_models.passthrough(tmp_path / "repo", "fast")
    environ = server_environment(triton_library.install)
    options = b.TRITONSERVER_ServerOptions()
    options.set_server_id("every-option").set_model_repository_path(repo)
    options.set_backend_directory(assemble_backend_dir(triton_library.install, tmp_path / "backends"))
    options.set_repo_agent_directory(tmp_path / "repoagents").set_cache_directory(tmp_path / "caches")
    options.set_model_control_mode(b.TRITONSERVER_ModelControlMode.EXPLICIT).set_startup_model("fast")
    options.set_strict_model_config(False).set_model_config_name("").set_model_namespacing(False)
    options.set_rate_limiter_mode(b.TRITONSERVER_RateLimitMode.OFF).add_rate_limiter_resource("R1", 4, -1)
    options.set_pinned_memory_pool_byte_size(0).set_cuda_memory_pool_byte_size(0, 0)
    options.set_cuda_virtual_address_size(0, 0).set_response_cache_byte_size(0)
    options.set_min_supported_compute_capability(6.0).set_enable_peer_access(False)
    options.set_model_load_device_limit(b.TRITONSERVER_InstanceGroupKind.GPU, 0, 0.9)
    options.set_exit_on_error(True).set_strict_readiness(True).set_exit_timeout(10)
    options.set_buffer_manager_thread_count(0).set_model_load_thread_count(2).set_model_load_retry_count(0)
    log = tmp_path / "triton.log"
    options.set_log_file(log).set_log_info(True).set_log_warn(True).set_log_error(True).set_log_verbose(0)
    options.set_log_format(b.TRITONSERVER_LogFormat.ISO8601)
    options.set_metrics(True).set_gpu_metrics(False).set_cpu_metrics(True).set_metrics_interval(1000)
    options.set_metrics_config("summary_latencies", "", "false")
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
            np.testing.assert_array_equal(
                infer(server, "fast", {"INPUT__0": np.ones(2, np.float32)})["OUTPUT__0"], [1, 1]
            )
            server.stop()
            with pytest.raises(b.UnavailableError, match="exiting"):
                server.is_ready()
        finally:
            stop_server(started)
    assert '"every-option"' in log.read_text() or "every-option" in log.read_text()


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
