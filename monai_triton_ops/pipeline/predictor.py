"""A backend as MONAI's predictor, with the windows of one sliding-window batch in flight together.

``SlidingWindowInferer`` calls its predictor with ``sw_batch_size`` windows stacked on axis 0. The
``Predictor`` cuts them into requests of ``request_batch_size`` windows, submits them all (at most
``max_in_flight`` outstanding at once, on top of the backend's own limit) and joins the results in
order, so a Triton server's dynamic batcher, or a second CPU thread, can work on several at once.
The result is the same as one request per batch: each window is computed independently.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future
from typing import overload

import numpy as np
import torch

from ..backends.arrays import ArrayLike, join
from ..backends.base import BaseBackend
from ..errors import ConfigError, UsageError

logger = logging.getLogger(__name__)


class Predictor:
    """``predictor(batch) -> output`` over ``backend``'s single input and one of its outputs
    (``outputs(batch)``: all of them, for a network with several).

    ``output`` defaults to the backend's ``output_name`` option, else the first output;
    ``request_batch_size`` to the model's ``max_batch_size`` (all windows in one request when the
    model declares none); ``max_in_flight`` to the backend's option; ``timeout_s`` to the backend's.
    """

    def __init__(
        self,
        backend: BaseBackend,
        *,
        output: str | None = None,
        request_batch_size: int | None = None,
        max_in_flight: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        for name, value in (("request_batch_size", request_batch_size), ("max_in_flight", max_in_flight)):
            if value is not None and value < 1:
                raise ConfigError(f"predictor {name} must be >= 1, got {value}")
        self.backend = backend
        self.output = output
        self.request_batch_size = request_batch_size
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s

    @overload
    def __call__(self, data: torch.Tensor) -> torch.Tensor: ...
    @overload
    def __call__(self, data: np.ndarray) -> np.ndarray: ...
    def __call__(self, data: ArrayLike) -> ArrayLike:
        signature = self.backend.signature
        output = self.output or self.backend.options.output_name or signature.output_names[0]
        return self.outputs(data, (output,))[output]

    def outputs(self, data: ArrayLike, names: tuple[str, ...] | None = None) -> dict[str, ArrayLike]:
        """Outputs ``names`` (default: every output of the model) for ``data``, the windows split as for one."""
        signature = self.backend.signature
        if len(signature.inputs) != 1:
            raise UsageError(
                f"model {signature.name!r} has {len(signature.inputs)} inputs {list(signature.input_names)}; "
                "a MONAI predictor feeds one; call the backend's infer() with a dict instead"
            )
        name = signature.input_names[0]
        wanted = names or signature.output_names
        batch = int(data.shape[0]) if data.ndim else 0
        size = self._request_size(batch)
        parts = [data[start : start + size] for start in range(0, batch, size)] if batch > size else [data]
        if len(parts) == 1:  # one request: infer() may run it on this thread, which waits for it anyway
            return dict(self.backend.infer({name: data}, outputs=wanted, timeout_s=self.timeout_s))
        limit = self.max_in_flight or self.backend.options.max_in_flight
        pending: deque[Future[dict[str, ArrayLike]]] = deque()
        results: list[dict[str, ArrayLike]] = []
        try:
            for part in parts:
                if len(pending) >= limit:
                    results.append(pending.popleft().result())
                pending.append(self.backend.submit({name: part}, outputs=wanted, timeout_s=self.timeout_s))
            while pending:
                results.append(pending.popleft().result())
        finally:
            for future in pending:  # an earlier window failed: the rest is not needed
                future.cancel()
        logger.debug("predictor: %d window(s) in %d request(s)", batch, len(parts))
        return join(results)

    def _request_size(self, batch: int) -> int:
        signature = self.backend.signature
        if signature.batch_axis != 0 or batch == 0:
            return max(batch, 1)
        return min(self.request_batch_size or signature.max_batch_size or batch, batch)
