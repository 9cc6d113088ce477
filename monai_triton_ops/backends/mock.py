"""A test double: a backend whose model is a Python function, with every shared behaviour real.

Pipeline and contract tests use it to check the data flow (transforms, sliding window, requests in
flight) without a model file; lifecycle, validation, batch split, deadlines and conversions are the
real ``BaseBackend`` ones. It records when each request ran, so overlap can be shown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..signature import ModelSignature
from .arrays import ArrayLike, as_torch
from .base import BaseBackend, InferRequest

ModelFn = Callable[[dict[str, torch.Tensor]], Mapping[str, torch.Tensor]]


class MockBackend(BaseBackend):
    """Runs ``fn(inputs) -> outputs`` (torch tensors) under the given signature.

    ``calls`` counts requests; ``spans`` holds ``(start, end)`` monotonic times of each request.
    """

    kind = "mock"

    def __init__(self, model_name: str | None = None, *, signature: ModelSignature, fn: ModelFn, **kwargs: Any) -> None:
        super().__init__(model_name or signature.name, **kwargs)
        self._given_signature = signature
        self._fn = fn
        self._record = threading.Lock()
        self.calls = 0
        self.spans: list[tuple[float, float]] = []

    def _open(self) -> ModelSignature:
        return self._given_signature

    def _infer(self, request: InferRequest) -> Mapping[str, ArrayLike]:
        start = time.monotonic()
        outputs = self._fn({name: _tensor(value) for name, value in request.inputs.items()})
        with self._record:
            self.calls += 1
            self.spans.append((start, time.monotonic()))
        return {name: outputs[name] for name in request.outputs}


def _tensor(value: ArrayLike) -> Any:
    """Torch for numeric arrays; BYTES (numpy object) arrays as given, since torch cannot hold them."""
    if isinstance(value, np.ndarray) and value.dtype == np.object_:
        return value
    return as_torch(value)
