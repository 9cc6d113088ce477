"""The committed ``model_repository/`` is what the tools produce and what every backend serves alike."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from monai_triton_ops import create_backend
from monai_triton_ops.repository.builder import generate_config
from monai_triton_ops.repository.config import read_config, signature_from_config

if TYPE_CHECKING:
    from monai_triton_ops.server import LocalTritonServer

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository"
NAME = "brain_tissue_seg"
sys.path.insert(0, str(ROOT / "apps" / NAME))


@pytest.fixture(scope="module")
def patch() -> np.ndarray:
    """A real 64^3 patch of the T1, pre-processed exactly as the app does."""
    from atlas import load_t1
    from transforms import pre_transforms

    volume = np.asarray(load_t1().dataobj, dtype=np.float32)[np.newaxis]
    x = pre_transforms()(volume)
    return np.ascontiguousarray(torch.as_tensor(x)[None, :, 66:130, 84:148, 62:126].numpy())


def test_the_committed_config_is_what_the_builder_generates_today() -> None:
    folder = REPO / NAME
    _, _, text = generate_config(folder / "1" / "model.pt", NAME, flavor="python")
    assert (folder / "config.pbtxt").read_text() == text
    assert (folder / "1" / "model.py").read_bytes() == (
        ROOT / "monai_triton_ops" / "repository" / "runner" / "model.py"
    ).read_bytes()


def test_the_torch_backend_reads_the_committed_layout(patch: np.ndarray) -> None:
    config_signature = signature_from_config(read_config(REPO / NAME / "config.pbtxt", name=NAME), version=1)
    with create_backend("torch", NAME, model_repository=REPO) as backend:
        assert backend.signature.inputs == config_signature.inputs
        assert backend.signature.outputs == config_signature.outputs
        assert backend.signature.metadata["network_data_format"]["outputs"]["pred"]["num_channels"] == 3
        logits = backend(patch)
    assert logits.shape == (1, 3, 64, 64, 64)


@pytest.mark.triton
@pytest.mark.slow
def test_the_committed_repository_serves_exactly_the_torchscript_output(
    patch: np.ndarray, committed_server: LocalTritonServer
) -> None:
    with create_backend("torch", NAME, model_repository=REPO) as backend:
        expected = backend(patch)
        input_name = backend.signature.inputs[0].name
    client = grpcclient.InferenceServerClient(committed_server.grpc_address)
    try:
        request = grpcclient.InferInput(input_name, list(patch.shape), "FP32")
        request.set_data_from_numpy(patch)
        result = client.infer(NAME, [request], client_timeout=120)
        served = result.as_numpy("OUTPUT__0")
    finally:
        client.close()
    assert served.shape == expected.shape
    assert float(np.abs(served - expected).max()) == 0.0
