"""The remote backend against a real local tritonserver: tensors exact over every transport, and clear errors.

One server for the module, with the shared model kit: identity over mixed dtypes, BYTES, an empty
output, a value-dependent output size, and the numpy-2 guard.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from monai_triton_ops import create_backend
from monai_triton_ops.backends.remote.shm import region as shm
from monai_triton_ops.backends.remote.shm.owner import owner
from monai_triton_ops.errors import (
    BackendSpecError,
    ConfigError,
    InferenceError,
    InputValidationError,
    ModelNotFoundError,
    ServerUnavailableError,
)
from monai_triton_ops.server import LocalTritonServer, TritonInstall
from monai_triton_ops.server.ports import pick_free_ports

from ... import triton_models
from .conftest import MODE_IDS, MODES, Open, executions, serve, url

pytestmark = pytest.mark.triton
MIXED = ("TYPE_FP32", "TYPE_INT64", "TYPE_UINT8", "TYPE_BOOL")


@pytest.fixture(scope="module")
def server(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    repo = tmp_path_factory.mktemp("remote") / "repo"
    triton_models.identity(repo, "mixed", dtypes=MIXED, dims=(-1, -1))
    triton_models.identity(repo, "volume", dims=(-1, -1, -1, -1, -1))
    triton_models.bytes_count(repo)
    triton_models.empty_output(repo)
    triton_models.dynamic_output(repo)
    triton_models.guard_numpy(repo)
    # The BYTES test's stub dies (pitfall B1), and a dead stub makes the server wait its whole exit timeout at stop:
    # 30 s of the default against 5 s here.
    yield from serve(repo, tmp_path_factory.mktemp("server_tmp"), stop_timeout_s=5.0)


def _mixed(seed: int = 0, batch: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "INPUT__0": rng.standard_normal((batch, 5)).astype(np.float32),
        "INPUT__1": rng.integers(-(2**40), 2**40, (batch, 7)),
        "INPUT__2": rng.integers(0, 255, (batch, 3)).astype(np.uint8),
        "INPUT__3": rng.standard_normal((batch, 2)) > 0,
    }


def _spec(server: LocalTritonServer, scheme: str, memory: str) -> str:
    return f"{url(server, scheme)}?shared_memory={memory}"


@pytest.mark.parametrize(("scheme", "memory"), MODES, ids=MODE_IDS)
def test_mixed_dtypes_round_trip_exactly_numpy_and_torch(
    server: LocalTritonServer, open_backend: Open, scheme: str, memory: str
) -> None:
    backend = open_backend(_spec(server, scheme, memory), "mixed")
    assert backend.shared_memory == memory
    how = "system shared memory" if memory == "system" else "binary tensors"  # the run line: server and way
    over = {"grpc": "gRPC", "http": "HTTP"}[scheme]
    assert re.fullmatch(rf"{scheme} \(triton 2\.\d+\.\d+ at 127\.0\.0\.1:\d+ over {over}, {how}\)", backend.describe())
    for seed in range(3):  # the first request learns output sizes; the next ones put outputs in the slot too
        arrays = _mixed(seed)
        out = backend.infer(arrays)
        for i, array in enumerate(arrays.values()):
            assert out[f"OUTPUT__{i}"].dtype == array.dtype
            np.testing.assert_array_equal(out[f"OUTPUT__{i}"], array)
    tensors = backend.infer({k: torch.from_numpy(v) for k, v in _mixed(7).items()}, outputs=["OUTPUT__1"])
    assert list(tensors) == ["OUTPUT__1"]
    assert isinstance(tensors["OUTPUT__1"], torch.Tensor)
    torch.testing.assert_close(tensors["OUTPUT__1"], torch.from_numpy(_mixed(7)["INPUT__1"]))


@pytest.mark.parametrize(("scheme", "memory"), MODES, ids=MODE_IDS)
def test_returned_arrays_are_the_callers_to_keep(
    server: LocalTritonServer, open_backend: Open, scheme: str, memory: str
) -> None:
    backend = open_backend(_spec(server, scheme, memory), "volume")
    first_in = np.full((1, 1, 8, 8, 8), 1.0, np.float32)
    first = backend(first_in)
    for value in (2.0, 3.0):
        backend(np.full((1, 1, 8, 8, 8), value, np.float32))
    np.testing.assert_array_equal(first, first_in)  # not a view into a slot the next requests reused
    first += 1  # and writable
    torch_out = backend(torch.zeros((1, 1, 8, 8, 8)))
    torch_out.add_(1)  # MONAI's sliding window blends in place


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_bytes_input_reaches_the_model_and_a_numpy2_stub_fails_clearly(
    server: LocalTritonServer, open_backend: Open, scheme: str
) -> None:
    """BYTES go in the request body (never shared memory). Triton checks the serialized elements against the
    shape before the model runs, so a request that reaches the stub was serialized right. The 2.51 wheel's
    stub cannot decode BYTES under numpy 2 (pitfall B1) and dies: the caller gets an error naming the model
    and the cause, not a hang; with numpy 1 in the stub the model answers the element count."""
    backend = open_backend(_spec(server, scheme, "system"), "bytes_count")
    assert backend.signature.input("TEXT").dtype == "BYTES"
    with pytest.raises(InputValidationError, match=r"input 'TEXT': expected dtype BYTES, got FP32"):
        backend.infer({"TEXT": np.zeros(3, np.float32)})
    text = np.array([b"", b"a\x00\x00", "é".encode(), b"x" * 70000], dtype=np.object_)
    if int(np.__version__.split(".")[0]) < 2:  # the stub imports this environment's numpy
        assert backend.infer({"TEXT": text})["COUNT"].tolist() == [4]
        return
    with pytest.raises(
        ServerUnavailableError, match=r"model 'bytes_count'.*Stub process 'bytes_count_0_0' is not healthy"
    ):
        backend.infer({"TEXT": text})


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_empty_output_beside_a_normal_one(server: LocalTritonServer, open_backend: Open, scheme: str) -> None:
    backend = open_backend(_spec(server, scheme, "system"), "empty_output")
    for _ in range(2):
        out = backend.infer({"INPUT__0": np.arange(5, dtype=np.float32)})
        np.testing.assert_array_equal(out["OUTPUT__0"], np.arange(5, dtype=np.float32))
        assert out["EMPTY"].shape == (0, 4)
        assert out["EMPTY"].dtype == np.float32


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_an_output_that_outgrows_its_slot_is_fetched_again_once(
    server: LocalTritonServer, open_backend: Open, scheme: str
) -> None:
    backend = open_backend(_spec(server, scheme, "system"), "dynamic_output")
    before = _executions(backend)
    for size in (6, 6, 6 * 4096, 8):  # the third needs far more than the place learned from the first two
        out = backend.infer({"SIZE": np.array([size], dtype=np.int64)})
        np.testing.assert_array_equal(out["OUTPUT__0"], np.arange(size, dtype=np.float32))
    assert _executions(backend) - before == 5  # four requests, one of them sent twice


def _executions(backend) -> int:
    return executions(backend)


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_short_output_from_a_numpy2_model_is_an_error_not_an_empty_array(
    server: LocalTritonServer, open_backend: Open, scheme: str
) -> None:
    backend = open_backend(_spec(server, scheme, "none"), "guard_numpy")
    with pytest.raises(InferenceError, match=r"output 'OUTPUT__0'"):
        backend.infer({"INPUT__0": np.arange(5, dtype=np.float32)})


def test_signature_and_metadata_come_from_the_server(server: LocalTritonServer, open_backend: Open) -> None:
    backend = open_backend(server.grpc_url, "mixed")
    sig = backend.signature
    assert sig.input_names == ("INPUT__0", "INPUT__1", "INPUT__2", "INPUT__3")
    assert [s.dtype for s in sig.outputs] == ["FP32", "INT64", "UINT8", "BOOL"]
    assert sig.version == 1


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_unknown_model_or_version_lists_what_the_server_has(server: LocalTritonServer, scheme: str) -> None:
    with pytest.raises(ModelNotFoundError, match=r"'nope' is not on .*the server has: .*mixed version 1 \(READY\)"):
        create_backend(url(server, scheme), "nope", ready_timeout_s=10).open()
    with pytest.raises(ModelNotFoundError, match=r"'mixed' has no version 7 .* it has: mixed version 1"):
        create_backend(url(server, scheme), "mixed", version=7, ready_timeout_s=10).open()


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_unreachable_server_fails_within_the_ready_deadline(scheme: str) -> None:
    (port,) = pick_free_ports(1)
    backend = create_backend(f"{scheme}://127.0.0.1:{port}", "mixed", ready_timeout_s=1.0)
    with pytest.raises(ServerUnavailableError, match=r"not ready within 1 s \(ready_timeout_s\)"):
        backend.open()


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("grpc://", BackendSpecError, r"expected grpc://HOST:PORT"),
        ("grpc://host", BackendSpecError, r"expected grpc://HOST:PORT"),
        ("http://host:notaport", BackendSpecError, r"invalid port"),
        ("grpc://127.0.0.1:1?shared_memory=sometimes", ConfigError, r"shared_memory=.*'auto' \| 'system'"),
        ("grpc://127.0.0.1:1?timeout_s=none", ConfigError, r"timeout_s must be a number"),
        ("grpc://127.0.0.1:1?bogus=1", ConfigError, r"no option\(s\) \['bogus'\]; accepted: .*ready_timeout_s"),
    ],
)
def test_malformed_specs_fail_before_any_connection(spec: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        create_backend(spec, "mixed")


def test_a_local_config_that_differs_from_the_servers_is_an_error(
    server: LocalTritonServer, tmp_path: Path, open_backend: Open
) -> None:
    triton_models.identity(tmp_path, "mixed", dtypes=MIXED[:2], dims=(-1, -1))
    with pytest.raises(ConfigError, match=r"does not match what .* serves: inputs local"):
        create_backend(server.grpc_url, "mixed", model_repository=tmp_path).open()
    triton_models.identity(tmp_path, "volume", dims=(-1, -1, -1, -1, -1))
    open_backend(server.grpc_url, "volume", model_repository=tmp_path)  # the same config: fine


def test_a_large_volume_round_trips_over_grpc_with_compression_and_keepalive(
    server: LocalTritonServer, open_backend: Open
) -> None:
    backend = open_backend(f"{server.grpc_url}?shared_memory=none&compression=gzip&keepalive_s=30", "volume")
    x = np.random.default_rng(0).standard_normal((1, 1, 160, 160, 160)).astype(np.float32)  # 16 MB > gRPC's 4 MB
    np.testing.assert_array_equal(backend(x), x)


def test_regions_are_registered_at_offset_zero_and_tensors_packed_in_one(
    server: LocalTritonServer, open_backend: Open
) -> None:
    backend = open_backend(f"{server.grpc_url}?shared_memory=system", "mixed")
    for seed in range(2):
        arrays = _mixed(seed, batch=3)
        out = backend.infer(arrays)
        for i, array in enumerate(arrays.values()):
            np.testing.assert_array_equal(out[f"OUTPUT__{i}"], array)
    ours = backend.shared_memory_regions()
    assert len(ours) == 1  # inputs and outputs of one request share one region, at per-tensor offsets
    assert set(ours) <= set(owner.names())


def test_a_full_dev_shm_is_seen_before_a_region_is_made(
    server: LocalTritonServer, open_backend: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tmpfs accepts ftruncate and mmap of more than it has and SIGBUSes on the first write (pitfall B4)."""
    import os

    full = os.statvfs_result((4096, 4096, 1, 1, 0, 1, 1, 1, 0, 255))  # no free block
    auto = open_backend(f"{server.grpc_url}?shared_memory=auto", "volume")  # its first slot exists already
    monkeypatch.setattr(shm.os, "statvfs", lambda path: full)
    x = np.ones((1, 1, 32, 32, 32), np.float32)  # needs a bigger slot than the first one
    np.testing.assert_array_equal(auto(x), x)  # auto: this request goes in the body
    with pytest.raises(ConfigError, match=r"shared_memory=system, but .* too little for a"):
        create_backend(f"{server.grpc_url}?shared_memory=system", "volume").open()


