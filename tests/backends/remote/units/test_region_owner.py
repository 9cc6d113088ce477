"""The region owner (``shm/owner.py``): every state of a region, the moves between them, the moves it refuses, and
what happens when two parties (a request, a close, the exit sweep, a fork) reach one region at once.

Real regions in ``/dev/shm``, registered on the in-memory stand-in for a server (``memory.py``), which refuses to
unregister a region it still uses, as Triton does; the real janitor process is told what it is told in use. Where a
test needs to know what the janitor was told, it records the calls and passes them on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from monai_triton_ops.backends.remote.shm.janitor import ServerAccess, janitor
from monai_triton_ops.backends.remote.shm.owner import RegionRefusedError, RegionStateError, owner
from monai_triton_ops.backends.remote.shm.region import PAGE, SHM_DIR, SystemRegion
from monai_triton_ops.backends.remote.shm.states import MOVES, TAKEN, State

from .memory import MemoryServer, MemoryTransport

WAIT_S = 30.0  # a bound on waits for another thread, never reached when the code is right
ACCESS = ServerAccess(url="grpc://127.0.0.1:9")


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What the janitor is told, ``(verb, name)``, in order; each line still reaches the janitor process."""
    lines: list[tuple[str, str]] = []
    for verb in ("add", "drop", "retire"):
        real = getattr(janitor, verb)

        def spy(name: str, *rest: object, verb: str = verb, real: object = real) -> None:
            lines.append((verb, name))
            real(name, *rest)  # type: ignore[operator]

        monkeypatch.setattr(janitor, verb, spy)
    return lines


@pytest.fixture
def made(server: MemoryServer) -> Iterator[list[SystemRegion]]:
    """Regions a test makes; afterwards none is live, none registered on the stand-in, no file left."""
    regions: list[SystemRegion] = []
    yield regions
    for region in regions:
        owner.hand_off(region)
        server.let_go(region.name)
        server.unregister(region.name)  # what the janitor does for one handed off
        janitor.drop(region.name)
    assert not [r.name for r in regions if (SHM_DIR / r.name).exists()]
    assert not set(owner.names()) & {r.name for r in regions}


def registered(transport: MemoryTransport, made: list[SystemRegion], holder: object = None) -> SystemRegion:
    """A region the stand-in has registered, ``IN_USE`` (the way the pool makes one)."""
    region = owner.create(PAGE, holder)
    made.append(region)
    owner.announce(region, ACCESS)
    transport.register_system_shm(region.name, region.key, region.byte_size, timeout_s=5.0)
    assert owner.registered(region, lambda name, timeout_s: transport.unregister_system_shm(name, timeout_s=timeout_s))
    return region


def test_a_region_goes_through_its_states_and_ends_unregistered_and_unlinked(
    transport: MemoryTransport, server: MemoryServer, made: list[SystemRegion], told: list[tuple[str, str]]
) -> None:
    region = owner.create(PAGE)
    made.append(region)
    assert region.state is State.CREATED
    assert (SHM_DIR / region.name).exists()
    assert region.name in owner.names()  # tracked before anyone else knows it: the exit sweep sees it
    owner.announce(region, ACCESS)
    assert region.state is State.ANNOUNCED
    assert told == [("add", region.name)]  # the janitor hears of it before the server does
    transport.register_system_shm(region.name, region.key, region.byte_size, timeout_s=5.0)
    assert owner.registered(region, lambda name, timeout_s: transport.unregister_system_shm(name, timeout_s=timeout_s))
    path = [region.state]
    for move in (owner.lease, owner.give_back, owner.take, owner.give_back, owner.quarantine):
        assert move(region)
        path.append(region.state)
    assert path == [State.IN_USE, State.LEASED, State.IDLE, State.IN_USE, State.IDLE, State.RELEASING]
    assert owner.try_unregister(region, 5.0)
    assert region.state is State.UNLINKED
    assert not server.registered()
    assert not (SHM_DIR / region.name).exists()
    assert region.name not in owner.names()
    assert told == [("add", region.name), ("drop", region.name)]


