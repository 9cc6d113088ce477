"""The predictor MONAI's sliding window calls: windows split into requests that are in flight together."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from monai.inferers import SlidingWindowInferer

from monai_triton_ops.backends.mock import MockBackend
from monai_triton_ops.backends.options import BackendOptions
from monai_triton_ops.errors import ConfigError, InferenceError
from monai_triton_ops.pipeline import Predictor
from monai_triton_ops.signature import ModelSignature, TensorSpec


def _signature(max_batch_size: int) -> ModelSignature:
    dims = (1, -1, -1) if max_batch_size else (-1, 1, -1, -1)
    return ModelSignature(
        name="double",
        inputs=(TensorSpec(name="x", dtype="FP32", shape=dims),),
        outputs=(TensorSpec(name="y", dtype="FP32", shape=dims), TensorSpec(name="z", dtype="FP32", shape=dims)),
        max_batch_size=max_batch_size,
    )


def _double(gate: threading.Barrier | None = None):
    def run(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if gate is not None:
            gate.wait(timeout=10)  # returns only once two requests run at the same time
        x = inputs["x"]
        return {"y": x * 2.0, "z": x - 1.0}

    return run


def test_sliding_window_windows_go_out_as_requests_in_flight_together() -> None:
    gate = threading.Barrier(2)  # a request blocks until a second one is running beside it
    backend = MockBackend(signature=_signature(2), fn=_double(gate), options=BackendOptions(max_in_flight=2))
    image = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 1, 16, 16)).astype(np.float32))
    inferer = SlidingWindowInferer(roi_size=(8, 8), sw_batch_size=4, overlap=0.0)
    with backend:
        result = inferer(image, Predictor(backend))
    torch.testing.assert_close(result, image * 2.0)
    assert backend.calls == 2  # 4 windows, 2 per request (max_batch_size), both in flight at once
    (a_start, a_end), (b_start, b_end) = backend.spans
    assert max(a_start, b_start) < min(a_end, b_end)


def test_request_batch_size_splits_a_model_without_a_batch_limit_and_output_picks_one() -> None:
    backend = MockBackend(signature=_signature(0), fn=_double(), options=BackendOptions(output_name="z"))
    x = np.random.default_rng(1).standard_normal((5, 1, 4, 4)).astype(np.float32)
    with backend:
        np.testing.assert_array_equal(Predictor(backend, request_batch_size=2)(x), x - 1.0)
        assert backend.calls == 3
        np.testing.assert_array_equal(Predictor(backend, output="y")(x), x * 2.0)
        assert backend.calls == 4  # no limit declared: the whole batch in one request


def test_a_failing_window_fails_the_call_and_the_rest_is_dropped() -> None:
    def fails_on_negative(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        time.sleep(0.01)
        if float(inputs["x"].min()) < 0:
            raise InferenceError("model 'double': negative input")
        return {"y": inputs["x"], "z": inputs["x"]}

    backend = MockBackend(signature=_signature(1), fn=fails_on_negative, options=BackendOptions(max_in_flight=1))
    x = np.ones((6, 1, 2, 2), np.float32)
    x[1] = -1
    with backend, pytest.raises(InferenceError, match="negative input"):
        Predictor(backend, max_in_flight=1)(x)
    assert backend.calls < 6


def test_predictor_settings_are_checked() -> None:
    backend = MockBackend(signature=_signature(2), fn=_double())
    with pytest.raises(ConfigError, match="request_batch_size must be >= 1"):
        Predictor(backend, request_batch_size=0)
