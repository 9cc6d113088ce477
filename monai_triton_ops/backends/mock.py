"""A test double: a backend whose model is a Python function, with every shared behaviour real.

Pipeline and operator tests use it to check the data flow (transforms, sliding window, metadata)
without a model file; lifecycle, validation and conversions are the real ``BaseBackend`` ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from ..signature import ModelSignature
from .base import BaseBackend

ModelFn = Callable[[dict[str, torch.Tensor]], Mapping[str, torch.Tensor]]


class MockBackend(BaseBackend):
    """Runs ``fn(inputs) -> outputs`` under the given signature; counts calls for assertions."""

    kind = "mock"

    def __init__(
        self,
        *,
        signature: ModelSignature,
        fn: ModelFn,
        model_repository: str | Path | None = None,
        model_name: str | None = None,
        version: int | None = None,
        output_name: str | None = None,
    ) -> None:
        super().__init__(model_name or signature.name, output_name=output_name)
        self._given_signature = signature
        self._fn = fn
        self.calls = 0

    def _open(self) -> ModelSignature:
        return self._given_signature

    def _infer(self, inputs: dict[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        self.calls += 1
        return self._fn(inputs)