def test_a_move_the_table_does_not_allow_raises_naming_the_region_and_both_states(made: list[SystemRegion]) -> None:
    """Every pair of states: a move :data:`MOVES` lists goes through; any other raises, except the late moves of the
    request path onto a region a close or the exit sweep has taken (``False``, nothing changed)."""
    region = owner.create(PAGE)
    made.append(region)
    with owner._lock:  # the owner's own lock, as every move; states set directly to reach each pair
        for start in State:
            for to in State:
                region.state = start
                if to in MOVES[start]:
                    assert owner._move(region, to)
                    assert region.state is to
                    continue
                with pytest.raises(RegionStateError, match=f"{region.name}: no move from {start.value} to"):
                    owner._move(region, to)
                assert region.state is start
                if start in TAKEN:
                    assert owner._move(region, to, late_ok=True) is False
                else:
                    with pytest.raises(RegionStateError):
                        owner._move(region, to, late_ok=True)
        region.state = State.CREATED
        owner._live[region.name] = region  # put back: an ended state untracked it
    with pytest.raises(RegionStateError, match="no move from created to in use"):
        owner.take(region)  # a request never takes a region that is not registered
    with pytest.raises(RegionStateError, match="no move from created to in use"):
        owner.registered(region, lambda name, timeout_s: None)  # nor is one registered the janitor has not heard of


def test_a_late_move_on_a_handed_off_region_changes_nothing(
    transport: MemoryTransport, made: list[SystemRegion], told: list[tuple[str, str]]
) -> None:
    region = registered(transport, made)
    owner.hand_off(region)  # a close at its deadline, or the exit sweep, while a request still holds it
    assert region.state is State.HANDED_OFF
    assert not (SHM_DIR / region.name).exists()
    assert told[-1] == ("retire", region.name)
    for late in (owner.give_back, owner.take, owner.lease, owner.quarantine):
        assert late(region) is False
    owner.hand_off(region)
    assert owner.try_unregister(region, 5.0)  # ended: nothing to do
    assert region.state is State.HANDED_OFF
    assert told.count(("retire", region.name)) == 1


def test_a_region_only_the_owner_knows_is_unlinked_at_hand_off_and_the_janitor_never_hears_of_it(
    made: list[SystemRegion], told: list[tuple[str, str]]
) -> None:
    region = owner.create(PAGE)
    made.append(region)
    owner.hand_off(region)
    assert region.state is State.UNLINKED
    assert not (SHM_DIR / region.name).exists()
    assert told == []


def test_unregister_refused_in_use_keeps_the_region_releasing_until_the_server_lets_go(
    transport: MemoryTransport, server: MemoryServer, made: list[SystemRegion]
) -> None:
    region = registered(transport, made)
    server.hold(region.name)  # a request cut off: the server still runs it
    assert owner.quarantine(region)
    assert not owner.try_unregister(region, 5.0)
    assert region.state is State.RELEASING
    assert (SHM_DIR / region.name).exists()
    server.let_go(region.name)
    assert owner.try_unregister(region, 5.0)
    assert region.state is State.UNLINKED
    assert not server.registered()


class Holder:
    """What a pool is to the owner: the holder of its regions."""


class HeldCall:
    """An unregister call that waits, once it has reached the stand-in, until the test lets it answer."""

    def __init__(self, transport: MemoryTransport) -> None:
        self.transport = transport
        self.calls = 0
        self.out = threading.Event()
        self.answer = threading.Event()

    def __call__(self, name: str, timeout_s: float) -> None:
        self.calls += 1
        self.transport.unregister_system_shm(name, timeout_s=timeout_s)
        self.out.set()
        assert self.answer.wait(WAIT_S)


def test_two_threads_unregistering_one_region_make_one_call(
    transport: MemoryTransport, made: list[SystemRegion]
) -> None:
    region = registered(transport, made)
    call = region.unregister = HeldCall(transport)
    owner.quarantine(region)
    results: list[bool] = []
    first = threading.Thread(target=lambda: results.append(owner.try_unregister(region, 5.0)))
    first.start()
    assert call.out.wait(WAIT_S)
    assert region.state is State.UNREGISTERING
    assert owner.try_unregister(region, 5.0) is False  # one call is out: the second caller does not make another
    call.answer.set()
    first.join(WAIT_S)
    assert results == [True]
    assert call.calls == 1
    assert region.state is State.UNLINKED


