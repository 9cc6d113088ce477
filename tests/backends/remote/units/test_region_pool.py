"""The shared memory region pool (``shm/pool.py``): who holds a slot, when a region may be reused, and close.

Real regions in ``/dev/shm``, registered on the in-memory stand-in for a server (``memory.py``), which maps them
by key and refuses to unregister one it still uses, as Triton does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from monai_triton_ops.backends.remote.shm import pool as pool_module
from monai_triton_ops.backends.remote.shm.janitor import janitor
from monai_triton_ops.backends.remote.shm.owner import owner
from monai_triton_ops.backends.remote.shm.pool import PoolExhausted, RegionPool, Slot
from monai_triton_ops.backends.remote.shm.region import PAGE, SHM_DIR
from monai_triton_ops.client.status import CallError, Status

from .memory import MemoryServer, MemoryTransport

WAIT_S = 30.0  # a bound on waits for another thread, never reached when the code is right


@pytest.fixture
def pool(transport: MemoryTransport, server: MemoryServer) -> Iterator[RegionPool]:
    """A pool on the stand-in; closed afterwards, leaving nothing registered and nothing in ``/dev/shm``."""
    made: list[str] = []
    original = transport.register_system_shm

    def register(name: str, key: str, byte_size: int, *, timeout_s: float) -> None:
        original(name, key, byte_size, timeout_s=timeout_s)
        made.append(name)

    transport.register_system_shm = register  # type: ignore[method-assign]
    regions = RegionPool(transport, max_slots=16)
    yield regions
    regions.close(time.monotonic() + 5.0)
    assert not server.registered(), "a region is still registered on the server"
    assert not [n for n in made if (SHM_DIR / n).exists()], "a region is still in /dev/shm"


def name_of(slot: Slot) -> str:
    assert slot.region is not None
    return slot.region.name


@pytest.mark.usefixtures("busy_switching")
def test_a_slot_is_never_held_by_two_requests_at_once(pool: RegionPool, server: MemoryServer) -> None:
    threads, rounds = 8, 300
    start = threading.Barrier(threads)
    lock = threading.Lock()
    holder: dict[str, int] = {}
    clashes: list[str] = []

    def requests(me: int) -> None:
        start.wait(WAIT_S)
        mark = np.full(8, me, dtype=np.int64)
        for _ in range(rounds):
            slot = pool.acquire(PAGE)
            name = name_of(slot)
            with lock:
                if name in holder:
                    clashes.append(f"{name} held by {holder[name]} and {me}")
                holder[name] = me
            assert slot.region is not None
            slot.region.write(mark, 0)  # the request's inputs
            if not (slot.region.view(mark.dtype, mark.shape, 0) == me).all():
                clashes.append(f"{name}: another request wrote into the slot of {me}")
            with lock:
                del holder[name]
            pool.release(slot)

    workers = [threading.Thread(target=requests, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S)
    assert not clashes
    assert len(server.registrations) <= threads  # at most one slot per request in flight, each registered once
    assert set(server.registrations.values()) == {1}


def test_past_max_slots_a_request_is_refused_a_slot_not_given_a_new_region(
    transport: MemoryTransport, server: MemoryServer
) -> None:
    regions = RegionPool(transport, max_slots=2)
    all_tried = threading.Barrier(4)
    got: list[Slot] = []
    refused: list[PoolExhausted] = []

    def request() -> None:
        try:
            slot = regions.acquire(PAGE)
        except PoolExhausted as exc:
            refused.append(exc)
            all_tried.wait(WAIT_S)
            return
        got.append(slot)
        all_tried.wait(WAIT_S)  # every request asked while the slots were held
        regions.release(slot)

    workers = [threading.Thread(target=request) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S)
    try:
        assert (len(got), len(refused)) == (2, 2)
        assert len({name_of(s) for s in got}) == 2
        assert len(server.registrations) == 2
        assert "all 2 shared memory slots are busy or leased" in str(refused[0])
    finally:
        regions.close(time.monotonic() + 5.0)


def test_a_slot_whose_request_ended_without_its_response_is_quarantined_never_reused(
    pool: RegionPool, server: MemoryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "_REAP_INTERVAL_S", 0.0)  # every acquire tries the quarantined slots again
    slot = pool.acquire(PAGE)
    cut_off = name_of(slot)
    server.hold(cut_off)  # the client gave up (deadline); the server still runs the request on that region
    pool.quarantine(slot)
    assert cut_off in server.registered()  # the server refused: still registered, and the file still there
    assert (SHM_DIR / cut_off).exists()

    seen: set[str] = set()
    lock = threading.Lock()
    start = threading.Barrier(4)

    def requests() -> None:
        start.wait(WAIT_S)
        for _ in range(50):
            other = pool.acquire(PAGE)  # a page fits: only quarantine keeps the cut-off slot out
            with lock:
                seen.add(name_of(other))
            pool.release(other)

    workers = [threading.Thread(target=requests) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S)
    assert cut_off not in seen
    assert cut_off in server.registered()

    server.let_go(cut_off)  # the server's request ended: the next request's acquire unregisters it and unlinks
    pool.release(pool.acquire(PAGE))
    assert cut_off not in server.registered()
    assert not (SHM_DIR / cut_off).exists()


def test_a_leased_slot_serves_no_other_request_until_its_last_array_is_dropped_on_any_thread(
    pool: RegionPool, server: MemoryServer
) -> None:
    slot = pool.acquire(PAGE)
    leased = name_of(slot)
    outputs = pool.lease_views(slot, [(np.dtype(np.float32), (4,), 0), (np.dtype(np.int64), (2,), 64)])
    kept = [outputs[0][1:]]  # a view of a view keeps the slot leased too
    other = pool.acquire(PAGE)
    assert name_of(other) != leased
    pool.release(other)

    def drop() -> None:
        outputs.clear()

    dropper = threading.Thread(target=drop)
    dropper.start()
    dropper.join(WAIT_S)
    taken = [pool.acquire(PAGE), pool.acquire(PAGE)]
    assert leased not in {name_of(s) for s in taken}  # one array still views it
    for s in taken:
        pool.release(s)
    kept.clear()
    taken = [pool.acquire(PAGE) for _ in range(3)]
    assert leased in {name_of(s) for s in taken}  # back in the free list once nothing views it
    assert len(server.registrations) == 3  # the three slots made so far served them: no region was added
    for s in taken:
        pool.release(s)


def test_a_slot_that_grows_gets_a_new_region_and_the_old_one_is_unregistered_and_unlinked(
    pool: RegionPool, server: MemoryServer
) -> None:
    slot = pool.acquire(PAGE)
    small = name_of(slot)
    pool.release(slot)
    grown = pool.acquire(3 * PAGE)
    assert grown is slot
    assert slot.capacity >= 3 * PAGE
    assert name_of(slot) != small
    assert server.registered() == [name_of(slot)]
    assert not (SHM_DIR / small).exists()
    pool.release(grown)


def test_a_region_the_server_refuses_to_register_leaves_no_file_and_no_slot_taken(
    pool: RegionPool, transport: MemoryTransport, server: MemoryServer
) -> None:
    before = set(SHM_DIR.glob("mto_*"))
    transport.unavailable = True
    with pytest.raises(CallError) as caught:
        pool.acquire(PAGE)
    assert caught.value.status is Status.UNAVAILABLE
    assert set(SHM_DIR.glob("mto_*")) - before == set()
    transport.unavailable = False
    slot = pool.acquire(PAGE)  # the failed request holds nothing: the slot it was given is free again
    assert server.registered() == [name_of(slot)]
    pool.release(slot)


def test_close_retires_every_slot_free_leased_busy_and_quarantined(
    pool: RegionPool, transport: MemoryTransport, server: MemoryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "_REAP_INTERVAL_S", 0.01)
    free = pool.acquire(PAGE)
    pool.release(free)
    leased_slot = pool.acquire(PAGE)
    (leased,) = pool.lease_views(leased_slot, [(np.dtype(np.float32), (4,), 0)])
    leased[:] = 7.0
    busy = pool.acquire(PAGE)  # a request still out when close() begins
    stuck = pool.acquire(PAGE)
    server.hold(name_of(stuck))
    pool.quarantine(stuck)  # a request cut off: the server holds its region a while longer
    names = [name_of(s) for s in (free, leased_slot, busy, stuck)]

    closing = threading.Event()
    unregister = transport.unregister_system_shm

    def watched(name: str, *, timeout_s: float) -> None:
        closing.set()
        unregister(name, timeout_s=timeout_s)

    monkeypatch.setattr(transport, "unregister_system_shm", watched)
    closer = threading.Thread(target=pool.close, args=(time.monotonic() + WAIT_S,))
    closer.start()
    assert closing.wait(WAIT_S)  # close() has begun
    with pytest.raises(CallError) as caught:
        pool.acquire(PAGE)
    assert caught.value.status is Status.CANCELLED
    pool.release(busy)  # the response of the request still out arrives while close() still retries ``stuck``
    server.let_go(name_of(stuck))
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert not set(names) & set(server.registered())
    assert not [n for n in names if (SHM_DIR / n).exists()]
    assert (leased == 7.0).all()  # the caller's array stays valid: the mapping goes with its last view


def test_close_at_its_deadline_unlinks_a_region_the_server_never_lets_go(
    pool: RegionPool, server: MemoryServer, caplog: pytest.LogCaptureFixture
) -> None:
    slot = pool.acquire(PAGE)
    stuck = name_of(slot)
    server.hold(stuck)
    pool.quarantine(slot)
    with caplog.at_level(logging.WARNING, logger=pool_module.__name__):
        pool.close(time.monotonic())  # the deadline has passed: one try, then the file goes
    assert not (SHM_DIR / stuck).exists()
    assert "still in use by the server at close" in caplog.text
    assert stuck in caplog.text
    # What the janitor process would do once this process exits, done here so it has nothing left to retry.
    server.let_go(stuck)
    server.unregister(stuck)
    janitor.drop(stuck)


def test_a_region_whose_registration_is_on_its_way_when_close_runs_is_handed_to_the_janitor_and_its_request_cancelled(
    pool: RegionPool, transport: MemoryTransport, server: MemoryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot whose registration is still on its way back when ``close()`` runs has no region yet, but the owner
    knows its region (``ANNOUNCED``): close hands it to the janitor (its file goes now, the janitor unregisters it),
    and when the answer comes back the request is refused and the janitor told again (the server has just
    registered it): not left registered until the process ends."""
    registered, proceed = threading.Event(), threading.Event()
    original = transport.register_system_shm

    def slow_answer(name: str, key: str, byte_size: int, *, timeout_s: float) -> None:
        original(name, key, byte_size, timeout_s=timeout_s)
        registered.set()  # the server has it; the answer is still on its way
        assert proceed.wait(WAIT_S)

    monkeypatch.setattr(transport, "register_system_shm", slow_answer)
    got: list[Slot | CallError] = []

    def request() -> None:
        try:
            got.append(pool.acquire(PAGE))
        except CallError as exc:
            got.append(exc)

    requester = threading.Thread(target=request)
    requester.start()
    assert registered.wait(WAIT_S)
    (name,) = server.registered()
    retired: list[str] = []
    monkeypatch.setattr(janitor, "retire", retired.append)  # the watcher itself: test_exit.py, test_processes.py
    pool.close(time.monotonic() + 1.0)
    assert retired == [name]
    assert not (SHM_DIR / name).exists()
    proceed.set()
    requester.join(WAIT_S)
    (refused,) = got
    assert isinstance(refused, CallError)
    assert refused.status is Status.CANCELLED
    assert retired == [name, name]  # told again once the server has it registered
    # What the janitor process does at once, done here so the fixture finds nothing left.
    server.unregister(name)
    janitor.drop(name)


