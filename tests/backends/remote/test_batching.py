"""The server's side of concurrency and shared memory: dynamic batching merges windows in flight, and a server
that refuses client shared memory is handled (auto falls back, system fails clearly)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.inferers import sliding_window_inference

from monai_triton_ops import create_backend
from monai_triton_ops.backends.base import BaseBackend
from monai_triton_ops.errors import ConfigError
from monai_triton_ops.pipeline import Predictor
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.config import DynamicBatching
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ... import triton_models
from ...server.conftest import settled
from .conftest import Open, serve, url

pytestmark = pytest.mark.triton
SAMPLE_MODEL = Path(__file__).resolve().parents[3] / "model_repository" / "brain_tissue_seg" / "1" / "model.pt"
#: Only these APIs need the header; inference and everything else stay open.
RESTRICTED = [
    "--grpc-restricted-protocol=shared-memory:shm-token=secret",
    "--http-restricted-api=shared-memory:shm-token=secret",
]


@pytest.fixture(scope="module")
def batching_server(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTritonServer]:
    """The sample model served with dynamic batching (up to 4 windows per execution)."""
    repo = tmp_path_factory.mktemp("batching") / "repo"
    batching = DynamicBatching(preferred_batch_sizes=(4,), max_queue_delay_us=50_000)
    build_repository(SAMPLE_MODEL, repo, "seg", max_batch_size=4, dynamic_batching=batching)
    yield from serve(repo, tmp_path_factory.mktemp("server_tmp"))


@pytest.fixture(scope="module")
def restricted_server(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTritonServer]:
    repo = tmp_path_factory.mktemp("restricted") / "repo"
    triton_models.identity(repo, "ident", dims=(-1,))
    yield from serve(repo, tmp_path_factory.mktemp("server_tmp"), extra_args=RESTRICTED)


def _settled_counts(backend: BaseBackend) -> tuple[int, int]:
    """``(inferences, executions)`` once the server's statistics have settled (they lag the responses)."""

    def read() -> tuple[int, int]:
        stats = backend.statistics()["model_stats"][0]  # type: ignore[attr-defined]
        return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))

    return settled(read)


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_windows_in_flight_are_merged_by_the_dynamic_batcher(
    batching_server: LocalTritonServer, open_backend: Open, scheme: str
) -> None:
    backend = open_backend(f"{url(batching_server, scheme)}?max_in_flight=4", "seg")
    assert backend.signature.max_batch_size == 4
    image = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 1, 64, 64, 64)).astype(np.float32))
    before = _settled_counts(backend)
    predictor = Predictor(backend, request_batch_size=1, max_in_flight=4)  # one window per request, 4 in flight
    out = sliding_window_inference(image, roi_size=(32, 32, 32), sw_batch_size=8, predictor=predictor, overlap=0.5)
    assert out.shape == (1, 3, 64, 64, 64)
    after = _settled_counts(backend)
    windows, executions = after[0] - before[0], after[1] - before[1]
    assert windows == 27  # 3 x 3 x 3 windows, one request each
    assert executions < windows  # the server ran several requests as one batch


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_server_refusing_client_shared_memory(
    restricted_server: LocalTritonServer, open_backend: Open, scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    base = url(restricted_server, scheme)
    auto = open_backend(f"{base}?shared_memory=auto", "ident")
    assert auto.shared_memory == "none"
    assert "refuses client shared memory" in caplog.text
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(auto.infer({"INPUT__0": x})["OUTPUT__0"], x)
    with pytest.raises(ConfigError, match=r"shared_memory=system, but .* cannot use this host's system shared memory"):
        create_backend(f"{base}?shared_memory=system", "ident").open()