def test_a_region_handed_off_while_its_unregister_call_is_out_is_dropped_from_the_janitor_when_the_call_succeeds(
    transport: MemoryTransport, made: list[SystemRegion], told: list[tuple[str, str]]
) -> None:
    region = registered(transport, made)
    call = region.unregister = HeldCall(transport)
    owner.quarantine(region)
    trying = threading.Thread(target=owner.try_unregister, args=(region, 5.0))
    trying.start()
    assert call.out.wait(WAIT_S)
    owner.hand_off(region)  # a close's deadline or the exit sweep: the file goes now, whatever the call says
    assert region.state is State.HANDED_OFF
    assert not (SHM_DIR / region.name).exists()
    call.answer.set()
    trying.join(WAIT_S)
    assert region.state is State.HANDED_OFF
    assert told[-2:] == [("retire", region.name), ("drop", region.name)]  # the server let go: nothing for the janitor


def test_a_closing_holder_gets_no_new_region_its_unused_ones_are_releasing_and_at_its_end_all_are_handed_off(
    transport: MemoryTransport, made: list[SystemRegion]
) -> None:
    holder = Holder()
    idle, leased, busy = (registered(transport, made, holder) for _ in range(3))
    owner.give_back(idle)
    owner.lease(leased)
    announced = owner.create(PAGE, holder)  # its registration still under way
    made.append(announced)
    owner.announce(announced, ACCESS)
    other = registered(transport, made)  # another pool's: untouched
    owner.close_holder(holder)
    assert [r.state for r in (idle, leased, busy, announced, other)] == [
        State.RELEASING,
        State.RELEASING,
        State.IN_USE,
        State.ANNOUNCED,
        State.IN_USE,
    ]
    with pytest.raises(RegionRefusedError, match="closing"):
        owner.create(PAGE, holder)
    assert sorted(owner.hand_off_all(holder)) == sorted(r.name for r in (idle, leased, busy, announced))
    assert {r.state for r in (idle, leased, busy, announced)} == {State.HANDED_OFF}
    assert other.state is State.IN_USE
    assert owner.give_back(busy) is False  # the abandoned request's response, after the close


@pytest.fixture
def sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit sweep may run in this test: afterwards this process creates regions again, and its hooks are its own."""
    monkeypatch.setattr(owner, "_exiting", False)
    monkeypatch.setattr(owner, "_before", [])


@pytest.mark.usefixtures("sweep")
def test_at_exit_the_backends_close_first_then_unused_regions_are_unregistered_the_rest_handed_off(
    transport: MemoryTransport, server: MemoryServer, made: list[SystemRegion], told: list[tuple[str, str]]
) -> None:
    idle, busy = registered(transport, made), registered(transport, made)
    owner.give_back(idle)
    server.hold(busy.name)  # a request still running when the program ends
    announced = owner.create(PAGE)
    made.append(announced)
    owner.announce(announced, ACCESS)
    created = owner.create(PAGE)
    made.append(created)
    seen: list[list[str]] = []
    owner.before_sweep(lambda: seen.append(owner.names()))  # exit_hook.close_open: it finds every region still live
    owner.at_exit()
    assert set(seen[0]) >= {r.name for r in (idle, busy, announced, created)}
    assert [r.state for r in (idle, busy, announced, created)] == [
        State.UNLINKED,
        State.HANDED_OFF,
        State.HANDED_OFF,
        State.UNLINKED,
    ]
    assert server.registered() == [busy.name]  # left to the janitor, which unregisters it once the server lets go
    assert ("drop", idle.name) in told
    assert {("retire", busy.name), ("retire", announced.name)} <= set(told)
    assert not [r.name for r in (idle, busy, announced, created) if (SHM_DIR / r.name).exists()]
    with pytest.raises(RegionRefusedError, match="exiting"):
        owner.create(PAGE)


def test_a_forked_child_forgets_the_parents_regions_and_never_ends_them(
    transport: MemoryTransport, made: list[SystemRegion]
) -> None:
    parents = registered(transport, made)
    pid = os.fork()
    if pid == 0:  # the child: its exit code says what it found (no pytest here; os._exit skips every hook)
        failed = 1
        try:
            forgotten = owner.names() == []
            owner.hand_off(parents)  # not the child's: nothing happens
            owner.sweep()  # the child's own exit
            failed = 0 if forgotten and (SHM_DIR / parents.name).exists() else 2
        finally:
            os._exit(failed)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parents.state is State.IN_USE
    assert (SHM_DIR / parents.name).exists()
    assert parents.name in owner.names()
