"""The backend contract: ``open / infer / close``, a context manager, and a MONAI predictor.

A backend is where the model runs (in-process TorchScript, in-process Triton, remote Triton).
Everything that must behave the same on every backend lives in ``BaseBackend``: the lifecycle,
input validation against the signature, output checks, and giving results back on the caller's
device and array family (torch in, torch out; numpy in, numpy out). A subclass only loads the
model (``_open``), runs one request on torch tensors (``_infer``) and releases (``_close``).
"""

from __future__ import annotations

import enum
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Protocol, TypeAlias, overload, runtime_checkable

import numpy as np
import torch

from ..errors import BackendStateError, InferenceError, UsageError
from ..signature import ModelSignature, dtype_of
from ..validation import validate_inputs

logger = logging.getLogger(__name__)

#: What callers pass and get back: a numpy array or a torch tensor.
ArrayLike: TypeAlias = np.ndarray | torch.Tensor


@runtime_checkable
class Backend(Protocol):
    """What the operator, the pipeline and users rely on, whatever runs the model."""

    @property
    def signature(self) -> ModelSignature: ...

    def open(self) -> Backend: ...

    def infer(self, inputs: Mapping[str, ArrayLike]) -> dict[str, ArrayLike]: ...

    def close(self) -> None: ...

    def __call__(self, data: ArrayLike) -> ArrayLike: ...

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc: object) -> None: ...


class BackendState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class BaseBackend(ABC):
    """Lifecycle, validation and conversions shared by every backend.

    ``open()`` is explicit (and done by ``with``), so heavy loading happens where the caller
    chooses (the operator's ``start()``); ``close()`` is idempotent and a closed backend cannot
    be reopened, so a released model is never used by accident.
    """

    #: The spec scheme this backend answers to (``"torch"``, ``"grpc"``...), for messages.
    kind: str = "base"

    def __init__(self, model_name: str, *, output_name: str | None = None) -> None:
        self.model_name = model_name
        self.output_name = output_name
        self._state = BackendState.NEW
        self._state_lock = threading.Lock()
        self._signature: ModelSignature | None = None

    # -- what a subclass provides ------------------------------------------------------------
    @abstractmethod
    def _open(self) -> ModelSignature:
        """Load or connect to the model and return its signature."""

    @abstractmethod
    def _infer(self, inputs: dict[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """Run one validated request; tensors are torch, outputs keyed by signature names."""

    def _close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing to release
        """Release what ``_open`` acquired."""

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def state(self) -> BackendState:
        return self._state

    @property
    def signature(self) -> ModelSignature:
        """The model's named inputs and outputs; available once open."""
        if self._signature is None:
            raise BackendStateError(f"{self!r}: call open() (or use 'with') before reading the signature")
        return self._signature

    def open(self) -> BaseBackend:
        """Load the model; a no-op when already open. Returns ``self`` for chaining."""
        with self._state_lock:
            if self._state is BackendState.CLOSED:
                raise BackendStateError(f"{self!r}: cannot reopen a backend once it has been closed")
            if self._state is BackendState.NEW:
                self._signature = self._open()
                self._state = BackendState.OPEN
                logger.info("opened %r: inputs %s outputs %s", self, self._signature.inputs, self._signature.outputs)
        return self

    def close(self) -> None:
        """Release the model. Safe to call more than once."""
        with self._state_lock:
            if self._state is BackendState.OPEN:
                try:
                    self._close()
                finally:
                    logger.info("closed %r", self)
            self._state = BackendState.CLOSED

    def __enter__(self) -> BaseBackend:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model_name!r}, state={self._state.value})"

    # -- inference ---------------------------------------------------------------------------
    def infer(self, inputs: Mapping[str, ArrayLike]) -> dict[str, ArrayLike]:
        """Run the model on named inputs and return every named output.

        Inputs are checked against the signature before anything runs; outputs come back as
        the same array family as the first input (numpy or torch) and on its device.
        """
        if self._state is not BackendState.OPEN:
            raise BackendStateError(f"{self!r}: infer() needs an open backend (state {self._state.value})")
        signature = self.signature
        validate_inputs(signature, inputs)
        first = inputs[signature.inputs[0].name]
        tensors = {name: _as_torch(value) for name, value in inputs.items()}
        logger.debug("%r infer %s", self, {n: tuple(t.shape) for n, t in tensors.items()})
        outputs = self._infer(tensors)
        self._check_outputs(outputs)
        return {spec.name: _like(outputs[spec.name], first) for spec in signature.outputs}

    @overload
    def __call__(self, data: torch.Tensor) -> torch.Tensor: ...
    @overload
    def __call__(self, data: np.ndarray) -> np.ndarray: ...
    def __call__(self, data: ArrayLike) -> ArrayLike:
        """MONAI predictor: one tensor in, one tensor out, for ``SimpleInferer`` and sliding window."""
        signature = self.signature
        if len(signature.inputs) != 1:
            raise UsageError(
                f"model {signature.name!r} has {len(signature.inputs)} inputs {list(signature.input_names)}; "
                "call infer() with a dict instead"
            )
        output = self.output_name or signature.outputs[0].name
        signature.output(output)  # named error if the chosen output does not exist
        return self.infer({signature.inputs[0].name: data})[output]

    def _check_outputs(self, outputs: Mapping[str, torch.Tensor]) -> None:
        signature = self.signature
        expected = set(signature.output_names)
        if set(outputs) != expected:
            raise InferenceError(
                f"model {signature.name!r} returned outputs {sorted(outputs)}, "
                f"its signature declares {sorted(expected)}"
            )
        for spec in signature.outputs:
            actual = dtype_of(outputs[spec.name])
            if actual != spec.dtype:
                raise InferenceError(
                    f"model {signature.name!r} output {spec.name!r}: expected dtype {spec.dtype}, got {actual}"
                )


def _as_torch(value: ArrayLike) -> torch.Tensor:
    """Zero-copy where possible: numpy arrays share memory; subclasses (MetaTensor) become plain tensors."""
    if isinstance(value, torch.Tensor):
        return value if type(value) is torch.Tensor else value.as_subclass(torch.Tensor)
    return torch.from_numpy(np.ascontiguousarray(value))


def _like(output: torch.Tensor, reference: Any) -> ArrayLike:
    """Give ``output`` back in the array family and on the device of ``reference``."""
    if isinstance(reference, torch.Tensor):
        moved = output.to(reference.device)
        # Tensors made under inference_mode refuse in-place updates later (MONAI's sliding window
        # blends in place), so hand the caller a normal tensor.
        return moved.clone() if moved.is_inference() else moved
    return output.detach().cpu().numpy()
