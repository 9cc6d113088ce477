"""The requests the transports write themselves are the ones tritonclient would send, and a response is read as
tritonclient reads it.

gRPC: the message ``grpc_wire.py`` writes by hand (its head serialized by protobuf, each tensor appended as one
``raw_input_contents`` field) is read back by protobuf's own parser, field for field what the request says,
across the varint lengths' byte boundaries. HTTP: the body ``http_wire.py`` writes from the caller's arrays is
byte for byte the body tritonclient builds from its own input and output objects (``generate_request_body``,
its public way to build one), binary or JSON, body tensors or shared memory; a response body is read by
``HttpResult`` as tritonclient's ``InferResult`` reads the same bytes (``from_response_body``, ``as_numpy``).
The servers' side of both is covered by every remote test over a real server (``test_models.py``: every
dtype, BYTES, both protocols; ``test_kserve.py``: a FastAPI server).
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from monai_triton_ops.client.status import CallError, Status
from monai_triton_ops.client.transports.base import Heads, ShmRef, WireInput, WireOutput
from monai_triton_ops.client.transports.codec import tensor_bytes
from monai_triton_ops.client.transports.grpc_wire import request_head, serialize
from monai_triton_ops.client.transports.http_wire import (
    HEADER_LENGTH,
    JSON_TYPE,
    HttpResult,
    decoded,
    infer_path,
    request_body,
)


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
    wire = serialize((head, [tensor_bytes(spec.data, spec.datatype) for spec in inputs if spec.data is not None]))
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
    heads = Heads(request_head)
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
    with pytest.raises(CallError, match="'triton_enable_empty_final_response' is reserved"):
        request_body([], [WireOutput("Y")], {"triton_enable_empty_final_response": True}, binary=True)


def _tritonclient_body(
    inputs: list[WireInput], outputs: list[WireOutput], parameters: dict[str, Any] | None, *, binary: bool
) -> tuple[bytes, int | None]:
    """What tritonclient's HTTP client sends for the same request (its own objects, its own body)."""
    tensors = []
    for spec in inputs:
        tensor = httpclient.InferInput(spec.name, list(spec.shape), spec.datatype)
        if spec.shm is not None:
            tensor.set_shared_memory(spec.shm.region, spec.shm.byte_size, spec.shm.offset)
        else:
            tensor.set_data_from_numpy(spec.data, binary_data=binary)
        tensors.append(tensor)
    requested = []
    for out in outputs:
        output = httpclient.InferRequestedOutput(out.name, binary_data=binary)
        if out.shm is not None:
            output.set_shared_memory(out.shm.region, out.shm.byte_size, out.shm.offset)
        requested.append(output)
    body, length = httpclient.InferenceServerClient.generate_request_body(
        tensors, outputs=requested, parameters=parameters
    )
    return bytes(body if isinstance(body, bytes) else body.encode()), length


PARAMETERS = {"mode": "fast", "steps": 4, "exact": True}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_an_http_body_written_from_the_callers_arrays_is_tritonclients_body(binary: bool) -> None:
    x = np.linspace(-2, 2, 4096, dtype=np.float32).reshape(1, 4096)
    text = np.array([b"", b"ab", "\u00e9".encode()], dtype=np.object_)
    flags = np.array([[True, False, True]])
    inputs = [
        WireInput("X", "FP32", x.shape, data=x),
        WireInput("TEXT", "BYTES", text.shape, data=text),
        WireInput("FLAGS", "BOOL", flags.shape, data=flags),
    ]
    outputs = [WireOutput("Y"), WireOutput("Z", shm=ShmRef("region_b", 64, 128))]
    body, headers = request_body(inputs, outputs, PARAMETERS, binary=binary)
    theirs, length = _tritonclient_body(inputs, outputs, PARAMETERS, binary=binary)
    if binary:
        assert body == theirs
    else:  # the same JSON; numbers may be spelled otherwise (1e-05 / 1E-5)
        assert json.loads(body) == json.loads(theirs)
    if binary:  # the header's length is sent; a JSON-only body says it is JSON (FastAPI servers need it)
        assert headers == {HEADER_LENGTH: str(length)}
    else:
        assert length is None
        assert headers == {"Content-Type": JSON_TYPE}


