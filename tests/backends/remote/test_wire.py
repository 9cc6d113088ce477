"""The request bodies the transports write without tritonclient's copies are the ones tritonclient would send.

gRPC: the message ``grpc_wire.py`` writes by hand (its head serialized by protobuf, each tensor appended as one
``raw_input_contents`` field) is read back by protobuf's own parser, field for field what the request says,
across the varint lengths' byte boundaries. HTTP: a body built from the transport's input class, which hands
tritonclient the caller's array instead of a copy of it, is byte for byte the body of tritonclient's own class
(``generate_request_body``, tritonclient's public way to build one). The servers' side of both is covered by every
remote test over a real server (``test_models.py``: every dtype, BYTES, both protocols).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from monai_triton_ops.backends.remote.transports.base import RequestBuilder, ShmRef, WireInput, WireOutput
from monai_triton_ops.backends.remote.transports.grpc_wire import Heads, request_head, serialize, tensor_bytes
from monai_triton_ops.backends.remote.transports.http import HttpTransport
from monai_triton_ops.backends.status import CallError, Status


def _body_inputs(floats: int) -> list[WireInput]:
    x = np.arange(floats, dtype=np.float32).reshape(1, floats)
    text = np.array([b"", b"a\x00b", "é".encode()], dtype=np.object_)
    flags = np.array([[True, False, True]])
    return [
        WireInput("X", "FP32", x.shape, data=x),
        WireInput("TEXT", "BYTES", text.shape, data=text),
        WireInput("FLAGS", "BOOL", flags.shape, data=flags),
    ]


# 0 bytes, then lengths on either side of the 1- and 2-byte varints (127/128, 16383/16384 bytes) and a large one
@pytest.mark.parametrize("floats", [0, 31, 32, 4095, 4096, 1 << 20])
def test_a_grpc_request_written_by_hand_is_read_back_by_protobuf_as_the_request(floats: int) -> None:
    inputs = _body_inputs(floats)
    outputs = [WireOutput("Y"), WireOutput("Z", shm=ShmRef("region_b", 64, 128))]
    head = request_head("model", "3", inputs, outputs, {"mode": "fast", "steps": 4, "exact": True})
    wire = serialize((head, [tensor_bytes(spec) for spec in inputs]))
    request = service_pb2.ModelInferRequest.FromString(wire)
    assert (request.model_name, request.model_version) == ("model", "3")
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        (spec.name, spec.datatype, list(spec.shape)) for spec in inputs
    ]
    x, text, flags = (spec.data for spec in inputs)
    assert list(request.raw_input_contents) == [
        np.asarray(x).tobytes(),
        serialize_byte_tensor(text).item(),
        np.asarray(flags).tobytes(),
    ]
    assert [o.name for o in request.outputs] == ["Y", "Z"]
    placed = request.outputs[1].parameters
    assert placed["shared_memory_region"].string_param == "region_b"
    assert (placed["shared_memory_byte_size"].int64_param, placed["shared_memory_offset"].int64_param) == (64, 128)
    parameters = request.parameters
    assert parameters["mode"].string_param == "fast"
    assert parameters["steps"].int64_param == 4
    assert parameters["exact"].bool_param is True


def test_a_shared_memory_request_head_is_kept_per_slot_and_parameters() -> None:
    inputs = (WireInput("X", "FP32", (1, 4), shm=ShmRef("region_a", 16, 0)),)
    outputs = (WireOutput("Y", shm=ShmRef("region_a", 16, 64)),)
    heads = Heads()
    first = heads.get("model", "", inputs, outputs, None)
    assert heads.get("model", "", inputs, outputs, None) is first
    with_parameter = heads.get("model", "", inputs, outputs, {"network_version": "2"})
    assert service_pb2.ModelInferRequest.FromString(with_parameter).parameters["network_version"].string_param == "2"
    request = service_pb2.ModelInferRequest.FromString(first)
    assert not request.raw_input_contents
    assert request.inputs[0].parameters["shared_memory_region"].string_param == "region_a"
    assert "shared_memory_offset" not in request.inputs[0].parameters  # as tritonclient writes an offset of 0


def test_a_parameter_reserved_for_triton_is_refused_by_name() -> None:
    with pytest.raises(CallError, match="'priority' is reserved") as caught:
        request_head("model", "", [], [WireOutput("Y")], {"priority": 1})
    assert caught.value.status is Status.INVALID_ARGUMENT


def test_an_http_body_built_from_the_callers_array_is_tritonclients_body() -> None:
    inputs = _body_inputs(4096)
    outputs = [WireOutput("Y")]
    ours = RequestBuilder(HttpTransport.request_classes, binary={"binary_data": True}).build(inputs, outputs)
    theirs = RequestBuilder(httpclient, binary={"binary_data": True}).build(inputs, outputs)
    assert httpclient.InferenceServerClient.generate_request_body(
        ours[0], outputs=ours[1]
    ) == httpclient.InferenceServerClient.generate_request_body(theirs[0], outputs=theirs[1])
