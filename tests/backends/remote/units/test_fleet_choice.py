"""The fleet's choice of server (``fleet.py``, ``members.py``, ``health.py``): spread, skip, probe back, take/give back.

Each server is an in-memory stand-in (``memory.py``) behind the real transport interface; the fleet's own probing
thread and the process's deadline thread run for real. ``WatchedFleet`` says each time a probe has ended, with what
it left the server at, so a test waits for a probe instead of sleeping.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from monai_triton_ops.backends.remote import members as members_module
from monai_triton_ops.backends.remote.fleet import Fleet
from monai_triton_ops.backends.remote.health import Server, State
from monai_triton_ops.backends.remote.options import RemoteOptions
from monai_triton_ops.backends.remote.protocol import Served, ServerInfo
from monai_triton_ops.client.endpoints import Endpoint
from monai_triton_ops.client.status import CallError, Status
from monai_triton_ops.client.transports.base import TransportSettings
from monai_triton_ops.client.workers import Workers
from monai_triton_ops.signature import ModelSignature, TensorSpec

from .memory import MemoryServer, MemoryTransport

WAIT_S = 30.0  # a bound on waits for another thread, never reached when the code is right
SIGNATURE = ModelSignature(
    name="m",
    inputs=(TensorSpec(name="x", dtype="FP32", shape=(4,)),),
    outputs=(TensorSpec(name="y", dtype="FP32", shape=(4,)),),
)
UNAVAILABLE = CallError(Status.UNAVAILABLE, "failed to connect to all addresses")


class WatchedFleet(Fleet):
    """A fleet whose probing thread reports every probe it has finished: ``(label, state, probe_delay_s)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.probed: queue.Queue[tuple[str, State, float]] = queue.Queue()
        super().__init__(*args, **kwargs)

    def _probe(self, server: Server) -> None:
        try:
            super()._probe(server)
        finally:
            self.probed.put((server.label, server.state, server.probe_delay_s))

    def probe_of(self, server: Server, until: Callable[[State], bool] = lambda _: True) -> tuple[State, float]:
        """The state and next delay ``server``'s next finished probe left it at (the first one ``until`` accepts)."""
        while True:
            label, state, delay = self.probed.get(timeout=WAIT_S)
            if label == server.label and until(state):
                return state, delay


class Stand:
    """The stand-in servers of one fleet, by URL, and every transport the fleet made to them."""

    def __init__(self) -> None:
        self.servers: dict[str, MemoryServer] = {}
        self.transports: list[MemoryTransport] = []

    def connect(self, endpoint: Endpoint, settings: TransportSettings, workers: Workers, *, balanced: bool = False):  # type: ignore[no-untyped-def]
        transport = MemoryTransport(self.servers[endpoint.url], endpoint.url)
        self.transports.append(transport)
        return transport


MakeFleet = Callable[..., tuple[WatchedFleet, list[MemoryServer]]]


@pytest.fixture
def make_fleet(monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeFleet]:
    """``make_fleet(ports, **options)``: an open fleet of one stand-in server per port of 127.0.0.1 (nothing need
    listen there: the transports are in memory); probes back off from 10 ms to 40 ms."""
    stand = Stand()
    monkeypatch.setattr(members_module, "connect", stand.connect)
    made: list[tuple[WatchedFleet, Workers]] = []

    def make(ports: list[int], **options: Any) -> tuple[WatchedFleet, list[MemoryServer]]:
        urls = [f"grpc://127.0.0.1:{port}" for port in ports]
        for url in urls:
            stand.servers[url] = MemoryServer("m")
        settings = {"probe_backoff_s": 0.01, "max_probe_backoff_s": 0.04, **options}
        workers = Workers("units-fleet", 1)
        fleet = WatchedFleet(
            "m",
            None,
            [Endpoint.parse(u) for u in urls],
            TransportSettings(),
            workers,
            RemoteOptions(**settings),
            describe=lambda _: Served(SIGNATURE, ServerInfo("memory", "0", frozenset())),
        )
        made.append((fleet, workers))
        fleet.open(timeout_s=WAIT_S)
        return fleet, [stand.servers[u] for u in urls]

    yield make
    for fleet, workers in made:
        fleet.members.close()
        workers.stop(join_timeout_s=WAIT_S)
    assert all(t.closed == 1 for t in stand.transports), "a transport was not closed exactly once"


