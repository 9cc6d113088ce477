"""The shared Python-backend test models load in the real server and do what their docstrings say."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from monai_triton_ops.server import LocalTritonServer, TritonInstall

from .. import triton_models
from .conftest import stop_and_check

pytestmark = pytest.mark.triton
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def client(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[grpcclient.InferenceServerClient]:
    repo = tmp_path_factory.mktemp("kit") / "repo"
    triton_models.identity(repo, "mixed", dtypes=("TYPE_FP32", "TYPE_INT64", "TYPE_UINT8", "TYPE_BOOL"), dims=(-1, -1))
    triton_models.empty_output(repo)
    triton_models.dynamic_output(repo)
    triton_models.raising(repo)
    server = LocalTritonServer(repo, startup_timeout_s=120.0)
    server.start()
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        yield client
    finally:
        client.close()
        stop_and_check(server)


def _infer(client: grpcclient.InferenceServerClient, model: str, arrays: dict[str, np.ndarray], outputs: list[str]):
    requests = []
    for name, array in arrays.items():
        request = grpcclient.InferInput(name, list(array.shape), _wire(array))
        request.set_data_from_numpy(array)
        requests.append(request)
    wanted = [grpcclient.InferRequestedOutput(n) for n in outputs]
    result = client.infer(model, requests, outputs=wanted, client_timeout=TIMEOUT_S)
    return {n: result.as_numpy(n) for n in outputs}


def _wire(array: np.ndarray) -> str:
    return {"float32": "FP32", "int64": "INT64", "uint8": "UINT8", "bool": "BOOL"}[str(array.dtype)]


def test_identity_round_trips_mixed_dtypes_exactly(client: grpcclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "INPUT__0": rng.standard_normal((3, 5)).astype(np.float32),
        "INPUT__1": rng.integers(-(2**40), 2**40, (2, 7)),
        "INPUT__2": rng.integers(0, 255, (4, 1)).astype(np.uint8),
        "INPUT__3": rng.standard_normal((2, 2)) > 0,
    }
    out = _infer(client, "mixed", arrays, [f"OUTPUT__{i}" for i in range(4)])
    for i, array in enumerate(arrays.values()):
        np.testing.assert_array_equal(out[f"OUTPUT__{i}"], array)
        assert out[f"OUTPUT__{i}"].dtype == array.dtype


def test_empty_output_beside_a_normal_one(client: grpcclient.InferenceServerClient) -> None:
    x = np.arange(5, dtype=np.float32)
    out = _infer(client, "empty_output", {"INPUT__0": x}, ["OUTPUT__0", "EMPTY"])
    np.testing.assert_array_equal(out["OUTPUT__0"], x)
    assert out["EMPTY"].shape == (0, 4)


def test_dynamic_output_size_follows_the_input_value(client: grpcclient.InferenceServerClient) -> None:
    out = _infer(client, "dynamic_output", {"SIZE": np.array([6], dtype=np.int64)}, ["OUTPUT__0"])
    np.testing.assert_array_equal(out["OUTPUT__0"], np.arange(6, dtype=np.float32))


def test_raising_model_reports_its_own_message(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="deliberate model error"):
        _infer(client, "raising", {"INPUT__0": np.zeros(2, np.float32)}, ["OUTPUT__0"])


def test_kit_writes_loadable_configs(tmp_path: Path) -> None:
    from monai_triton_ops.repository.config import read_config

    triton_models.slow(tmp_path, max_queue_size=1)
    triton_models.decoupled_final_only(tmp_path)
    triton_models.crashing(tmp_path)
    triton_models.guard_numpy(tmp_path)
    slow = read_config(tmp_path / "slow" / "config.pbtxt", name="slow")
    assert slow.dynamic_batching.default_queue_policy.max_queue_size == 1
    assert read_config(
        tmp_path / "decoupled_final_only" / "config.pbtxt", name="decoupled_final_only"
    ).model_transaction_policy.decoupled
