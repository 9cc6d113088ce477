"""The backend contract, run against every backend: what apps rely on, whatever runs the model.

Later backends (in-process Triton, remote gRPC/HTTP) join by adding a factory to ``BACKENDS``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.inferers import SimpleInferer, sliding_window_inference

from monai_triton_ops import create_backend
from monai_triton_ops.backends.base import BackendState, BaseBackend
from monai_triton_ops.backends.mock import MockBackend
from monai_triton_ops.backends.torchscript import name_outputs
from monai_triton_ops.errors import BackendStateError, InputValidationError, UsageError
from monai_triton_ops.repository.metadata import signature_from_metadata

from ..conftest import TWO_META, UNET_META, TwoInTwoOut, tiny_unet

Factory = Callable[[Path, str, torch.nn.Module, dict], BaseBackend]


def _torch(repo: Path, name: str, module: torch.nn.Module, meta: dict) -> BaseBackend:
    return create_backend("torch", name, model_repository=repo)


def _mock(repo: Path, name: str, module: torch.nn.Module, meta: dict) -> BaseBackend:
    """The model runs eagerly in Python: the double for what a backend does with it."""
    scripted = torch.jit.load(str(repo / name / "1" / "model.pt"))
    signature = signature_from_metadata(
        name, meta, schema_names=[a.name for a in scripted.forward.schema.arguments][1:]
    )

    def run(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with torch.inference_mode():
            return name_outputs(signature, module(*(inputs[n] for n in signature.input_names)))

    return MockBackend(signature=signature, fn=run)


BACKENDS = {"torch": _torch, "mock": _mock}


@pytest.fixture(params=sorted(BACKENDS))
def factory(request: pytest.FixtureRequest) -> Factory:
    return BACKENDS[request.param]


@pytest.fixture
def unet(factory: Factory, make_repo: Callable[..., Path]):
    module = tiny_unet().eval()
    with factory(make_repo("unet", module, UNET_META), "unet", module, UNET_META) as backend:
        yield backend, module


@pytest.fixture
def two(factory: Factory, make_repo: Callable[..., Path]):
    module = TwoInTwoOut()
    with factory(make_repo("two", module, TWO_META), "two", module, TWO_META) as backend:
        yield backend, module


def _image(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_signature_names_inputs_and_outputs(unet) -> None:
    backend, _ = unet
    sig = backend.signature
    assert sig.name == "unet"
    assert sig.inputs[0].dtype == "FP32"
    assert sig.inputs[0].shape == (-1, 1, -1, -1, -1)
    assert sig.outputs[0].shape == (-1, 3, -1, -1, -1)
    assert sig.metadata["network_data_format"]["outputs"]["pred"]["num_channels"] == 3


def test_numpy_in_numpy_out_equal_to_the_model(unet) -> None:
    backend, module = unet
    x = _image(2, 1, 8, 8, 8)
    out = backend.infer({backend.signature.inputs[0].name: x})
    (name,) = out
    assert isinstance(out[name], np.ndarray)
    assert out[name].dtype == np.float32
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out[name], expected, rtol=1e-5, atol=1e-5)


def test_torch_in_torch_out_on_the_callers_device(unet) -> None:
    backend, _ = unet
    y = backend(torch.from_numpy(_image(1, 1, 8, 8, 8)))
    assert isinstance(y, torch.Tensor)
    assert y.device.type == "cpu"
    assert tuple(y.shape) == (1, 3, 8, 8, 8)


def test_is_a_monai_predictor_for_simple_and_sliding_window(unet) -> None:
    backend, module = unet
    x = torch.from_numpy(_image(1, 1, 12, 10, 8))
    simple = SimpleInferer()(x, backend)
    windowed = sliding_window_inference(x, roi_size=(8, 8, 8), sw_batch_size=2, predictor=backend, overlap=0.5)
    assert simple.shape == windowed.shape == (1, 3, 12, 10, 8)
    with torch.inference_mode():
        expected = sliding_window_inference(x, roi_size=(8, 8, 8), sw_batch_size=2, predictor=module, overlap=0.5)
    torch.testing.assert_close(windowed, expected, rtol=1e-5, atol=1e-5)


def test_two_inputs_two_outputs_of_different_dtypes(two) -> None:
    backend, module = two
    sig = backend.signature
    image, offset = _image(3, 2, 4, 5), np.array([[1], [-2], [3]], dtype=np.int64)
    out = backend.infer(dict(zip(sig.input_names, (image, offset), strict=True)))
    doubled, positive = (out[n] for n in sig.output_names)
    assert doubled.dtype == np.float32
    assert positive.dtype == np.bool_
    expected = module(torch.from_numpy(image), torch.from_numpy(offset))
    np.testing.assert_array_equal(doubled, expected[0].numpy())
    np.testing.assert_array_equal(positive, expected[1].numpy())


def test_predictor_call_refuses_a_multi_input_model(two) -> None:
    backend, _ = two
    with pytest.raises(UsageError, match="2 inputs"):
        backend(_image(1, 2, 4, 4))


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.zeros((1, 1, 8, 8, 8), np.float64), r"input '\w+': expected dtype FP32, got FP64"),
        (np.zeros((1, 2, 8, 8, 8), np.float32), r"dim 1: expected 1, got 2"),
        (np.zeros((1, 1, 8, 8), np.float32), r"expected 5 dims .* got 4 dims"),
    ],
    ids=["dtype", "channels", "rank"],
)
def test_bad_input_is_refused_with_model_tensor_expected_actual(unet, array: np.ndarray, match: str) -> None:
    backend, _ = unet
    with pytest.raises(InputValidationError, match=match) as info:
        backend(array)
    assert "model 'unet'" in str(info.value)


def test_missing_and_unknown_input_names_are_refused(two) -> None:
    backend, _ = two
    name = backend.signature.input_names[0]
    with pytest.raises(InputValidationError, match=r"missing \[") as info:
        backend.infer({name: _image(1, 2, 4, 4), "bogus": _image(1)})
    assert "unknown ['bogus']" in str(info.value)


def test_lifecycle_open_close_idempotent_and_no_reopen(factory: Factory, make_repo: Callable[..., Path]) -> None:
    module = tiny_unet()
    backend = factory(make_repo("unet", module, UNET_META), "unet", module, UNET_META)
    assert backend.state is BackendState.NEW
    with pytest.raises(BackendStateError, match="open"):
        backend(_image(1, 1, 8, 8, 8))
    with backend:
        assert backend.open() is backend  # opening twice is a no-op
        assert backend.state is BackendState.OPEN
    assert backend.state is BackendState.CLOSED
    backend.close()  # idempotent
    with pytest.raises(BackendStateError, match="cannot reopen"):
        backend.open()
    with pytest.raises(BackendStateError):
        backend.infer({"x": _image(1, 1, 8, 8, 8)})


def test_concurrent_callers_get_their_own_results(unet) -> None:
    backend, module = unet
    inputs = [_image(1, 1, 8, 8, 8) * (i + 1) for i in range(6)]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(3):
            results[i] = backend(inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == list(range(len(inputs)))
    with torch.inference_mode():
        for i, x in enumerate(inputs):
            np.testing.assert_allclose(results[i], module(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-5)
