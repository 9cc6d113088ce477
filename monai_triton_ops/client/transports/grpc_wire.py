"""An inference request over gRPC as the bytes on the wire, its tensors written without protobuf's serializer.

tritonclient builds a ``ModelInferRequest`` with each tensor copied in (``tobytes``, then into the message) and
serializes it with upb's ``SerializeToString``, which took 19 ms for one 8 MB tensor here (a plain copy of it:
0.7 ms), the larger part of the client's CPU for such a request. Here the message is serialized without its
tensors (a few hundred bytes, kept per slot and layout when every tensor is in shared memory: ``base.Heads``),
and each tensor follows as one ``raw_input_contents`` field written out by hand: its tag, its length and the
array's own bytes, joined once into the message. A protobuf message is the concatenation of its fields, in any
order, a repeated field one entry per field (the protobuf encoding guide: "Last One Wins" / "Repeated
Elements"), so the server reads the same request tritonclient would have sent.

    head = request_head(model, version, inputs, outputs, parameters)
    body = serialize((head, [tensor_bytes(spec.data, spec.datatype) for spec in body_inputs]))  # the serializer
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tritonclient.grpc import service_pb2

from .base import ShmRef, WireInput, WireOutput, refuse_reserved

#: The method every inference request calls (the service's ``ModelInfer``).
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_FIELD = service_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
_TAG = bytes([_FIELD << 3 | 2])  # wire type 2: length-delimited
#: A request: its message without tensors, serialized, and the tensors' bytes in input order.
Request = tuple[bytes, Sequence[Any]]


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def serialize(request: Request) -> bytes:
    """The request message: its head, then one ``raw_input_contents`` field per tensor (a bytes-like each)."""
    head, tensors = request
    if not tensors:
        return head
    parts: list[Any] = [head]
    for data in tensors:
        parts += (_TAG, varint(memoryview(data).nbytes), data)
    return b"".join(parts)


def request_head(
    model: str,
    version: str,
    inputs: Sequence[WireInput],
    outputs: Sequence[WireOutput],
    parameters: Mapping[str, str | int | bool] | None,
) -> bytes:
    """The ``ModelInferRequest`` without its tensors' bytes, serialized (what tritonclient's request holds besides)."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for spec in inputs:
        tensor = request.inputs.add(name=spec.name, datatype=spec.datatype, shape=spec.shape)
        if spec.shm is not None:
            _place(tensor.parameters, spec.shm)
    for out in outputs:
        output = request.outputs.add(name=out.name)
        if out.shm is not None:
            _place(output.parameters, out.shm)
    for key, value in (parameters or {}).items():
        refuse_reserved(key)
        if isinstance(value, bool):  # before int: a bool is an int
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = str(value)
    return bytes(request.SerializeToString())


def _place(parameters: Any, ref: ShmRef) -> None:
    """A tensor's place in a registered region, as tritonclient's ``set_shared_memory`` writes it."""
    parameters["shared_memory_region"].string_param = ref.region
    parameters["shared_memory_byte_size"].int64_param = ref.byte_size
    if ref.offset != 0:
        parameters["shared_memory_offset"].int64_param = ref.offset
