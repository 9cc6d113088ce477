"""``TRITONSERVER_InferenceResponse``: what a response callback receives (and then owns).

The callee owns the response unless its callback raised, or an allocation of its outputs failed: then the
binding deletes it when the callback returns, which releases every output buffer allocated for it (a
reference the callback kept raises "deleted" on use).

Reading a response (outputs, parameters) first raises the error it carries, if any: the error belongs to
the response (it is not deleted), and when an allocator callback caused it, the exception is chained to
the one the callback raised. Deleting a response releases its output buffers: an exception a ``release_fn``
raises then is raised by ``delete()``, or, for a response dropped without ``delete()``, given to the future
of the inference it belongs to (logged once that future has completed).

Values returned by the getters are copied out, except ``output_array`` / ``output_tensor`` on buffers from
:class:`~.allocator.ArrayAllocator`, which return the array the output was written into (Python-owned
memory, valid after the response is deleted).
"""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ._library import lib, raise_error
from ._object import State, TritonObject, handle_object
from .allocator import collect_release_errors, deliver_release_error
from .dtypes import numpy_dtype
from .enums import TRITONSERVER_DataType, TRITONSERVER_MemoryType, TRITONSERVER_ParameterType
from .error import InternalError, UnsupportedError
from .flight import Flight, FlightServer

if TYPE_CHECKING:
    import torch


class ResponseOutput(NamedTuple):
    """``TRITONSERVER_InferenceResponseOutput``'s out-parameters."""

    name: str
    datatype: TRITONSERVER_DataType
    shape: tuple[int, ...]
    base: int
    byte_size: int
    memory_type: TRITONSERVER_MemoryType
    memory_type_id: int
    buffer_user_object: Any


