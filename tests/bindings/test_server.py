"""``TRITONSERVER_Server`` against the real library: state, models, repositories, metrics, error codes."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monai_triton_ops import bindings as b

from .. import triton_models
from .harness import Started, infer, make_request, submit

pytestmark = pytest.mark.triton
MODELS = ("passthrough", "batched", "decoupled_final_only")


@pytest.fixture(scope="module")
def started(make_server: Callable[..., Started], tmp_path_factory: pytest.TempPathFactory) -> Started:
    repo = tmp_path_factory.mktemp("server") / "repo"
    triton_models.passthrough(repo)
    triton_models.passthrough(repo, "other")
    triton_models.passthrough(repo, "batched").joinpath("batched", "config.pbtxt").write_text(
        (repo / "batched" / "config.pbtxt").read_text().replace("max_batch_size: 0", "max_batch_size: 4")
    )
    triton_models.decoupled_final_only(repo)
    return make_server(repo, models=MODELS)


@pytest.fixture
def server(started: Started) -> Any:
    return started.server


@pytest.mark.checks(
    "TRITONSERVER_ServerIsLive",
    "TRITONSERVER_ServerIsReady",
    "TRITONSERVER_ServerMetadata",
    "TRITONSERVER_ServerModelIsReady",
    "TRITONSERVER_MessageSerializeToJson",
)
def test_server_state_and_metadata(server: Any) -> None:
    assert server.is_live()
    assert server.is_ready()
    metadata = server.metadata().json()
    assert (metadata["name"], metadata["version"]) == ("triton", "2.51.0")
    assert server.model_is_ready("passthrough")
    assert server.model_is_ready("passthrough", 1)
    assert not server.model_is_ready("other")  # in the repository, not loaded (explicit model control)


@pytest.mark.checks(
    "TRITONSERVER_ServerModelMetadata", "TRITONSERVER_ServerModelConfig", "TRITONSERVER_ServerModelIndex"
)
def test_model_metadata_config_and_index(server: Any) -> None:
    model = server.model_metadata("passthrough").json()
    assert [t["name"] for t in model["inputs"]] == ["INPUT__0"]
    assert model["outputs"][0]["datatype"] == "FP32"
    config = server.model_config("passthrough", 1, 1).json()
    assert (config["name"], config["backend"]) == ("passthrough", "python")
    everything = {m["name"]: m for m in server.model_index().json()}
    assert {"passthrough", "other", "batched"} <= everything.keys()
    ready = {m["name"] for m in server.model_index(b.TRITONSERVER_ModelIndexFlag.READY).json()}
    assert ready == set(MODELS)


@pytest.mark.checks("TRITONSERVER_ServerModelBatchProperties", "TRITONSERVER_ServerModelTransactionProperties")
def test_batch_and_transaction_properties(server: Any) -> None:
    assert server.model_batch_properties("batched") == (b.TRITONSERVER_ModelBatchFlag.FIRST_DIM, 0)
    assert server.model_batch_properties("passthrough")[0] is b.TRITONSERVER_ModelBatchFlag.UNKNOWN
    assert server.model_transaction_properties("passthrough")[0] is b.TRITONSERVER_ModelTxnPropertyFlag.ONE_TO_ONE
    flags, _ = server.model_transaction_properties("decoupled_final_only")
    assert flags is b.TRITONSERVER_ModelTxnPropertyFlag.DECOUPLED


@pytest.mark.checks("TRITONSERVER_ServerModelStatistics")
def test_statistics_count_requests(server: Any) -> None:
    def successes() -> int:
        stats = server.model_statistics("passthrough", -1).json()["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"])

    before = successes()
    for _ in range(3):
        infer(server, "passthrough", {"INPUT__0": np.ones(4, np.float32)})
    assert successes() - before == 3
    all_models = {s["name"] for s in server.model_statistics().json()["model_stats"]}
    assert "passthrough" in all_models


def _metric(text: str, name: str, model: str) -> float:
    pattern = rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$'
    values = [float(v) for v in re.findall(pattern, text, flags=re.MULTILINE)]
    assert values, f"{name} for {model} not in the metrics"
    return sum(values)


@pytest.mark.checks("TRITONSERVER_ServerMetrics", "TRITONSERVER_MetricsFormatted")
def test_metrics_are_prometheus_text_and_counters_rise(server: Any) -> None:
    def read() -> str:
        metrics = server.metrics()
        try:
            return metrics.formatted(b.TRITONSERVER_MetricFormat.PROMETHEUS)
        finally:
            metrics.delete()

    before = read()
    assert "# TYPE nv_inference_request_success counter" in before
    for _ in range(5):
        infer(server, "passthrough", {"INPUT__0": np.ones(2, np.float32)})
    after = read()
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        assert _metric(after, name, "passthrough") - _metric(before, name, "passthrough") == 5, name
    assert _metric(after, "nv_inference_request_duration_us", "passthrough") > _metric(
        before, "nv_inference_request_duration_us", "passthrough"
    )


@pytest.mark.checks("TRITONSERVER_MetricsDelete")
def test_deleting_metrics_frees_their_text(server: Any) -> None:
    """A formatted ``TRITONSERVER_Metrics`` holds its Prometheus text: 2,000 undeleted hold 6 MiB (measured)."""
    from .test_library import _grows

    def format_and_delete() -> None:
        metrics = server.metrics()
        metrics.formatted()
        metrics.delete()

    assert _grows(format_and_delete, 2_000) < 3 << 20


@pytest.mark.checks(
    "TRITONSERVER_ServerLoadModelWithParameters",
    "TRITONSERVER_ParameterNew",
    "TRITONSERVER_ServerLoadModel",
    "TRITONSERVER_ServerUnloadModel",
    "TRITONSERVER_ServerUnloadModelAndDependents",
)
def test_load_with_parameters_and_unload(server: Any) -> None:
    config = server.model_config("passthrough").json()
    config["name"] = "other"
    config["parameters"] = {"note": {"string_value": "loaded with a config parameter"}}
    server.load_model_with_parameters("other", [b.TRITONSERVER_Parameter("config", json.dumps(config))])
    assert server.model_is_ready("other")
    assert server.model_config("other").json()["parameters"]["note"]["string_value"].startswith("loaded")
    np.testing.assert_array_equal(
        infer(server, "other", {"INPUT__0": np.arange(3, dtype=np.float32)})["OUTPUT__0"], [0, 1, 2]
    )
    server.unload_model("other")
    _wait_unloaded(server, "other")
    server.load_model("other")
    server.unload_model_and_dependents("other")
    _wait_unloaded(server, "other")


@pytest.mark.checks("TRITONSERVER_ParameterBytesNew")
def test_a_model_loaded_from_files_given_as_bytes(server: Any) -> None:
    """``file:<path>`` parameters carry the model's files as bytes: the model exists nowhere else."""
    config = server.model_config("passthrough").json()
    config["name"] = "from_bytes"
    source = triton_models.passthrough_source().encode()
    parameters = [
        b.TRITONSERVER_Parameter("config", json.dumps(config)),
        b.TRITONSERVER_Parameter("file:1/model.py", source),
    ]
    server.load_model_with_parameters("from_bytes", parameters)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(infer(server, "from_bytes", {"INPUT__0": x})["OUTPUT__0"], x)
    server.unload_model("from_bytes")
    _wait_unloaded(server, "from_bytes")