def test_a_grpc_body_over_the_cap_is_refused_before_it_is_built(
    server: LocalTritonServer, open_backend: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    from monai_triton_ops.client.transports import grpc as grpc_transport

    monkeypatch.setattr(grpc_transport, "MAX_MESSAGE_BYTES", 1 << 20)  # instead of sending a real 1 GB
    backend = open_backend(f"{server.grpc_url}?shared_memory=none", "volume")
    with pytest.raises(InferenceError, match=r"message too large .* use shared_memory=system on this host"):
        backend(np.zeros((1, 1, 80, 80, 80), np.float32))  # 2 MB


def test_a_result_that_cannot_be_read_fails_its_future_never_hangs(
    server: LocalTritonServer, open_backend: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mock, for a failure that cannot be caused for real: conversion raising inside gRPC's callback thread."""
    from monai_triton_ops.client.transports import grpc as grpc_transport

    backend = open_backend(f"{server.grpc_url}?shared_memory=none", "volume")

    def broken(self: object, name: str) -> str:
        raise RuntimeError("deliberately broken result")

    monkeypatch.setattr(grpc_transport._GrpcResult, "datatype", broken)
    future = backend.submit({"INPUT__0": np.zeros((1, 1, 4, 4, 4), np.float32)}, timeout_s=30)
    with pytest.raises(InferenceError, match="deliberately broken result"):
        future.result(timeout=60)
