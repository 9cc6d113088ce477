"""What the base backend does with a backend that misbehaves, and with callers that cancel.

These failures (a backend returning the wrong names, raising a foreign error, refusing synchronously,
seeing the deadline itself) cannot be caused with a correct real backend, so small backends written
here cause them; every shared behaviour under test is the real ``BaseBackend``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
import torch

from monai_triton_ops.backends.base import BaseBackend, InferRequest
from monai_triton_ops.backends.mock import MockBackend
from monai_triton_ops.backends.options import BackendOptions
from monai_triton_ops.backends.torchscript import TorchScriptBackend
from monai_triton_ops.errors import (
    BackendStateError,
    ConfigError,
    InferenceError,
    InferenceTimeoutError,
    UsageError,
)
from monai_triton_ops.signature import ModelSignature, TensorSpec

SIGNATURE = ModelSignature(
    name="m",
    inputs=(TensorSpec(name="x", dtype="FP32", shape=(2,)),),
    outputs=(TensorSpec(name="y", dtype="FP32", shape=(2,)),),
    max_batch_size=2,
)
X = np.ones((1, 2), np.float32)


class Async(BaseBackend):
    """An asynchronous backend whose ``_submit`` does what the test says."""

    kind = "async"

    def __init__(self, behaviour: Any, **kwargs: Any) -> None:
        super().__init__("m", **kwargs)
        self.behaviour = behaviour
        self.cancelled: list[InferRequest] = []

    def _open(self) -> ModelSignature:
        return SIGNATURE

    def _submit(self, request: InferRequest) -> Future[Mapping[str, Any]]:
        return self.behaviour(request)

    def _cancel(self, request: InferRequest) -> None:
        self.cancelled.append(request)


def _done(value: Any = None, error: BaseException | None = None) -> Future[Mapping[str, Any]]:
    future: Future[Mapping[str, Any]] = Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


@pytest.mark.parametrize(
    ("behaviour", "error", "match"),
    [
        (lambda r: _done({"z": np.ones((1, 2), np.float32)}), InferenceError, r"returned outputs \['z'\], requested"),
        (lambda r: _done({"y": np.ones((1, 2), np.float64)}), InferenceError, "output 'y': expected dtype FP32"),
        (lambda r: _done(error=ValueError("boom")), InferenceError, r"async backend failed: ValueError\('boom'\)"),
        (lambda r: (_ for _ in ()).throw(ConnectionError("refused")), InferenceError, "refused"),
    ],
    ids=["names", "dtype", "foreign-error", "raises-synchronously"],
)
def test_a_misbehaving_backend_fails_the_call_with_an_inference_error(behaviour: Any, error: type, match: str) -> None:
    with Async(behaviour) as backend:
        future = backend.submit({"x": X})  # never raises for what the backend does
        with pytest.raises(error, match=match):
            future.result(timeout=10)
        assert backend.in_flight == 0


def test_a_split_request_whose_output_has_another_batch_is_refused() -> None:
    with Async(lambda r: _done({"y": np.ones((3, 2), np.float32)})) as backend:
        with pytest.raises(InferenceError, match=r"output 'y': expected a batch of 2, got shape \[3, 2\]"):
            backend.infer({"x": np.ones((3, 2), np.float32)})


def test_a_timeout_the_backend_sees_first_reads_as_the_callers_deadline() -> None:
    with Async(lambda r: _done(error=InferenceTimeoutError("transport deadline"))) as backend:
        with pytest.raises(InferenceTimeoutError, match=r"model 'm': no answer within the deadline of 5 s") as info:
            backend.infer({"x": X}, timeout_s=5)
        assert "transport deadline" in str(info.value.__cause__)
        with pytest.raises(InferenceTimeoutError, match="transport deadline"):  # no caller deadline: its own
            backend.infer({"x": X})


def test_a_caller_cancelling_its_future_cancels_the_request() -> None:
    pending: list[Future[Mapping[str, Any]]] = []

    def never(request: InferRequest) -> Future[Mapping[str, Any]]:
        pending.append(Future())
        return pending[-1]

    with Async(never) as backend:
        future = backend.submit({"x": X})
        assert future.cancel()
        assert len(backend.cancelled) == 1
        pending[0].set_result({"y": X})  # the backend finishing later changes nothing
        assert future.cancelled()
        assert backend.in_flight == 0


def test_construction_and_call_arguments_are_checked() -> None:
    class Nothing(BaseBackend):
        def _open(self) -> ModelSignature:
            return SIGNATURE

    with pytest.raises(TypeError, match="must implement _infer"):
        Nothing("m")
    with pytest.raises(ConfigError, match="backend 'torch' takes TorchScriptOptions options, got BackendOptions"):
        TorchScriptBackend("m", model_repository=".", options=BackendOptions())
    with MockBackend(signature=SIGNATURE, fn=lambda i: {"y": i["x"]}) as backend:
        with pytest.raises(UsageError, match="timeout_s must be > 0"):
            backend.infer({"x": X}, timeout_s=0)
        assert isinstance(backend.infer({"x": torch.ones(1, 2)})["y"], torch.Tensor)


def test_close_from_another_thread_while_a_caller_waits_ends_its_wait() -> None:
    gate = threading.Event()

    def blocked(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        gate.wait(timeout=30)
        return {"y": inputs["x"]}

    backend = MockBackend(signature=SIGNATURE, fn=blocked, options=BackendOptions(max_in_flight=1)).open()
    future = backend.submit({"x": X})
    closer = threading.Thread(target=backend.close, kwargs={"timeout_s": 0.05})
    closer.start()
    with pytest.raises(BackendStateError, match=r"closed after waiting 0\.05 s"):
        future.result(timeout=30)
    closer.join(timeout=30)
    gate.set()
