"""Every generated python-flavour model, served by the real tritonserver, answers exactly as the file does.

One server for the module: its repository holds every case of ``CASES`` built by ``build_repository``,
plus ``stacked`` (dynamic batching) to run the runner's batching path. Every request has a 30 s deadline.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from monai_triton_ops.errors import ServerNotFoundError
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.config import DynamicBatching
from monai_triton_ops.signature import dtype_of

from .conftest import CASES
from .test_builder import example_inputs, run_module

pytestmark = pytest.mark.triton

TIMEOUT_S = 30.0
#: The batcher waits for 4 items (or 5 s): 4 concurrent batch-1 requests run as one execution.
STACKED = DynamicBatching(preferred_batch_sizes=(4,), max_queue_delay_us=5_000_000)


@pytest.fixture(scope="module")
def served(
    model_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[grpcclient.InferenceServerClient]:
    """A running server over a repository of every case; stopped (and checked gone) even when tests fail."""
    from monai_triton_ops.server import LocalTritonServer, find_tritonserver

    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    repo = tmp_path_factory.mktemp("served") / "repo"
    for name, case in CASES.items():
        build_repository(model_files[name], repo, name, **case.build)
    build_repository(model_files["batched"], repo, "stacked", **CASES["batched"].build, dynamic_batching=STACKED)
    server = LocalTritonServer(repo, startup_timeout_s=180.0)
    with server:
        client = grpcclient.InferenceServerClient(server.grpc_address)
        try:
            yield client
        finally:
            client.close()
    assert server.workdir is None
    assert server.pid is None or not _alive(server.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def infer(client: grpcclient.InferenceServerClient, model: str, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    """One gRPC request with every input of ``model``, in config order; returns every output."""
    config = client.get_model_config(model, client_timeout=TIMEOUT_S).config
    inputs = []
    for spec, array in zip(config.input, arrays, strict=True):
        tensor = grpcclient.InferInput(spec.name, list(array.shape), dtype_of(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer(model, inputs, client_timeout=TIMEOUT_S)
    return {spec.name: result.as_numpy(spec.name) for spec in config.output}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_generated_model_answers_exactly_like_the_torchscript_file(
    served: grpcclient.InferenceServerClient, model_files: dict[str, Path], case: str
) -> None:
    arrays = example_inputs(case)
    outputs = infer(served, case, arrays)
    expected = run_module(model_files[case], arrays)
    assert len(outputs) == len(expected)
    for (name, got), want in zip(outputs.items(), expected, strict=True):
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        if want.dtype.kind == "f":
            assert float(np.max(np.abs(got - want))) == 0.0, name
        assert np.array_equal(got, want), name


def test_the_two_input_model_keeps_names_and_dtypes(served: grpcclient.InferenceServerClient) -> None:
    config = served.get_model_config("two_in_two_out", client_timeout=TIMEOUT_S).config
    assert [(t.name, t.data_type) for t in config.input] == [("image", 11), ("offset", 9)]  # TYPE_FP32, TYPE_INT64
    outputs = infer(served, "two_in_two_out", example_inputs("two_in_two_out"))
    assert [(n, a.dtype) for n, a in outputs.items()] == [("OUTPUT__0", np.float32), ("OUTPUT__1", np.bool_)]


def test_the_dict_model_answers_by_key(served: grpcclient.InferenceServerClient) -> None:
    outputs = infer(served, "dict_output", example_inputs("dict_output"))
    assert list(outputs) == ["probs", "labels"]
    assert outputs["labels"].dtype == np.uint8
    np.testing.assert_allclose(outputs["probs"].sum(axis=1), 1.0, rtol=1e-5)


def test_the_monai_metadata_reaches_a_remote_client(served: grpcclient.InferenceServerClient) -> None:
    config = served.get_model_config("unet_meta", client_timeout=TIMEOUT_S).config
    assert '"16*n"' in config.parameters["monai_metadata"].string_value


def test_a_model_failure_comes_back_as_that_requests_error(served: grpcclient.InferenceServerClient) -> None:
    odd = np.ones((1, 2, 5), np.float32)  # the model refuses odd widths
    with pytest.raises(InferenceServerException, match=r"model 'batched': builtins.ValueError: width must be even$"):
        infer(served, "batched", [odd])
    assert np.array_equal(
        infer(served, "batched", [np.ones((1, 2, 4), np.float32)])["OUTPUT__0"], np.full((1, 2, 4), 4.0)
    )


def test_batched_requests_run_as_one_and_each_gets_its_own_rows(served: grpcclient.InferenceServerClient) -> None:
    arrays = [np.full((1, 2, 6), float(i), np.float32) for i in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda a: infer(served, "stacked", [a])["OUTPUT__0"], arrays))
    for array, result in zip(arrays, results, strict=True):
        assert np.array_equal(result, array * 3.0 + 1.0)
    stats = served.get_inference_statistics("stacked", client_timeout=TIMEOUT_S).model_stats[0]
    assert (stats.inference_count, stats.execution_count) == (4, 1)
