"""One request and one call: what the base backend hands to a backend and what it keeps per ``submit()``.

An ``InferRequest`` is what a backend's ``_submit`` / ``_infer`` receives; a ``Call`` is the base's own
record of one ``submit()``: its requests (several when a batch was split), their results so far, and
the caller's future, completed exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputValidationError, UsageError
from ..lazy_torch import is_tensor
from ..signature import ModelSignature
from .arrays import ArrayFamily, ArrayLike, as_torch, batch_of, split
from .deadlines import Timer

#: A Triton request parameter's value (the inference protocol carries strings, integers and booleans).
Parameter = str | int | bool


@dataclass(frozen=True, kw_only=True, eq=False)
class InferRequest:
    """What one request carries to a backend: validated, within ``max_batch_size``, as the caller gave it."""

    model: str
    inputs: Mapping[str, ArrayLike]  # numpy or torch as given (MetaTensor unwrapped), signature order
    outputs: tuple[str, ...]  # the outputs to return, in signature order
    family: ArrayFamily  # what the caller gets back (the base converts)
    deadline: float | None  # time.monotonic() deadline, or None
    parameters: Mapping[str, Parameter] = field(default_factory=dict)  # Triton request parameters, if any
    #: Set by the contract when the request is no longer wanted (its deadline, ``close()``, the caller's cancel):
    #: a backend stops between steps (a retry's backoff waits on it).
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def remaining_s(self) -> float | None:
        """Seconds left until the deadline (negative once passed), or ``None`` without one."""
        return None if self.deadline is None else self.deadline - time.monotonic()


class Call:
    """One ``submit()``: its requests, their results so far, and the caller's future."""

    def __init__(self, requests: list[InferRequest], timeout_s: float | None) -> None:
        self._future: Future[dict[str, ArrayLike]] | None = None
        self.requests = requests
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.running: set[int] = set()  # indices handed to the backend, not finished (backend lock)
        self.timer: Timer | None = None
        self._results: list[Mapping[str, ArrayLike] | None] = [None] * len(requests)
        self._left = len(requests)
        self._settled = False
        self._lock = threading.Lock()

    @property
    def future(self) -> Future[dict[str, ArrayLike]]:
        """The caller's future, made on first use (an ``infer()`` run on the caller's thread that succeeds has none)."""
        future = self._future
        if future is None:
            with self._lock:
                if self._future is None:
                    self._future = Future()
                future = self._future
        return future

    def store(self, index: int, outputs: Mapping[str, ArrayLike]) -> list[Mapping[str, ArrayLike]] | None:
        """Keep one request's outputs; all of them, in order, once the last arrives."""
        with self._lock:
            self._results[index] = outputs
            self._left -= 1
            if self._left or self._settled:
                return None
            self._settled = True
            return [r for r in self._results if r is not None]

    def drop_results(self) -> None:
        """Forget the per-request outputs once the caller's future holds them (they may be leased memory)."""
        with self._lock:
            self._results = [None] * len(self._results)

    def settle(self) -> bool:
        """True exactly once: whoever gets it completes the future."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
            return True


def split_requests(
    model: str,
    signature: ModelSignature,
    inputs: Mapping[str, ArrayLike],
    outputs: tuple[str, ...],
    timeout_s: float | None,
    parameters: Mapping[str, Parameter] | None = None,
) -> list[InferRequest]:
    """The requests of one call: its (validated) inputs in signature order, in parts of at most ``max_batch_size``
    along the batch axis, all with the same deadline and Triton request parameters."""
    given = {name: unwrapped(inputs[name]) for name in signature.input_names}
    family = ArrayFamily.of(given[signature.input_names[0]])
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    limit = signature.max_batch_size
    whole = signature.batch_axis != 0 or limit <= 0 or batch_of(given) <= limit
    return [
        InferRequest(
            model=model, inputs=part, outputs=outputs, family=family, deadline=deadline, parameters=parameters or {}
        )
        for part in ([given] if whole else split(given, limit))
    ]


def unwrapped(value: ArrayLike) -> ArrayLike:
    """Tensor subclasses (MetaTensor) as plain tensors, so no backend pays their dispatch; numpy as is."""
    return as_torch(value) if is_tensor(value) else value


def wanted_outputs(signature: ModelSignature, outputs: Sequence[str] | None) -> tuple[str, ...]:
    """The requested outputs in signature order; unknown names are refused with the known ones."""
    if outputs is None:
        return signature.output_names
    requested = (outputs,) if isinstance(outputs, str) else tuple(outputs)
    unknown = [name for name in requested if name not in signature.output_names]
    if unknown or not requested:
        raise InputValidationError(
            f"model {signature.name!r}: cannot return outputs {list(requested)}; its outputs are "
            f"{list(signature.output_names)}"
        )
    return tuple(name for name in signature.output_names if name in requested)


def checked_parameters(backend: Any, parameters: Mapping[str, Parameter] | None) -> Mapping[str, Parameter]:
    """A request's Triton parameters, checked: only for a backend that ``takes_parameters``, scalar values."""
    if not parameters:
        return {}
    if not backend.takes_parameters:
        raise UsageError(
            f"model {backend.model_name!r}: the {backend.kind} backend passes no request parameters "
            f"({sorted(parameters)}); they are for models on a Triton server (grpc://, http://)"
        )
    bad = {k: v for k, v in parameters.items() if not isinstance(k, str) or not isinstance(v, str | int | bool)}
    if bad:
        raise UsageError(f"model {backend.model_name!r}: request parameters must map names to str, int or bool: {bad}")
    return dict(parameters)


def complete(
    future: Future[dict[str, ArrayLike]],
    *,
    result: dict[str, ArrayLike] | None = None,
    error: BaseException | None = None,
) -> None:
    """Set the caller's future once; a future the caller cancelled stays cancelled."""
    try:
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)
    except InvalidStateError:
        pass
