"""What goes on the wire for one request: the exchange's wire tensors (``exchange.py``), and the kept heads of
shared memory requests (``transports/base.py``: ``Heads``) under many threads.

The exchange's side is read from the in-memory stand-in for a server (``memory.py``), which records what each
request carried. The bytes each protocol writes are checked against tritonclient's own encoding in
``tests/backends/remote/test_wire.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch
from tritonclient.grpc import service_pb2

from monai_triton_ops.backends.arrays import ArrayFamily
from monai_triton_ops.backends.base import InferRequest
from monai_triton_ops.backends.remote.exchange import Exchange
from monai_triton_ops.backends.remote.shm.pool import RegionPool
from monai_triton_ops.client.transports.base import Heads, ShmRef, WireInput, WireOutput
from monai_triton_ops.client.transports.grpc_wire import request_head
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


def test_the_head_of_a_shared_memory_request_is_kept_by_identity_and_a_body_requests_never() -> None:
    heads = Heads(request_head)
    inputs = (WireInput("x", "INT64", (4,), shm=ShmRef("region_a", 32, 0)),)
    outputs = (WireOutput("y", shm=ShmRef("region_a", 32, 64)),)
    first = heads.get("m", "1", inputs, outputs, None)
    assert heads.get("m", "1", inputs, outputs, None) is first  # the same slot and layout: the same head
    other_outputs = (WireOutput("y"),)
    rebuilt = heads.get("m", "1", inputs, other_outputs, None)
    assert rebuilt is not first
    assert not service_pb2.ModelInferRequest.FromString(rebuilt).outputs[0].parameters  # the outputs asked for now
    equal = tuple(WireInput(i.name, i.datatype, i.shape, shm=i.shm) for i in inputs)
    assert heads.get("m", "1", equal, outputs, None) is not first  # equal but not the same: found by identity only
    body = (WireInput("x", "INT64", (4,), data=np.arange(4)),)
    assert heads.get("m", "1", body, (), None) is not heads.get("m", "1", body, (), None)  # never kept


@pytest.mark.usefixtures("busy_switching")
def test_many_threads_writing_heads_at_once_each_get_the_head_of_their_own_request() -> None:
    """Over gRPC every thread shares one transport's heads; the cache is cleared when full (256 heads), so ids of
    freed spec tuples come back: a request must never get another request's head."""
    heads = Heads(request_head)
    start = threading.Barrier(8)
    wrong: list[str] = []

    def requests(me: int) -> None:
        start.wait(WAIT_S)
        for n in range(200):
            region = f"r{me}_{n}"
            inputs = (WireInput("x", "INT64", (4,), shm=ShmRef(region, 32, 0)),)
            outputs = (WireOutput("y", shm=ShmRef(region, 32, 64)),)
            for _ in range(2):
                message = service_pb2.ModelInferRequest.FromString(heads.get("m", "1", inputs, outputs, None))
                got = (
                    message.inputs[0].parameters["shared_memory_region"].string_param,
                    message.outputs[0].parameters["shared_memory_region"].string_param,
                )
                if got != (region, region):
                    wrong.append(f"{region} got {got}")

    threads = [threading.Thread(target=requests, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not wrong
