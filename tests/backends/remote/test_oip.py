"""The remote backend against an Open Inference Protocol server that is not Triton: a real MLServer on loopback.

MLServer speaks the protocol over gRPC and HTTP/JSON and has none of Triton's extensions (model
configuration, binary HTTP tensors, shared memory, statistics). The backend must open on it (the
signature from the model metadata, what that lacks from an option or a local ``config.pbtxt``), infer
exactly over both transports, and say clearly what such a server cannot do. One MLServer for the module
(``mlserver.py``: its own cached virtualenv; the first run makes it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from monai_triton_ops.errors import ConfigError, ModelNotFoundError
from monai_triton_ops.repository.config import METADATA_PARAMETER

from .conftest import Open
from .mlserver import MLServer, running

pytestmark = pytest.mark.slow
SCHEMES = ["grpc", "http"]
MONAI_META = '{"network_data_format": {"inputs": {"image": {"num_channels": 1}}}}'


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServer]:
    with running(tmp_path_factory.mktemp("mlserver")) as server:
        yield server


def _config(repo: Path, model: str, *, dtype: str = "TYPE_FP32", max_batch_size: int = 0, dims: str = "") -> Path:
    """A client-side ``<repo>/<model>/config.pbtxt`` like an App SDK app carries (the MAP's model folder)."""
    dims = dims or ("1, -1, -1, -1" if max_batch_size else "-1, 1, -1, -1, -1")
    (repo / model).mkdir(parents=True, exist_ok=True)
    (repo / model / "config.pbtxt").write_text(
        f'name: "{model}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "INPUT__0" data_type: {dtype} dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUTPUT__0" data_type: {dtype} dims: [ {dims} ] }} ]\n'
        f'parameters {{ key: "{METADATA_PARAMETER}" value {{ string_value: {MONAI_META!r} }} }}\n'
    )
    return repo


def _volume(batch: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 1, 8, 6, 4)).astype(np.float32)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_opens_on_the_model_metadata_and_infers_exactly(
    mlserver: MLServer, open_backend: Open, scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="monai_triton_ops"):
        backend = open_backend(mlserver.url(scheme), "seg")  # loopback, shared_memory=auto
    signature = backend.signature
    assert [(s.name, s.dtype, s.shape) for s in signature.inputs] == [("INPUT__0", "FP32", (-1, 1, -1, -1, -1))]
    assert [(s.name, s.dtype, s.shape) for s in signature.outputs] == [("OUTPUT__0", "FP32", (-1, 1, -1, -1, -1))]
    assert (signature.max_batch_size, signature.batch_axis, signature.metadata) == (0, 0, {})
    assert backend.shared_memory == "none"  # MLServer has no shared memory: not even tried, no warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "signature from its model metadata" in caplog.text
    how = "binary" if scheme == "grpc" else "JSON"  # MLServer lists no binary tensor extension, and refuses them
    host, over = mlserver.url(scheme).split("://")[1], {"grpc": "gRPC", "http": "HTTP"}[scheme]
    assert backend.describe() == f"{scheme} (mlserver 1.7.1 at {host} over {over}, {how} tensors)"
    volume = _volume()
    np.testing.assert_array_equal(backend.infer({"INPUT__0": volume})["OUTPUT__0"], volume * 2)  # HTTP: JSON
    tensor = backend(torch.from_numpy(_volume(seed=1)))
    assert isinstance(tensor, torch.Tensor)
    torch.testing.assert_close(tensor, torch.from_numpy(_volume(seed=1) * 2), rtol=0, atol=0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_several_dtypes_round_trip(mlserver: MLServer, open_backend: Open, scheme: str) -> None:
    backend = open_backend(mlserver.url(scheme), "mixed")
    rng = np.random.default_rng(3)
    floats = rng.standard_normal((4, 3)).astype(np.float32)
    ints = rng.integers(-(2**40), 2**40, (4, 2))
    out = backend.infer({"INPUT__0": floats, "INPUT__1": ints})
    assert out["OUTPUT__0"].dtype == np.float32
    assert out["OUTPUT__1"].dtype == np.int64
    np.testing.assert_array_equal(out["OUTPUT__0"], floats)
    np.testing.assert_array_equal(out["OUTPUT__1"], ints)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_batching_comes_from_the_local_config_with_its_monai_metadata(
    mlserver: MLServer, open_backend: Open, scheme: str, tmp_path: Path
) -> None:
    repo = _config(tmp_path / "models", "seg", max_batch_size=2)
    backend = open_backend(mlserver.url(scheme), "seg", model_repository=repo)
    assert backend.signature.max_batch_size == 2
    assert backend.signature.inputs[0].shape == (1, -1, -1, -1)
    assert backend.signature.metadata["network_data_format"]["inputs"]["image"]["num_channels"] == 1
    volume = _volume(batch=5)  # split into requests of at most 2 by the base, joined in order
    np.testing.assert_array_equal(backend.infer({"INPUT__0": volume})["OUTPUT__0"], volume * 2)


def test_the_option_sets_the_batch_and_wins_over_the_local_config(
    mlserver: MLServer, open_backend: Open, tmp_path: Path
) -> None:
    repo = _config(tmp_path / "models", "seg", max_batch_size=2)
    backend = open_backend(mlserver.grpc_url, "seg", model_repository=repo, max_batch_size=3)
    assert backend.signature.max_batch_size == 3
    backend = open_backend(f"{mlserver.grpc_url}?max_batch_size=4", "seg")
    assert (backend.signature.max_batch_size, backend.signature.inputs[0].shape) == (4, (1, -1, -1, -1))


def test_a_local_config_for_another_model_is_refused(mlserver: MLServer, open_backend: Open, tmp_path: Path) -> None:
    repo = _config(tmp_path / "models", "seg", dtype="TYPE_FP16")
    with pytest.raises(ConfigError, match=r"config\.pbtxt.* does not match the server's model metadata") as info:
        open_backend(mlserver.http_url, "seg", model_repository=repo)
    assert "FP16" in str(info.value)
    assert "FP32" in str(info.value)
    assert mlserver.http_url in str(info.value)


def test_a_batch_the_server_shapes_do_not_have_is_refused(mlserver: MLServer, open_backend: Open) -> None:
    with pytest.raises(ConfigError, match=r"max_batch_size 2 makes the first dim .* has shape \[1, 4\]"):
        open_backend(f"{mlserver.grpc_url}?max_batch_size=2", "fixed")
    backend = open_backend(mlserver.grpc_url, "fixed")  # no batch: the shape as the server gives it
    assert (backend.signature.batch_axis, backend.signature.inputs[0].shape) == (None, (1, 4))
    row = np.arange(4, dtype=np.float32).reshape(1, 4)
    np.testing.assert_array_equal(backend.infer({"INPUT__0": row})["OUTPUT__0"], row * 2)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_tensors_the_server_does_not_list_come_from_the_local_config(
    mlserver: MLServer, open_backend: Open, scheme: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"lists no inputs and there is no local config\.pbtxt"):
        open_backend(mlserver.url(scheme), "bare")
    repo = _config(tmp_path / "models", "bare")
    backend = open_backend(mlserver.url(scheme), "bare", model_repository=repo)
    assert backend.signature.input_names == ("INPUT__0",)
    volume = _volume()
    np.testing.assert_array_equal(backend.infer({"INPUT__0": volume})["OUTPUT__0"], volume * 2)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_missing_model_is_not_found_not_a_misleading_error(
    mlserver: MLServer, open_backend: Open, scheme: str
) -> None:
    with pytest.raises(ModelNotFoundError, match=r"model 'nope' is not on .*; the server has: .*seg") as info:
        open_backend(f"{mlserver.url(scheme)}?ready_timeout_s=20", "nope")
    assert "Method not found" not in str(info.value)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_what_the_server_lacks_is_said_clearly(mlserver: MLServer, open_backend: Open, scheme: str) -> None:
    with pytest.raises(ConfigError, match=r"shared_memory=system, but the server \(mlserver 1\.7\.1\) does not have"):
        open_backend(f"{mlserver.url(scheme)}?shared_memory=system", "seg")
    backend = open_backend(mlserver.url(scheme), "seg")
    with pytest.raises(ConfigError, match=r"does not have the statistics extension \(it lists: none\)"):
        backend.statistics()  # type: ignore[attr-defined]
