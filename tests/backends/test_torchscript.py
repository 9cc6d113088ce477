"""The in-process TorchScript backend: repository layout, versions, devices and bad model files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from monai_triton_ops import create_backend
from monai_triton_ops.errors import ConfigError, InferenceError, ModelLoadError, ModelNotFoundError

from ..conftest import DICT_META, UNET_META, DictOut, tiny_unet


class Scale(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def test_highest_version_by_default_and_a_given_version_on_request(make_repo: Callable[..., Path]) -> None:
    make_repo("scale", Scale(2.0), UNET_META, versions=(1,))
    repo = make_repo("scale", Scale(3.0), UNET_META, versions=(10,))  # 10 > 1 numerically, not as text
    x = np.ones((1, 1, 2, 2, 2), np.float32)
    with (
        create_backend("torch", "scale", model_repository=repo) as latest,
        create_backend("torch", "scale", model_repository=repo, version=1) as v1,
    ):
        assert latest.signature.version == 10
        assert float(latest(x).max()) == 3.0
        assert v1.signature.version == 1
        assert float(v1(x).max()) == 2.0


def test_missing_model_folder_lists_what_the_repository_has(unet_repo: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"model 'spleen' not found in repository .* \(available: unet\)"):
        create_backend("torch", "spleen", model_repository=unet_repo).open()


def test_missing_version_lists_the_versions(unet_repo: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"model 'unet' has no version 3 .* \(available: \[1\]\)"):
        create_backend("torch", "unet", model_repository=unet_repo, version=3).open()


def test_missing_repository_and_missing_model_file(tmp_path: Path, unet_repo: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        create_backend("torch", "unet", model_repository=tmp_path / "nowhere").open()
    (unet_repo / "unet" / "1" / "model.pt").rename(unet_repo / "unet" / "1" / "model.pt.old")
    with pytest.raises(ModelNotFoundError, match=r"no 'model.pt' .* \(found: model.pt.old\)"):
        create_backend("torch", "unet", model_repository=unet_repo).open()
    (unet_repo / "unet" / "1" / "model.pt.old").rename(unet_repo / "unet" / "1" / "model.onnx")
    with pytest.raises(ConfigError, match=r"model 'unet': its network is ONNX .* use --backend onnx"):
        create_backend("torch", "unet", model_repository=unet_repo).open()


@pytest.mark.parametrize("content", [b"not a model", b"PK\x03\x04 truncated zip"], ids=["text", "truncated"])
def test_corrupt_model_file_is_a_model_load_error(unet_repo: Path, content: bytes) -> None:
    (unet_repo / "unet" / "1" / "model.pt").write_bytes(content)
    backend = create_backend("torch", "unet", model_repository=unet_repo)
    with pytest.raises(ModelLoadError, match=r"model\.pt"):
        backend.open()
    backend.close()  # closing a backend that never opened is fine


def test_a_model_without_metadata_or_config_says_how_to_describe_it(make_repo: Callable[..., Path]) -> None:
    repo = make_repo("plain", tiny_unet(), None)
    with pytest.raises(ConfigError, match=r"no MONAI metadata and there is no config\.pbtxt"):
        create_backend("torch", "plain", model_repository=repo).open()


def test_dict_outputs_get_stable_names_in_signature_order(make_repo: Callable[..., Path]) -> None:
    repo = make_repo("dict", DictOut(), DICT_META)
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32)
    with create_backend("torch", "dict", model_repository=repo) as backend:
        out = backend.infer({backend.signature.inputs[0].name: x})
        probs, labels = (out[n] for n in backend.signature.output_names)
    assert probs.dtype == np.float32
    assert labels.dtype == np.uint8
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(labels[:, 0], x.argmax(axis=1))


def test_a_model_that_raises_gives_an_inference_error_naming_it(make_repo: Callable[..., Path]) -> None:
    class NeedsEight(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(-1, 8)

    repo = make_repo("strict", NeedsEight(), UNET_META)
    with (
        create_backend("torch", "strict", model_repository=repo) as backend,
        pytest.raises(InferenceError, match="model 'strict' failed"),
    ):
        backend(np.ones((1, 1, 3, 3, 3), np.float32))


def test_a_model_returning_the_wrong_dtype_is_caught(make_repo: Callable[..., Path]) -> None:
    class Doubles(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.double()

    repo = make_repo("wide", Doubles(), UNET_META)
    with create_backend("torch", "wide", model_repository=repo) as backend:
        with pytest.raises(InferenceError, match="model 'wide' output 'OUTPUT__0': expected dtype FP32, got FP64"):
            backend(np.ones((1, 1, 2, 2, 2), np.float32))
