"""An inference request over HTTP as the bytes on the wire, and its response read back from them.

The Open Inference Protocol's HTTP body, with Triton's binary tensor extension: a JSON header, then each body
tensor's bytes in input order, the header's length in the ``Inference-Header-Content-Length`` header; or the
JSON alone (tensors in its ``data``, or in shared memory, or a server that takes no binary tensors), which then
says so with ``Content-Type: application/json`` (a FastAPI server, KServe's since FastAPI 0.132, reads a body
without that type as bytes, and then refuses it for want of the binary header). The JSON is the one
tritonclient's HTTP client writes for the same request (``tests/backends/remote/test_wire.py`` compares the
bodies byte for byte), but a tensor's bytes are the caller's array itself (``codec.tensor_bytes``), so the
body is joined with one copy of each tensor where tritonclient makes two (``tobytes``, then the join).

A response has the same shape: its JSON header (the whole body when no binary output follows), then each
output whose ``parameters`` carry a ``binary_data_size``, in the order of the header's outputs. A binary output
is read as a view of the body (``codec.decode``), a JSON one from its ``data``.

    body, headers = request_body(inputs, outputs, parameters, binary=True)
    result = HttpResult(response_body, header_length)   # header_length: the response's own header, or None
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import numpy as np

from ..status import CallError, Status
from .base import ShmRef, WireInput, WireOutput, WireResult, refuse_reserved
from .codec import decode, tensor_bytes

#: The header that gives the length of a body's JSON part when tensors' bytes follow it.
HEADER_LENGTH = "Inference-Header-Content-Length"
#: The type of a body that is JSON only.
JSON_TYPE = "application/json"


def infer_path(model: str, version: str) -> str:
    """The request target of an inference request (``/v2/models/NAME[/versions/V]/infer``, the name quoted)."""
    name = quote(model)
    return f"/v2/models/{name}/versions/{version}/infer" if version else f"/v2/models/{name}/infer"


def request_body(
    inputs: Sequence[WireInput],
    outputs: Sequence[WireOutput],
    parameters: Mapping[str, str | int | bool] | None,
    *,
    binary: bool,
) -> tuple[bytes, dict[str, str]]:
    """The request body and the headers that describe it (see the module docstring); ``binary``: whether the
    server takes binary tensors (inputs in the body, outputs asked for in binary)."""
    tensors: list[Any] = []
    described = [_input(spec, tensors if binary else None) for spec in inputs]
    request: dict[str, Any] = {"inputs": described}
    extra: dict[str, Any] = {}
    if outputs:
        request["outputs"] = [_output(out, binary) for out in outputs]
    else:
        extra["binary_data_output"] = binary  # every output, as the body carries tensors
    for key, value in (parameters or {}).items():
        refuse_reserved(key)
        extra[key] = value
    if extra:
        request["parameters"] = extra
    try:
        head = json.dumps(request, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:  # NaN or infinity in a JSON tensor
        raise CallError(
            Status.INVALID_ARGUMENT, f"an input holds a value JSON cannot carry ({exc}); this server takes JSON tensors"
        ) from None
    if not tensors:
        return head, {"Content-Type": JSON_TYPE}
    return b"".join([head, *tensors]), {HEADER_LENGTH: str(len(head))}


def _input(spec: WireInput, tensors: list[Any] | None) -> dict[str, Any]:
    """One input's JSON; its bytes appended to ``tensors`` when it travels binary (``tensors`` given)."""
    tensor: dict[str, Any] = {"name": spec.name, "shape": list(spec.shape), "datatype": spec.datatype}
    if spec.shm is not None:
        tensor["parameters"] = _place(spec.shm)
    elif spec.data is not None and tensors is not None:
        data = tensor_bytes(spec.data, spec.datatype)
        tensors.append(data)
        tensor["parameters"] = {"binary_data_size": memoryview(data).nbytes}
    elif spec.data is not None:
        tensor["data"] = _json_data(spec.name, spec.datatype, spec.data)
    return tensor


