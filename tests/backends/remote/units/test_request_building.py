"""What goes on the wire for one request: the exchange's wire tensors (``exchange.py``) and the tritonclient
objects built from them for gRPC and HTTP (``transports/base.py``: ``build_request``, ``RequestBuilder``).

The exchange's side is read from the in-memory stand-in for a server (``memory.py``), which records what each
request carried; the protocol's side is tritonclient's own request encoding (the message or body its ``infer``
sends), made without a connection.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.grpc._utils as grpc_wire
import tritonclient.http as httpclient
import tritonclient.http._utils as http_wire

from monai_triton_ops.backends.arrays import ArrayFamily
from monai_triton_ops.backends.base import InferRequest
from monai_triton_ops.backends.remote.exchange import Exchange
from monai_triton_ops.backends.remote.shm.pool import RegionPool
from monai_triton_ops.backends.remote.transports.base import (
    RequestBuilder,
    ShmRef,
    WireInput,
    WireOutput,
    build_request,
)
from monai_triton_ops.signature import ModelSignature, TensorSpec

from .memory import MemoryServer, MemoryTransport

WAIT_S = 30.0  # a bound on waits for another thread, never reached when the code is right
PARAMETERS = {"a": 1, "b": "y", "c": True}


def spec(name: str, dtype: str, *shape: int) -> TensorSpec:
    return TensorSpec(name=name, dtype=dtype, shape=shape)


TWO = ModelSignature(
    name="two",
    inputs=(spec("image", "FP32", 2, -1), spec("offset", "INT64", 1)),
    outputs=(spec("doubled", "FP32", 2, -1), spec("positive", "BOOL", 2, -1)),
)
TEXT = ModelSignature(
    name="text",
    inputs=(spec("x", "FP32", -1), spec("words", "BYTES", -1)),
    outputs=(spec("y", "FP32", -1), spec("echo", "BYTES", -1)),
)


def two(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    shifted = inputs["image"] + inputs["offset"].astype(np.float32)
    return {"doubled": shifted * 2, "positive": shifted > 0}


def text(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    words = inputs.get("words", np.array([b"none"], dtype=object))
    return {"y": inputs["x"] * 2, "echo": np.array([w + b"!" for w in words], dtype=object)}


def request(
    model: str, inputs: Mapping[str, Any], outputs: tuple[str, ...], parameters: Mapping[str, Any] | None = None
) -> InferRequest:
    return InferRequest(
        model=model,
        inputs=inputs,
        outputs=outputs,
        family=ArrayFamily("numpy"),
        deadline=time.monotonic() + WAIT_S,
        parameters=parameters or {},
    )


@pytest.fixture
def pool(transport: MemoryTransport, server: MemoryServer) -> Iterator[RegionPool]:
    regions = RegionPool(transport, max_slots=8)
    yield regions
    regions.close(time.monotonic() + 5.0)
    assert not server.registered()


def test_a_body_request_carries_each_inputs_name_datatype_shape_and_bytes_and_only_the_outputs_asked_for(
    transport: MemoryTransport, server: MemoryServer
) -> None:
    server.model = two
    exchange = Exchange(TWO, "3", None, fallback=False)
    image = torch.arange(10, dtype=torch.float32).reshape(5, 2).T  # torch, and not contiguous
    outputs = exchange.send(transport, request("two", {"image": image, "offset": np.array([1])}, ("positive",)))
    (sent,) = server.received
    assert (sent.model, sent.version) == ("two", "3")
    assert [(i.name, i.datatype, i.shape, i.shm) for i in sent.inputs] == [
        ("image", "FP32", (2, 5), None),
        ("offset", "INT64", (1,), None),
    ]
    data = sent.inputs[0].data
    assert data is not None
    assert data.flags.c_contiguous
    assert np.array_equal(data, image.numpy())
    assert [o.name for o in sent.outputs] == ["positive"]
    assert list(outputs) == ["positive"]
    assert outputs["positive"].dtype == np.bool_
    assert 0 < sent.timeout_s <= WAIT_S  # the time the request has left


def test_request_parameters_win_over_the_backends_and_none_are_sent_when_there_are_none(
    transport: MemoryTransport, server: MemoryServer
) -> None:
    server.model = two
    inputs = {"image": np.ones((2, 3), np.float32), "offset": np.array([0])}
    exchange = Exchange(TWO, "1", None, fallback=False, parameters={"a": 1, "b": "x"})
    exchange.send(transport, request("two", inputs, ("doubled",), {"b": "y", "c": True}))
    assert server.received[-1].parameters == PARAMETERS
    bare = Exchange(TWO, "1", None, fallback=False)
    bare.send(transport, request("two", inputs, ("doubled",)))
    assert server.received[-1].parameters is None


def test_bytes_travel_in_the_body_even_with_shared_memory(
    transport: MemoryTransport, server: MemoryServer, pool: RegionPool
) -> None:
    """A BYTES tensor's size depends on its values: a BYTES input sends the whole request in the body, and a BYTES
    output is never given a place in the slot, while the other outputs are once their size is known."""
    server.model = text
    exchange = Exchange(TEXT, "1", pool, fallback=False)
    x = np.arange(4, dtype=np.float32)
    for _ in range(2):
        outputs = exchange.send(transport, request("text", {"x": x}, ("y", "echo")))
    numbers, echo = server.received[-1].outputs
    assert numbers.shm is not None  # learned from the first response
    assert echo.shm is None
    assert list(outputs["echo"]) == [b"none!"]
    exchange.send(transport, request("text", {"x": x, "words": np.array([b"ab", b"c"], dtype=object)}, ("echo",)))
    sent = server.received[-1]
    assert [(i.name, i.datatype, i.shm) for i in sent.inputs] == [("x", "FP32", None), ("words", "BYTES", None)]


def wire_tensors() -> tuple[list[WireInput], list[WireOutput]]:
    inputs = [
        WireInput("image", "FP32", (2, 3), data=np.arange(6, dtype=np.float32).reshape(2, 3)),
        WireInput("x", "INT64", (4,), shm=ShmRef("region_a", 32, 64)),
        WireInput("text", "BYTES", (2,), data=np.array([b"ab", b"c"], dtype=object)),
    ]
    return inputs, [WireOutput("y"), WireOutput("z", shm=ShmRef("region_a", 128, 128))]


def test_the_grpc_message_has_the_version_the_tensors_their_shared_memory_places_and_the_parameters() -> None:
    inputs, outputs = wire_tensors()
    tensors, requested = build_request(grpcclient, inputs, outputs, binary={})
    message = grpc_wire._get_inference_request(
        model_name="m",
        inputs=tensors,
        model_version="3",
        request_id="",
        outputs=requested,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=PARAMETERS,
    )
    assert (message.model_name, message.model_version) == ("m", "3")
    assert [(i.name, i.datatype, list(i.shape)) for i in message.inputs] == [
        ("image", "FP32", [2, 3]),
        ("x", "INT64", [4]),
        ("text", "BYTES", [2]),
    ]
    place = message.inputs[1].parameters
    assert place["shared_memory_region"].string_param == "region_a"
    assert (place["shared_memory_byte_size"].int64_param, place["shared_memory_offset"].int64_param) == (32, 64)
    assert list(message.raw_input_contents) == [  # the body's tensors only, in order; BYTES length-prefixed
        np.arange(6, dtype=np.float32).tobytes(),
        b"\x02\x00\x00\x00ab\x01\x00\x00\x00c",
    ]
    assert [o.name for o in message.outputs] == ["y", "z"]
    assert not message.outputs[0].parameters
    assert message.outputs[1].parameters["shared_memory_offset"].int64_param == 128
    params = message.parameters
    assert (params["a"].int64_param, params["b"].string_param, params["c"].bool_param) == (1, "y", True)


@pytest.mark.parametrize("binary", [True, False])
def test_the_http_body_has_the_tensors_binary_or_json_their_shared_memory_places_and_the_parameters(
    binary: bool,
) -> None:
    inputs, outputs = wire_tensors()
    tensors, requested = build_request(httpclient, inputs, outputs, binary={"binary_data": binary})
    body, json_size = http_wire._get_inference_request(
        inputs=tensors,
        request_id="",
        outputs=requested,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        custom_parameters=PARAMETERS,
    )
    head = json.loads(body[:json_size] if json_size else body)
    image, x, words = head["inputs"]
    assert [(i["name"], i["datatype"], i["shape"]) for i in head["inputs"]] == [
        ("image", "FP32", [2, 3]),
        ("x", "INT64", [4]),
        ("text", "BYTES", [2]),
    ]
    assert x["parameters"] == {
        "shared_memory_region": "region_a",
        "shared_memory_byte_size": 32,
        "shared_memory_offset": 64,
    }
    assert "data" not in x
    y, z = head["outputs"]
    assert y == {"name": "y", "parameters": {"binary_data": binary}}
    assert z["parameters"]["shared_memory_region"] == "region_a"
    assert z["parameters"]["binary_data"] is False  # shared memory turns it off
    assert head["parameters"] == PARAMETERS
    if binary:
        assert (image["parameters"]["binary_data_size"], words["parameters"]["binary_data_size"]) == (24, 11)
        assert body[json_size:] == np.arange(6, dtype=np.float32).tobytes() + b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    else:  # a server without the binary tensor extension reads JSON
        assert (image["data"], words["data"]) == ([0, 1, 2, 3, 4, 5], ["ab", "c"])


def test_the_objects_of_a_shared_memory_request_are_kept_by_identity_and_a_body_requests_never() -> None:
    builder = RequestBuilder(grpcclient, binary={})
    inputs = (WireInput("x", "INT64", (4,), shm=ShmRef("region_a", 32, 0)),)
    outputs = (WireOutput("y", shm=ShmRef("region_a", 32, 64)),)
    first = builder.build(inputs, outputs)
    assert builder.build(inputs, outputs) is first  # the same slot and layout: the same objects
    other_outputs = (WireOutput("y"),)
    rebuilt = builder.build(inputs, other_outputs)
    assert rebuilt is not first
    assert not rebuilt[1][0]._get_tensor().parameters  # the outputs asked for now, not the kept ones
    equal = tuple(WireInput(i.name, i.datatype, i.shape, shm=i.shm) for i in inputs)
    assert builder.build(equal, outputs) is not first  # equal but not the same: found by identity only
    body = (WireInput("x", "INT64", (4,), data=np.arange(4)),)
    assert builder.build(body, ()) is not builder.build(body, ())  # a body request's objects hold its data


@pytest.mark.usefixtures("busy_switching")
def test_many_threads_building_requests_at_once_each_get_the_objects_of_their_own() -> None:
    """Over gRPC every thread shares one builder; its cache is cleared when full (256 requests), so ids of freed
    tensor lists come back: a request must never get another request's objects."""
    builder = RequestBuilder(grpcclient, binary={})
    start = threading.Barrier(8)
    wrong: list[str] = []

    def requests(me: int) -> None:
        start.wait(WAIT_S)
        for n in range(200):
            region = f"r{me}_{n}"
            inputs = (WireInput("x", "INT64", (4,), shm=ShmRef(region, 32, 0)),)
            outputs = (WireOutput("y", shm=ShmRef(region, 32, 64)),)
            for _ in range(2):
                tensors, requested = builder.build(inputs, outputs)
                got = (
                    tensors[0]._get_tensor().parameters["shared_memory_region"].string_param,
                    requested[0]._get_tensor().parameters["shared_memory_region"].string_param,
                )
                if got != (region, region):
                    wrong.append(f"{region} got {got}")

    threads = [threading.Thread(target=requests, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not wrong