def test_a_shared_memory_request_over_http_is_tritonclients_json_and_its_body_is_kept() -> None:
    inputs = (WireInput("X", "FP32", (1, 4), shm=ShmRef("region_a", 16, 0)),)
    outputs = (WireOutput("Y", shm=ShmRef("region_a", 16, 64)),)
    body, headers = request_body(inputs, outputs, None, binary=True)
    assert (body, None) == _tritonclient_body(list(inputs), list(outputs), None, binary=True)
    assert headers == {"Content-Type": JSON_TYPE}
    heads = Heads(lambda _m, _v, i, o, p: request_body(i, o, p, binary=True))
    assert heads.get("model", "", inputs, outputs, None) is heads.get("model", "", inputs, outputs, None)


def test_an_http_request_goes_to_the_models_quoted_path() -> None:
    assert infer_path("seg model", "") == "/v2/models/seg%20model/infer"
    assert infer_path("seg", "3") == "/v2/models/seg/versions/3/infer"


def test_a_json_body_refuses_what_json_cannot_carry_by_name() -> None:
    bf16 = np.zeros((1, 2), dtype=np.uint16)
    with pytest.raises(CallError, match="input 'H' is BF16"):
        request_body([WireInput("H", "BF16", bf16.shape, data=bf16)], [], None, binary=False)
    latin = np.array([b"\xff"], dtype=np.object_)
    with pytest.raises(CallError, match="input 'T' holds bytes that are not UTF-8"):
        request_body([WireInput("T", "BYTES", latin.shape, data=latin)], [], None, binary=False)
    nan = np.array([np.nan], dtype=np.float32)
    with pytest.raises(CallError, match="JSON cannot carry") as caught:
        request_body([WireInput("N", "FP32", nan.shape, data=nan)], [], None, binary=False)
    assert caught.value.status is Status.INVALID_ARGUMENT


def _response(outputs: list[tuple[dict[str, Any], bytes | None]]) -> tuple[bytes, int | None]:
    """A response body as a server writes it: the JSON header, then each binary output's bytes."""
    header = json.dumps({"model_name": "m", "outputs": [o for o, _ in outputs]}).encode()
    binary = [data for _, data in outputs if data is not None]
    return header + b"".join(binary), (len(header) if binary else None)


def _binary(name: str, datatype: str, array: np.ndarray) -> tuple[dict[str, Any], bytes]:
    data = serialize_byte_tensor(array).item() if datatype == "BYTES" and array.size else array.tobytes()
    meta = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    return {**meta, "parameters": {"binary_data_size": len(data)}}, data


def test_a_response_is_read_as_tritonclient_reads_it() -> None:
    y = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    words = np.array([[b"a", b"", b"\x00\xff"]], dtype=np.object_)
    outputs = [
        _binary("Y", "FP32", y),
        _binary("EMPTY", "INT64", np.zeros((0, 3), dtype=np.int64)),
        _binary("WORDS", "BYTES", words),
        _binary("FLAGS", "BOOL", np.array([True, False])),
        ({"name": "J", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]}, None),
        ({"name": "S", "datatype": "BYTES", "shape": [2], "data": ["x", "yz"]}, None),
    ]
    body, length = _response(outputs)
    ours = HttpResult(bytearray(body), length)
    theirs = httpclient.InferResult.from_response_body(body, header_length=length)
    for output, _ in outputs:
        name = output["name"]
        assert (ours.shape(name), ours.datatype(name)) == (tuple(output["shape"]), output["datatype"])
        mine, expected = ours.array(name), theirs.as_numpy(name)
        assert (mine.dtype, mine.shape) == (expected.dtype, expected.shape)
        assert mine.tolist() == expected.tolist()
    received = bytearray(body)
    assert np.shares_memory(HttpResult(received, length).array("Y"), np.frombuffer(received, dtype=np.uint8))
    json_only, none = _response([outputs[4]])
    assert none is None
    assert HttpResult(json_only, None).array("J").tolist() == [[1, 2], [3, 4]]
    assert decoded(gzip.compress(body), "gzip") == body


def test_a_response_that_does_not_add_up_is_refused() -> None:
    body, length = _response([_binary("Y", "FP32", np.zeros(4, dtype=np.float32))])
    assert length is not None
    with pytest.raises(CallError, match="binary outputs take 16 bytes after its header; it has 15"):
        HttpResult(body[:-1], length)
    with pytest.raises(CallError, match="header is"):
        HttpResult(body, len(body) + 1)
    with pytest.raises(CallError, match="no output 'Z'; it has \\['Y'\\]") as caught:
        HttpResult(body, length).array("Z")
    assert caught.value.status is Status.INTERNAL
