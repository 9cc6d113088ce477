"""One attempt (``exchange.py``): the slot or the body, the call, and the outputs, with requests from many threads.

The exchange writes inputs into real shared memory slots (``shm/pool.py``) that the in-memory stand-in for a server
(``memory.py``) reads by key, and the stand-in writes outputs back into them; a ``threading.Barrier`` in the
stand-in holds every request of a round on the server at once, so their slots are all in use together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from monai_triton_ops.backends.arrays import ArrayFamily
from monai_triton_ops.backends.base import InferRequest
from monai_triton_ops.backends.remote.exchange import Exchange
from monai_triton_ops.backends.remote.shm.pool import RegionPool
from monai_triton_ops.backends.remote.shm.region import SHM_DIR
from monai_triton_ops.client.status import CallError, Status
from monai_triton_ops.signature import ModelSignature, TensorSpec

from .memory import MemoryServer, MemoryTransport, Received

WAIT_S = 30.0  # a bound on waits for another thread, never reached when the code is right
SIGNATURE = ModelSignature(
    name="m",
    inputs=(TensorSpec(name="x", dtype="FP32", shape=(-1,)),),
    outputs=(TensorSpec(name="y", dtype="FP32", shape=(-1,)),),
)


def request(x: np.ndarray, *, timeout_s: float = WAIT_S) -> InferRequest:
    return InferRequest(
        model="m", inputs={"x": x}, outputs=("y",), family=ArrayFamily("numpy"), deadline=time.monotonic() + timeout_s
    )


@pytest.fixture
def pool(transport: MemoryTransport, server: MemoryServer) -> Iterator[RegionPool]:
    regions = RegionPool(transport, max_slots=16)
    yield regions
    regions.close(time.monotonic() + 5.0)
    assert not server.registered(), "a region is still registered on the server"


@pytest.fixture
def exchange(pool: RegionPool) -> Exchange:
    return Exchange(SIGNATURE, "1", pool, fallback=False)


def slot_of(received: Received) -> str | None:
    ref = received.inputs[0].shm
    return None if ref is None else ref.region


@pytest.mark.usefixtures("busy_switching")
def test_requests_in_flight_together_each_have_their_own_slot_and_get_their_own_answer(
    exchange: Exchange, transport: MemoryTransport, server: MemoryServer
) -> None:
    threads, rounds = 6, 8
    together = threading.Barrier(threads)
    in_round: list[list[str | None]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def before(received: Received) -> None:
        index = int(received.parameters["round"]) if received.parameters else -1
        with lock:
            in_round[index].append(slot_of(received))
        together.wait(WAIT_S)  # every request of the round is on the server now

    server.before = before
    wrong: list[str] = []

    def requests(me: int) -> None:
        for n in range(rounds):
            x = np.arange(1000, dtype=np.float32) + 1000 * me + n
            outputs = exchange.send(transport, _with_round(request(x), n))
            if not np.array_equal(outputs["y"], 2 * x):
                wrong.append(f"request {me} round {n}")
            del outputs  # the caller drops its outputs: a leased slot comes back

    workers = [threading.Thread(target=requests, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S)
    assert not wrong
    for slots in in_round:
        assert len(slots) == threads
        assert None not in slots  # every request went through shared memory
        assert len(set(slots)) == threads, f"two requests in flight together shared a slot: {slots}"
    later = [r for r in server.received if r.parameters and int(r.parameters["round"]) > 0]
    assert all(r.outputs[0].shm is not None for r in later)  # once the size was known, outputs came in the slot


def _with_round(req: InferRequest, n: int) -> InferRequest:
    return InferRequest(
        model=req.model,
        inputs=req.inputs,
        outputs=req.outputs,
        family=req.family,
        deadline=req.deadline,
        parameters={"round": n},
    )


def test_outputs_in_the_slot_are_views_that_keep_it_until_dropped(
    exchange: Exchange, transport: MemoryTransport, server: MemoryServer
) -> None:
    x = np.arange(16, dtype=np.float32)
    first = exchange.send(transport, request(x))["y"]  # the output's size is learned from this response
    kept = exchange.send(transport, request(x))["y"]
    body, slot = server.received
    assert body.outputs[0].shm is None
    assert slot.outputs[0].shm is not None
    in_slot = slot_of(slot)
    assert np.array_equal(first, 2 * x)
    assert np.array_equal(kept, 2 * x)
    exchange.send(transport, request(x))
    assert slot_of(server.received[-1]) != in_slot  # the caller still has an array on that slot
    del kept
    exchange.send(transport, request(x))
    exchange.send(transport, request(x))
    assert in_slot in {slot_of(r) for r in server.received[-2:]}  # back in use once dropped


def test_a_request_cut_off_on_the_server_leaves_its_slot_out_of_use_until_the_server_lets_go(
    exchange: Exchange, transport: MemoryTransport, server: MemoryServer
) -> None:
    x = np.ones(8, dtype=np.float32)
    exchange.send(transport, request(x))
    used = slot_of(server.received[-1])
    assert used is not None

    def deadline(received: Received) -> None:
        server.hold(used)  # the server still runs the request the client stopped waiting for
        raise CallError(Status.DEADLINE, "deadline exceeded")

    server.before = deadline
    with pytest.raises(CallError) as caught:
        exchange.send(transport, request(x))
    assert caught.value.status is Status.DEADLINE
    server.before = None
    for _ in range(5):
        exchange.send(transport, request(x))
    assert used not in {slot_of(r) for r in server.received[-5:]}
    assert used in server.registered()
    assert (SHM_DIR / used).exists()
    server.let_go(used)


def test_a_request_the_server_refused_gives_its_slot_to_the_next_request(
    exchange: Exchange, transport: MemoryTransport, server: MemoryServer
) -> None:
    x = np.ones(8, dtype=np.float32)

    def refuse(received: Received) -> None:
        raise CallError(Status.INVALID_ARGUMENT, "unexpected shape for input 'x'")

    server.before = refuse
    with pytest.raises(CallError):
        exchange.send(transport, request(x))
    refused = slot_of(server.received[-1])
    server.before = None
    exchange.send(transport, request(x))
    assert slot_of(server.received[-1]) == refused  # the server answered: nothing of it still uses the region


def test_an_output_that_outgrew_its_place_is_fetched_again_in_the_body_within_the_same_attempt(
    transport: MemoryTransport, server: MemoryServer, pool: RegionPool
) -> None:
    exchange = Exchange(SIGNATURE, "1", pool, fallback=False)
    repeat = [1]
    server.model = lambda inputs: {"y": np.tile(inputs["x"] * 2, repeat[0])}
    x = np.arange(8, dtype=np.float32)
    exchange.send(transport, request(x))
    exchange.send(transport, request(x))  # the output has its place in the slot now
    repeat[0] = 3  # the same input shapes, a larger output (a model whose output depends on the values)
    before = len(server.received)
    outputs = exchange.send(transport, request(x))
    assert np.array_equal(outputs["y"], np.tile(2 * x, 3))
    sent = server.received[before:]
    assert [r.outputs[0].shm is not None for r in sent] == [True, False]  # in the slot, refused; then in the body
    exchange.send(transport, request(x))
    grown = server.received[-1].outputs[0].shm
    assert grown is not None
    assert grown.byte_size >= 3 * x.nbytes


def test_with_every_slot_taken_a_request_goes_in_the_body(transport: MemoryTransport, server: MemoryServer) -> None:
    pool = RegionPool(transport, max_slots=1)
    exchange = Exchange(SIGNATURE, "1", pool, fallback=False)
    arrived, go_on = threading.Event(), threading.Event()

    def hold_the_slot(received: Received) -> None:
        if slot_of(received) is not None:
            arrived.set()
            go_on.wait(WAIT_S)

    server.before = hold_the_slot
    first: list[np.ndarray] = []
    x = np.arange(8, dtype=np.float32)
    sender = threading.Thread(target=lambda: first.append(exchange.send(transport, request(x))["y"].copy()))
    sender.start()
    try:
        assert arrived.wait(WAIT_S)  # the one slot is in use on the server
        outputs = exchange.send(transport, request(x + 1))
        assert slot_of(server.received[-1]) is None
        assert np.array_equal(outputs["y"], 2 * (x + 1))
    finally:
        go_on.set()
        sender.join(WAIT_S)
        pool.close(time.monotonic() + 5.0)
    assert np.array_equal(first[0], 2 * x)


def test_a_request_whose_deadline_has_passed_is_not_sent(exchange: Exchange, transport: MemoryTransport) -> None:
    x = np.ones(4, dtype=np.float32)
    exchange.send(transport, request(x))  # a slot is ready: nothing on the way needs the server
    with pytest.raises(CallError) as caught:
        exchange.send(transport, request(x, timeout_s=-1.0))
    assert caught.value.status is Status.DEADLINE
    assert len(transport.server.received) == 1
