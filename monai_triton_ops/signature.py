"""What a model takes and returns, in Triton's terms, shared by every backend.

A ``ModelSignature`` is the one description that the TorchScript backend, the Triton backends,
``config.pbtxt`` generation and input validation all agree on. Dtypes are Triton's wire names
(``"FP32"``, ``"INT64"``, ``"BOOL"``); one table maps them to numpy and torch so that no module
keeps its own.

Shapes follow Triton: ``-1`` marks a dynamic dim, and when ``max_batch_size > 0`` the batch dim is
implicit (not part of ``shape``), exactly as in ``config.pbtxt``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from . import lazy_torch
from .errors import ConfigError

if TYPE_CHECKING:
    import torch

#: Triton wire dtype -> (numpy dtype, name of the torch dtype). BYTES has no torch equivalent. Torch's own dtypes are
#: looked up by name on first use, so that this table does not import torch (``lazy_torch.py``).
_DTYPES: Mapping[str, tuple[np.dtype[Any], str | None]] = MappingProxyType(
    {
        "BOOL": (np.dtype(np.bool_), "bool"),
        "UINT8": (np.dtype(np.uint8), "uint8"),
        "UINT16": (np.dtype(np.uint16), "uint16"),
        "UINT32": (np.dtype(np.uint32), "uint32"),
        "UINT64": (np.dtype(np.uint64), "uint64"),
        "INT8": (np.dtype(np.int8), "int8"),
        "INT16": (np.dtype(np.int16), "int16"),
        "INT32": (np.dtype(np.int32), "int32"),
        "INT64": (np.dtype(np.int64), "int64"),
        "FP16": (np.dtype(np.float16), "float16"),
        "FP32": (np.dtype(np.float32), "float32"),
        "FP64": (np.dtype(np.float64), "float64"),
        "BF16": (np.dtype(np.uint16), "bfloat16"),  # numpy has no bfloat16: raw 16-bit words
        "BYTES": (np.dtype(np.object_), None),
    }
)
_FROM_NUMPY = {np_dtype: name for name, (np_dtype, _) in _DTYPES.items() if name != "BF16"}
#: Names MONAI metadata uses for dtypes ("float32", "int64", ...), mapped to wire names.
_FROM_ALIAS = {str(np_dtype): name for np_dtype, name in _FROM_NUMPY.items()} | {"bfloat16": "BF16", "bool": "BOOL"}

#: A Triton tensor name that every backend and the libtorch naming convention accept.
TENSOR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def triton_dtypes() -> tuple[str, ...]:
    """All Triton wire dtype names that this package knows."""
    return tuple(_DTYPES)


def dtype_to_numpy(dtype: str) -> np.dtype[Any]:
    """Numpy dtype for a Triton wire dtype name."""
    return _DTYPES[_check_dtype(dtype)][0]


def dtype_to_torch(dtype: str) -> torch.dtype:
    """Torch dtype for a Triton wire dtype name; BYTES has none."""
    torch_name = _DTYPES[_check_dtype(dtype)][1]
    if torch_name is None:
        raise ConfigError(f"dtype {dtype} has no torch equivalent")
    import torch

    dtype_: torch.dtype = getattr(torch, torch_name)
    return dtype_


@functools.cache
def _from_torch() -> Mapping[Any, str]:
    """Torch dtype -> wire name; asked only for a torch value, so torch is already imported."""
    import torch

    return {getattr(torch, t): name for name, (_, t) in _DTYPES.items() if t is not None}


def dtype_of(value: Any) -> str:
    """Triton wire dtype of a numpy/torch array or dtype, or of a MONAI metadata name like 'float32'."""
    if isinstance(value, np.ndarray) or lazy_torch.is_tensor(value):
        value = value.dtype
        known = _FROM_NUMPY.get(value) if isinstance(value, np.dtype) else _from_torch().get(value)
        if known is not None:  # every array of every request comes here: the table first
            return known
    if lazy_torch.is_dtype(value):
        if value in _from_torch():
            return _from_torch()[value]
    elif isinstance(value, str) and value.lower() in _FROM_ALIAS:
        return _FROM_ALIAS[value.lower()]
    elif isinstance(value, str) and value.upper() in _DTYPES:
        return value.upper()
    else:
        try:
            np_dtype = np.dtype(value)
        except TypeError:
            np_dtype = None
        if np_dtype is not None and np_dtype in _FROM_NUMPY:
            return _FROM_NUMPY[np_dtype]
    raise ConfigError(f"unsupported dtype {value!r}; supported: {', '.join(_DTYPES)}")


def _check_dtype(dtype: str) -> str:
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown Triton dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
    return dtype


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One named input or output: Triton dtype name and shape (-1 = dynamic)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not TENSOR_NAME.match(self.name):
            raise ConfigError(f"tensor name {self.name!r} is not a valid name (letters, digits, '_')")
        _check_dtype(self.dtype)
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < -1 or d == 0 for d in self.shape):
            raise ConfigError(f"tensor {self.name!r}: shape {list(self.shape)} must hold positive dims or -1")

    def full_shape(self, max_batch_size: int) -> tuple[int, ...]:
        """The shape a caller passes: with the batch dim (-1) when the model batches implicitly."""
        return (-1, *self.shape) if max_batch_size > 0 else self.shape

    def shape_mismatch(self, shape: Sequence[int], max_batch_size: int) -> str | None:
        """``None`` when ``shape`` fits this spec (rank, every fixed dim; -1 takes any size), else why not.

        The one shape rule of the package: input validation, metadata checks and probing all use it.
        """
        expected = self.full_shape(max_batch_size)
        actual = tuple(int(d) for d in shape)
        if len(actual) != len(expected):
            return f"expected {len(expected)} dims {list(expected)}, got {len(actual)} dims {list(actual)}"
        for axis, (want, got) in enumerate(zip(expected, actual, strict=True)):
            if want not in (-1, got):
                return f"expected shape {list(expected)}, got {list(actual)} (dim {axis}: expected {want}, got {got})"
        return None


@dataclass(frozen=True, kw_only=True)
class ModelSignature:
    """Named inputs and outputs of one model version, as every backend reports it.

    ``metadata`` holds the MONAI metadata (``network_data_format`` and friends) when the model
    carries it, so post-processing and remote clients can read channel meanings without the file.
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0
    version: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        if not self.inputs or not self.outputs:
            raise ConfigError(f"model {self.name!r}: a signature needs at least one input and one output")
        if self.max_batch_size < 0:
            raise ConfigError(f"model {self.name!r}: max_batch_size must be >= 0, got {self.max_batch_size}")
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            names = [s.name for s in specs]
            if len(set(names)) != len(names):
                raise ConfigError(f"model {self.name!r}: duplicate {kind} names {names}")

    # Cached (read for every request; the dataclass is frozen): a cached_property writes the instance's
    # __dict__ directly, past the frozen __setattr__, and is not a field (equality and hashing ignore it).
    @functools.cached_property
    def batch_axis(self) -> int | None:
        """0 when the leading dim is the batch, ``None`` for a model without one.

        The batch is implicit with ``max_batch_size > 0``; with ``max_batch_size: 0`` it is explicit
        when every input and output leads with a dynamic dim (as MONAI metadata and probing give:
        ``[-1, C, ...]``). Only a model with ``max_batch_size > 0`` has requests split by the base.
        """
        if self.max_batch_size > 0:
            return 0
        tensors = (*self.inputs, *self.outputs)
        return 0 if all(len(t.shape) >= 2 and t.shape[0] == -1 for t in tensors) else None

    @functools.cached_property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @functools.cached_property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    def input(self, name: str) -> TensorSpec:
        """The input spec called ``name``."""
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise ConfigError(f"model {self.name!r} has no input {name!r}; inputs: {self.input_names}")

    def output(self, name: str) -> TensorSpec:
        """The output spec called ``name`` (read for every request: the message is made only when it is missing)."""
        for spec in self.outputs:
            if spec.name == name:
                return spec
        raise ConfigError(f"model {self.name!r} has no output {name!r}; outputs: {self.output_names}")