def _output(out: WireOutput, binary: bool) -> dict[str, Any]:
    if out.shm is None:
        return {"name": out.name, "parameters": {"binary_data": binary}}
    return {"name": out.name, "parameters": {"binary_data": False, **_place(out.shm)}}


def _place(ref: ShmRef) -> dict[str, Any]:
    """A tensor's place in a registered region (no offset when it is 0, as tritonclient writes it)."""
    place: dict[str, Any] = {"shared_memory_region": ref.region, "shared_memory_byte_size": ref.byte_size}
    if ref.offset != 0:
        place["shared_memory_offset"] = ref.offset
    return place


def _json_data(name: str, datatype: str, array: np.ndarray) -> list[Any]:
    """A tensor as a JSON ``data`` list, flat in row-major order (BYTES elements as UTF-8 text)."""
    if datatype == "BF16":
        raise CallError(
            Status.INVALID_ARGUMENT,
            f"input {name!r} is BF16, which travels over HTTP as a binary tensor only, and this server takes JSON "
            "tensors only; use grpc:// for it",
        )
    flat = array.reshape(-1)
    if datatype != "BYTES":
        return list(flat.tolist())
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat.tolist()]
    except UnicodeDecodeError:
        raise CallError(
            Status.INVALID_ARGUMENT,
            f"input {name!r} holds bytes that are not UTF-8 text, which a JSON tensor cannot carry (this server "
            "takes JSON tensors only)",
        ) from None


def decoded(body: Any, content_encoding: str | None) -> Any:
    """A response body as sent, its ``Content-Encoding`` (gzip, deflate) undone."""
    if content_encoding in (None, "", "identity"):
        return body
    if content_encoding == "gzip":
        return gzip.decompress(body)
    if content_encoding == "deflate":
        return zlib.decompress(body)
    raise CallError(Status.INTERNAL, f"the response is encoded as {content_encoding!r}, which this client cannot read")


class HttpResult(WireResult):
    """A response body: its JSON header parsed, its binary outputs found (read when asked for)."""

    def __init__(self, body: bytes | bytearray, header_length: int | None) -> None:
        self._body = memoryview(body)
        end = len(self._body) if header_length is None else header_length
        if not 0 <= end <= len(self._body):
            raise CallError(
                Status.INTERNAL, f"the response says its header is {end} bytes long; the body has {len(self._body)}"
            )
        header = json.loads(self._body[:end].tobytes() if end < len(self._body) else body)
        self._outputs: dict[str, Mapping[str, Any]] = {str(o["name"]): o for o in header.get("outputs") or []}
        self._places: dict[str, tuple[int, int]] = {}
        offset = end
        for name, output in self._outputs.items():
            size = (output.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                self._places[name] = (offset, int(size))
                offset += int(size)
        if offset > len(self._body):
            raise CallError(
                Status.INTERNAL,
                f"the response's binary outputs take {offset - end} bytes after its header; it has "
                f"{len(self._body) - end}",
            )

    def _output(self, name: str) -> Mapping[str, Any]:
        output = self._outputs.get(name)
        if output is None:
            raise CallError(Status.INTERNAL, f"the response has no output {name!r}; it has {sorted(self._outputs)}")
        return output

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._output(name)["shape"])

    def datatype(self, name: str) -> str:
        return str(self._output(name)["datatype"])

    def array(self, name: str) -> np.ndarray:
        output, datatype, shape = self._output(name), self.datatype(name), self.shape(name)
        place = self._places.get(name)
        if place is not None:
            start, size = place
            data = self._body[start : start + size]
            return decode(data.tobytes() if datatype == "BYTES" else data, datatype, shape)
        if "data" not in output:
            raise CallError(Status.INTERNAL, f"the response carries no data for output {name!r}")
        return _from_json(output["data"], datatype).reshape(shape)


def _from_json(data: list[Any], datatype: str) -> np.ndarray:
    """A JSON ``data`` list as this package's dtype for ``datatype`` (BF16: the top 16 bits of each float32)."""
    if datatype == "BF16":
        return (np.asarray(data, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    from ...signature import dtype_to_numpy  # here: signature imports torch, which a control call never needs

    return np.asarray(data, dtype=dtype_to_numpy(datatype))