def test_close_does_not_wait_for_an_abandoned_requests_slot_and_hands_its_region_to_the_janitor(
    pool: RegionPool, server: MemoryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose call was ended at close (the server still runs it) keeps its slot busy: close does not wait
    for it until its deadline; its region is handed off at once, and its late response changes nothing."""
    busy = pool.acquire(PAGE)
    name = name_of(busy)
    server.hold(name)
    retired: list[str] = []
    monkeypatch.setattr(janitor, "retire", retired.append)  # the watcher itself: test_exit.py, test_processes.py
    deadline = time.monotonic() + WAIT_S
    pool.close(deadline)
    assert time.monotonic() < deadline  # nothing was left to retry: close did not wait for the busy slot
    assert retired == [name]
    assert not (SHM_DIR / name).exists()
    pool.release(busy)  # the abandoned request's response, after the close
    assert retired == [name]
    server.let_go(name)  # what the janitor process does once the server lets go
    server.unregister(name)
    janitor.drop(name)


@pytest.mark.usefixtures("busy_switching")
def test_requests_racing_a_close_leave_every_region_ended_and_no_file(
    transport: MemoryTransport, server: MemoryServer
) -> None:
    """Eight threads take and give back slots (some cut off) while close runs: every region ends unregistered and
    unlinked or handed off, whichever thread reached it first; a request is refused (``CANCELLED``) or served."""
    regions = RegionPool(transport, max_slots=16)
    names: set[str] = set()
    errors: list[BaseException] = []
    start = threading.Barrier(9)
    served = threading.Semaphore(0)

    def requests(me: int) -> None:
        start.wait(WAIT_S)
        for i in range(400):
            try:
                slot = regions.acquire(PAGE * (1 + i % 3))
            except CallError as exc:
                if exc.status is not Status.CANCELLED:
                    errors.append(exc)
                return
            except BaseException as exc:
                errors.append(exc)
                return
            names.add(name_of(slot))
            if (me + i) % 7 == 0:
                regions.quarantine(slot)  # a request cut off
            else:
                regions.release(slot)
            served.release()

    workers = [threading.Thread(target=requests, args=(i,)) for i in range(8)]
    for worker in workers:
        worker.start()
    start.wait(WAIT_S)
    for _ in range(100):  # close once requests are well under way
        assert served.acquire(timeout=WAIT_S)
    regions.close(time.monotonic() + 5.0)
    for worker in workers:
        worker.join(WAIT_S)
    assert not errors
    assert not owner.regions(regions)
    assert not [n for n in names if (SHM_DIR / n).exists()]
    for name in server.registered():  # a registration whose answer came after the hand-off: the janitor's
        server.unregister(name)
        janitor.drop(name)