class TRITONSERVER_InferenceResponse(TritonObject):
    """A response; the binding deletes it when the last reference goes (or at ``delete()``, or server stop)."""

    _c_delete = "TRITONSERVER_InferenceResponseDelete"

    def __init__(self, pointer: int, server: FlightServer, flight: Flight | None = None) -> None:
        super().__init__(pointer)
        self.server = server
        self._flight = flight
        self._checked = False
        server._adopt(self)

    def throw_if_response_error(self) -> None:
        """Raise the error the response carries (``TRITONSERVER_InferenceResponseError``), if any."""
        error = lib().TRITONSERVER_InferenceResponseError(self._ptr())
        if error:
            cause = self._flight.allocation_error() if self._flight is not None else None
            raise_error(error, owned=False, cause=cause)
        self._checked = True

    def _after_callback(self, *, raised: bool) -> None:
        """Its response callback returned (or ``raised``): delete the response if the callee may not keep it.

        A callback that raised did not take the response; a response whose output allocation failed holds
        the outputs allocated before the failure and nothing readable. Deleting it releases those buffers
        now, whatever still refers to it (a use then raises "deleted"). A response deleted already stays so.
        """
        if self._state is not State.OWNED:
            return
        failed = self._flight is not None and self._flight.allocation_failure is not None
        if raised:
            because = "its response callback raised"
        elif failed and lib().TRITONSERVER_InferenceResponseError(self._pointer):
            because = "an allocation of its outputs failed"
        else:
            return
        try:
            self._delete_now(because)
        except BaseException as exc:  # carried to the inference's future
            if self._flight is not None:
                self._flight.note(exc)

    def _read(self) -> int:
        if not self._checked:
            self.throw_if_response_error()
        return self._ptr()

    # -- getters ----------------------------------------------------------------------------------------
    @property
    def model(self) -> tuple[str, int]:
        """``(model name, model version)``."""
        name, version = ctypes.c_char_p(), ctypes.c_int64()
        lib().TRITONSERVER_InferenceResponseModel(self._ptr(), ctypes.byref(name), ctypes.byref(version))
        return (name.value or b"").decode(), version.value

    @property
    def id(self) -> str:
        value = ctypes.c_char_p()
        lib().TRITONSERVER_InferenceResponseId(self._ptr(), ctypes.byref(value))
        return (value.value or b"").decode()

    @property
    def parameter_count(self) -> int:
        count = ctypes.c_uint32()
        lib().TRITONSERVER_InferenceResponseParameterCount(self._read(), ctypes.byref(count))
        return count.value

    def parameter(self, index: int) -> tuple[str, TRITONSERVER_ParameterType, str | int | bool | float]:
        """``(name, type, value)`` of parameter ``index``."""
        name, kind, value = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_void_p()
        lib().TRITONSERVER_InferenceResponseParameter(
            self._read(), index, ctypes.byref(name), ctypes.byref(kind), ctypes.byref(value)
        )
        param_type = TRITONSERVER_ParameterType(kind.value)
        address = value.value or 0
        result: str | int | bool | float
        if param_type is TRITONSERVER_ParameterType.STRING:
            result = ctypes.string_at(address).decode()
        elif param_type is TRITONSERVER_ParameterType.INT:
            result = ctypes.c_int64.from_address(address).value
        elif param_type is TRITONSERVER_ParameterType.BOOL:
            result = ctypes.c_bool.from_address(address).value
        elif param_type is TRITONSERVER_ParameterType.DOUBLE:
            result = ctypes.c_double.from_address(address).value
        else:
            raise UnsupportedError(f"response parameter {index} has type {param_type.name}")
        return (name.value or b"").decode(), param_type, result

    @property
    def output_count(self) -> int:
        count = ctypes.c_uint32()
        lib().TRITONSERVER_InferenceResponseOutputCount(self._read(), ctypes.byref(count))
        return count.value

    def output(self, index: int) -> ResponseOutput:
        """``TRITONSERVER_InferenceResponseOutput``; ``buffer_user_object`` is what the allocator returned."""
        name, datatype, shape, dims = (
            ctypes.c_char_p(),
            ctypes.c_int(),
            ctypes.POINTER(ctypes.c_int64)(),
            ctypes.c_uint64(),
        )
        base, size, kind, device, userp = (
            ctypes.c_void_p(),
            ctypes.c_size_t(),
            ctypes.c_int(),
            ctypes.c_int64(),
            ctypes.c_void_p(),
        )
        lib().TRITONSERVER_InferenceResponseOutput(
            self._read(),
            index,
            ctypes.byref(name),
            ctypes.byref(datatype),
            ctypes.byref(shape),
            ctypes.byref(dims),
            ctypes.byref(base),
            ctypes.byref(size),
            ctypes.byref(kind),
            ctypes.byref(device),
            ctypes.byref(userp),
        )
        record = handle_object(userp.value)
        return ResponseOutput(
            name=(name.value or b"").decode(),
            datatype=TRITONSERVER_DataType(datatype.value),
            shape=tuple(shape[i] for i in range(dims.value)),
            base=base.value or 0,
            byte_size=size.value,
            memory_type=TRITONSERVER_MemoryType(kind.value),
            memory_type_id=device.value,
            buffer_user_object=record.user_object if record is not None else None,
        )

    def output_classification_label(self, index: int, class_index: int) -> str:
        """The label of ``class_index`` in output ``index``'s label file ("" when there is none)."""
        label = ctypes.c_char_p()
        lib().TRITONSERVER_InferenceResponseOutputClassificationLabel(
            self._read(), index, class_index, ctypes.byref(label)
        )
        return (label.value or b"").decode()

    # -- outputs as arrays ------------------------------------------------------------------------------
    def output_array(self, index: int, output: ResponseOutput | None = None) -> np.ndarray[Any, Any]:
        """Output ``index`` as a numpy array: the allocator's own array when it made one (no copy), else a copy.

        ``output``: what ``output(index)`` returned already, if the caller read it (not read again).
        """
        out = self.output(index) if output is None else output
        dtype = numpy_dtype(out.datatype)
        _check_size(out, dtype.itemsize)
        if out.byte_size == 0:
            return np.empty(out.shape, dtype=dtype)
        owner = out.buffer_user_object
        if isinstance(owner, np.ndarray) and owner.ctypes.data == out.base:
            return owner[: out.byte_size].view(dtype).reshape(out.shape)
        if out.memory_type is TRITONSERVER_MemoryType.GPU:
            raise UnsupportedError(f"output {out.name!r} is in GPU memory: read it with output_tensor()")
        raw = memoryview((ctypes.c_char * out.byte_size).from_address(out.base)).cast("B")
        copied: np.ndarray[Any, Any] = np.frombuffer(raw, dtype=dtype).reshape(out.shape).copy()
        return copied

    def output_tensor(self, index: int) -> torch.Tensor:
        """Output ``index`` as a torch tensor: the allocator's own tensor when it made one (no copy)."""
        import torch

        out = self.output(index)
        dtype = numpy_dtype(out.datatype)
        _check_size(out, dtype.itemsize)
        owner = out.buffer_user_object
        if isinstance(owner, torch.Tensor) and owner.data_ptr() == out.base and out.byte_size:
            return owner[: out.byte_size].view(_TORCH_DTYPES[dtype]).reshape(out.shape)
        return torch.from_numpy(self.output_array(index))

    def delete(self) -> None:
        """Delete the response now; raises the first exception a ``release_fn`` of its buffers raised."""
        self._ptr()
        errors = self._delete_collecting("delete() was called")
        if errors:
            raise errors[0]

    def _delete_now(self, because: str) -> None:
        """Dropped, or its server stopped: a ``release_fn`` exception goes to this response's inference."""
        for exc in self._delete_collecting(because):
            deliver_release_error(exc, self._flight)

    def _delete_collecting(self, because: str) -> list[BaseException]:
        with collect_release_errors() as errors:
            super()._delete_now(because)
        return errors


def _check_size(out: ResponseOutput, itemsize: int) -> None:
    expected = math.prod(out.shape) * itemsize
    if expected != out.byte_size:
        raise InternalError(
            f"output {out.name!r}: {out.byte_size} bytes do not hold shape {list(out.shape)} of "
            f"{out.datatype.name} ({expected} bytes expected)"
        )


def _torch_dtypes() -> dict[np.dtype[Any], Any]:
    import torch

    return {
        np.dtype(np.bool_): torch.bool,
        np.dtype(np.uint8): torch.uint8,
        np.dtype(np.uint16): torch.uint16,
        np.dtype(np.uint32): torch.uint32,
        np.dtype(np.uint64): torch.uint64,
        np.dtype(np.int8): torch.int8,
        np.dtype(np.int16): torch.int16,
        np.dtype(np.int32): torch.int32,
        np.dtype(np.int64): torch.int64,
        np.dtype(np.float16): torch.float16,
        np.dtype(np.float32): torch.float32,
        np.dtype(np.float64): torch.float64,
    }


class _LazyTorchDtypes(dict[np.dtype[Any], Any]):
    def __missing__(self, key: np.dtype[Any]) -> Any:
        self.update(_torch_dtypes())
        return dict.__getitem__(self, key)


_TORCH_DTYPES = _LazyTorchDtypes()