def _wait_unloaded(server: Any, model: str) -> None:
    """Unload returns before the model is gone: poll the index (bounded)."""
    import time

    deadline = time.monotonic() + 30
    while server.model_is_ready(model):
        assert time.monotonic() < deadline, f"{model} still ready after unload"
        time.sleep(0.05)


@pytest.mark.checks("TRITONSERVER_ServerRegisterModelRepository", "TRITONSERVER_ServerUnregisterModelRepository")
def test_register_a_second_repository_with_a_name_mapping(server: Any, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    triton_models.passthrough(extra, "folder_name")
    (extra / "folder_name" / "config.pbtxt").write_text(
        (extra / "folder_name" / "config.pbtxt").read_text().replace('name: "folder_name"', 'name: "mapped"')
    )
    server.register_model_repository(extra, [b.TRITONSERVER_Parameter("folder_name", "mapped")])
    try:
        server.load_model("mapped")
        out = infer(server, "mapped", {"INPUT__0": np.full(2, 7, np.float32)})
        np.testing.assert_array_equal(out["OUTPUT__0"], [7, 7])
        server.unload_model("mapped")
        _wait_unloaded(server, "mapped")
    finally:
        server.unregister_model_repository(extra)
    with pytest.raises(b.InvalidArgumentError, match="repository not found"):
        server.unregister_model_repository(extra)
    shutil.rmtree(extra)


# -- error codes map to classes -------------------------------------------------------------------------
@pytest.mark.checks("TRITONSERVER_InferenceRequestNew")
def test_unknown_model_is_not_found(server: Any) -> None:
    with pytest.raises(b.NotFoundError, match="nope"):
        server.model_metadata("nope")
    assert not server.model_is_ready("nope")
    with pytest.raises(b.NotFoundError, match="unknown model: 'nope'"):
        b.TRITONSERVER_InferenceRequest(server, "nope")


@pytest.mark.checks("TRITONSERVER_ServerInferAsync")
def test_wrong_dtype_is_invalid_argument(server: Any) -> None:
    before = b.live_handles()
    request = make_request(server, "passthrough", {"INPUT__0": np.ones(3, np.int64)})
    request.set_response_callback(b.ArrayAllocator(), None, lambda *_: None)
    with pytest.raises(b.InvalidArgumentError, match="INPUT__0"):
        server.infer_async(request)
    assert b.live_handles() == before
    assert request.owner_state is b.State.OWNED  # the caller keeps a request whose submission failed
    request.delete()


def test_a_model_that_fails_to_load_reports_tritons_message(server: Any, started: Started) -> None:
    with pytest.raises(b.TritonError, match="not_there"):
        server.load_model("not_there")


@pytest.mark.checks("TRITONSERVER_ServerPollModelRepository")
def test_polling_in_explicit_mode_is_refused(server: Any) -> None:
    with pytest.raises(b.UnavailableError, match="polling"):
        server.poll_model_repository()


@pytest.mark.checks("TRITONSERVER_InferenceRequestSetResponseCallback")
def test_decoupled_final_only_sends_a_null_final_response(server: Any) -> None:
    future, outcome = submit(server, "decoupled_final_only", {"INPUT__0": np.ones(2, np.float32)})
    future.result(30)
    assert outcome.responses == 0
    assert outcome.flags == [int(b.TRITONSERVER_ResponseCompleteFlag.FINAL)]


# -- the last test of the module: it stops the module's server -----------------------------------------
@pytest.mark.checks(
    "TRITONSERVER_ServerSetExitTimeout",
    "TRITONSERVER_ServerStop",
    "TRITONSERVER_LogIsEnabled",
    "TRITONSERVER_LogMessage",
)
def test_log_functions_and_the_exit_timeout_act_on_the_servers_log(started: Started) -> None:
    """Triton's logger is process-wide, set up by the last server created (this module's: info on, verbose 0;
    a second server alive beside it is what this project never does); the server's stop counts down the exit
    timeout it was last given (``Timeout N: ...`` each second)."""
    server = started.server
    assert b.TRITONSERVER_LogIsEnabled(b.TRITONSERVER_LogLevel.ERROR)
    assert b.TRITONSERVER_LogIsEnabled(b.TRITONSERVER_LogLevel.INFO)
    assert not b.TRITONSERVER_LogIsEnabled(b.TRITONSERVER_LogLevel.VERBOSE)
    b.TRITONSERVER_LogMessage(b.TRITONSERVER_LogLevel.ERROR, "test_server.py", 42, "binding-error-marker")
    b.TRITONSERVER_LogMessage(b.TRITONSERVER_LogLevel.VERBOSE, "test_server.py", 43, "binding-verbose-marker")
    server.set_exit_timeout(7)
    server.stop()
    log = started.log()
    # an error record, in whichever format the process's logger has (ISO 8601 once a server asked for it)
    assert re.search(r"^(\S+ )?E.*test_server\.py:42\] .*binding-error-marker", log, re.MULTILINE), log[-2000:]
    assert "binding-verbose-marker" not in log  # verbose is off
    assert re.search(r"Timeout 7: Found \d+ model versions that have in-flight inferences", log), log[-3000:]
    assert "Timeout 10:" not in log  # the options' value was replaced
    with pytest.raises(b.UnavailableError, match="exiting"):
        server.is_ready()