def test_first_attempts_from_many_threads_are_spread_evenly_over_the_servers(make_fleet: MakeFleet) -> None:
    fleet, _ = make_fleet([1, 2, 3])
    start = threading.Barrier(6)
    picked: Counter[str] = Counter()
    lock = threading.Lock()

    def requests() -> None:
        start.wait(WAIT_S)
        mine = Counter(fleet.pick(Counter()) for _ in range(100))
        with lock:
            picked.update({s.label: n for s, n in mine.items() if s is not None})

    threads = [threading.Thread(target=requests) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert picked == {f"grpc://127.0.0.1:{p}": 200 for p in (1, 2, 3)}


def test_one_request_tries_every_server_once_per_round_then_is_told_none(make_fleet: MakeFleet) -> None:
    fleet, _ = make_fleet([1, 2, 3])
    tried: Counter[Server] = Counter()
    for _ in range(3):
        server = fleet.pick(tried)
        assert server is not None
        tried[server] += 1
    assert sorted(s.label for s in tried) == [f"grpc://127.0.0.1:{p}" for p in (1, 2, 3)]
    assert fleet.pick(tried) is None  # the caller backs off and starts a new round, or gives up


def test_a_failed_server_is_skipped_while_down_and_used_again_once_a_probe_finds_it_ready(
    make_fleet: MakeFleet,
) -> None:
    fleet, stand_ins = make_fleet([1, 2, 3], probe_backoff_s=0.01, max_probe_backoff_s=0.04)
    first = fleet.servers[0]
    stand_ins[0].ready = False  # its model unloads: requests fail on it, probes find it loading
    fleet.failed(first, UNAVAILABLE)
    assert first.state in (State.SUSPECT, State.DOWN)
    assert first not in {fleet.pick(Counter()) for _ in range(60)}

    found = [fleet.probe_of(first) for _ in range(4)]  # each probe doubles the next one's delay, up to the cap
    assert found == [(State.DOWN, 0.01), (State.DOWN, 0.02), (State.DOWN, 0.04), (State.DOWN, 0.04)]
    assert "model loading" in first.why
    assert first not in {fleet.pick(Counter()) for _ in range(60)}
    assert fleet.usable()

    stand_ins[0].ready = True
    assert fleet.probe_of(first, until=lambda state: state is State.UP) == (State.UP, 0.0)
    assert Counter(s.label if s else None for s in (fleet.pick(Counter()) for _ in range(60)))[first.label] == 20


def test_a_server_that_failed_a_request_is_suspect_until_a_probe_finds_it_ready(make_fleet: MakeFleet) -> None:
    fleet, stand_ins = make_fleet([1, 2])
    first, second = fleet.servers
    stand_ins[0].answering.clear()  # the probe reaches the server and waits there for the test
    fleet.failed(first, CallError(Status.MODEL_DOWN, "the stub died"))
    assert first.state is State.SUSPECT
    assert {fleet.pick(Counter()) for _ in range(10)} == {second}
    assert fleet.usable()
    stand_ins[0].answering.set()
    assert fleet.probe_of(first) == (State.UP, 0.0)  # ready again: UP at once, no backoff (a full queue passes)
    assert {fleet.pick(Counter()) for _ in range(10)} == {first, second}


def test_a_probes_answer_older_than_a_requests_success_does_not_mark_the_server_down(make_fleet: MakeFleet) -> None:
    """Requests in flight on a server when one of them fails: the probe that follows can find it not ready just
    before another of them gets its answer there; the answer is the newer news, and the server stays up."""
    fleet, stand_ins = make_fleet([1, 2])
    first, _ = fleet.servers
    stand_ins[0].ready = False
    stand_ins[0].answering.clear()
    stand_ins[0].asked.clear()  # (open asked it already)
    fleet.failed(first, UNAVAILABLE)
    assert stand_ins[0].asked.wait(WAIT_S)  # the probe's answer, "not ready", is on its way back
    stand_ins[0].ready = True
    fleet.succeeded(first)  # meanwhile a request in flight there got its answer
    assert first.state is State.UP
    stand_ins[0].answering.set()
    assert fleet.probe_of(first) == (State.UP, 0.0)
    assert first in {fleet.pick(Counter()) for _ in range(10)}


def test_with_no_server_up_the_one_that_failed_first_is_tried_and_an_answer_brings_it_back(
    make_fleet: MakeFleet,
) -> None:
    fleet, stand_ins = make_fleet([1, 2, 3])
    for stand_in in stand_ins:
        stand_in.ready = False
    stand_ins[1].answering.clear()  # probes of the second wait at it: none can undo the answer below meanwhile
    for server in fleet.servers:
        fleet.failed(server, UNAVAILABLE)
    first, second, third = fleet.servers
    assert fleet.pick(Counter()) is first  # the request is the probe: the longest-failed server first
    assert fleet.pick(Counter({first: 1})) is second
    assert fleet.pick(Counter({first: 1, second: 1, third: 1})) is None
    stand_ins[1].ready = True
    fleet.succeeded(second)  # a retried request got its answer there
    assert second.state is State.UP
    assert {fleet.pick(Counter()) for _ in range(10)} == {second}
    stand_ins[1].answering.set()
    assert fleet.probe_of(second) == (State.UP, 0.0)


def test_an_old_transport_is_closed_once_the_last_attempt_on_it_is_given_back(make_fleet: MakeFleet) -> None:
    """A gRPC channel that keeps failing while the server accepts connections is replaced by a probe; attempts
    still out on the old one finish on it, and it is closed after the last of them, once, from whichever thread."""
    with socket.create_server(("127.0.0.1", 0)) as listener:  # the server accepts connections (probe's TCP check)
        fleet, _ = make_fleet([listener.getsockname()[1]])
        (server,) = fleet.servers
        old = server.transport
        attempts = 4
        taken = [fleet.members.take(server) for _ in range(attempts)]
        assert all(t is old for t in taken)
        assert server.in_flight == attempts
        assert isinstance(old, MemoryTransport)
        old.unavailable = True  # the channel waits out gRPC's reconnect backoff
        fleet.failed(server, UNAVAILABLE)
        assert fleet.probe_of(server) == (State.UP, 0.0)  # reconnected, and ready on the new channel
        assert server.transport is not old
        assert old.closed == 0  # attempts still use it

        start = threading.Barrier(attempts)

        def give_back() -> None:
            start.wait(WAIT_S)
            fleet.members.give_back(server)

        threads = [threading.Thread(target=give_back) for _ in range(attempts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        assert server.in_flight == 0
        assert old.closed == 1


def test_fleets_over_the_same_servers_share_one_turn(make_fleet: MakeFleet) -> None:
    """An ensemble's members (a fleet each, over the same servers) send a window batch's requests together: turns
    of their own went in step, every member's request to the same server; one shared turn spreads them."""
    first, _ = make_fleet([4, 5])
    second, _ = make_fleet([4, 5])
    for _ in range(3):
        batch = [first.pick(Counter()), second.pick(Counter())]
        assert {s.label for s in batch if s is not None} == {"grpc://127.0.0.1:4", "grpc://127.0.0.1:5"}
