"""Shared memory slots for requests in flight: one region per slot, registered once, grown when a request needs more.

A slot holds one request's inputs and outputs side by side (each tensor at its own 64-byte aligned
offset; the region itself is always registered at offset 0, because 2.51 applies a registration
offset twice). A slot is taken for one request and given back when its response has arrived, so
at most ``max_in_flight`` slots exist in steady state and a sliding window reuses them window after
window. Growing a slot replaces its region (the old one is retired like a quarantined one, below; a bigger
one is created and registered); sizes at least double, so a slot is re-registered a handful of times at most.

Outputs are handed to the caller as views of the slot, without a copy, and the slot is *leased*: it
serves no other request until every array viewing it is gone (a finaliser on the arrays' common base
gives it back). Sliding windows drop each output once blended, so slots come back at once; a caller
that keeps many outputs is served copies once the leased bytes pass ``LEASE_CAP_BYTES``.

A request that ended without its response (deadline, cancel, connection lost) may still be read
or written by the server, so its slot is never reused: it is *quarantined*, and unregistering it is
tried at once and then again (at most every ``_REAP_INTERVAL_S``) whenever a worker takes a slot,
until the server lets go (2.51 refuses "currently in use"); then it is unlinked. No timer thread:
the workers that make requests do it, and ``close()`` retires what is left.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import deque
from typing import Any

import numpy as np

from ....client.status import CallError, Status
from ....client.transports.base import Transport
from .janitor import ServerAccess
from .owner import RegionRefusedError, owner
from .region import SystemRegion
from .states import State

logger = logging.getLogger(__name__)

ALIGN = 64
#: Above this many bytes in leased slots, outputs are copied out instead (a caller keeping every output).
LEASE_CAP_BYTES = 1 << 30
LEASE_CAP_SLOTS = 16
#: Deadline of one register/unregister call.
_CALL_TIMEOUT_S = 5.0
_REAP_INTERVAL_S = 0.25
_CLOSED_WHILE_REGISTERING = "the backend closed while a shared memory region was being registered"


def _call_timeout(deadline: float | None) -> float:
    """A register/unregister call's deadline: ``_CALL_TIMEOUT_S``, or less when the request has less left."""
    return _CALL_TIMEOUT_S if deadline is None else min(_CALL_TIMEOUT_S, deadline - time.monotonic())


def _time_to_register(deadline: float | None) -> float:
    """The deadline of a region's registration; raises if the request's deadline has passed."""
    timeout = _call_timeout(deadline)
    if timeout <= 0:
        raise CallError(Status.DEADLINE, "the deadline passed before a shared memory region was registered")
    return timeout


def aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def janitor_access(transport: Transport) -> ServerAccess:
    """What the janitor needs to unregister this transport's regions: its endpoint, TLS material and headers."""
    credentials = transport.credentials
    return ServerAccess(
        url=transport.url,
        root_certificates=credentials.root_certificates,
        client_chain=credentials.client_chain_pem,
        client_key=credentials.client_key_pem,
        headers=tuple(sorted(credentials.headers_for(transport.protocol).items())),
    )


class Slot:
    """One request's region (``None`` until first sized)."""

    def __init__(self) -> None:
        self.region: SystemRegion | None = None

    @property
    def capacity(self) -> int:
        return self.region.byte_size if self.region is not None else 0


class PoolExhausted(OSError):
    """Every slot is busy or leased and the pool is at its size limit: this request goes in the body."""


class RegionPool:
    """Slots over one transport; thread-safe. Failures to create or register raise (``OSError``, ``CallError``).

    At most ``max_slots`` slots exist (requests in flight plus results still leased); past that a request
    is refused a slot (``PoolExhausted``) rather than a new region being made. Every region's state (``owner.py``)
    is the owner's: the pool asks it to take, lease, give back, quarantine, unregister and hand off.
    """

    def __init__(self, transport: Transport, *, max_slots: int = LEASE_CAP_SLOTS) -> None:
        self._transport = transport
        self._access = janitor_access(transport)
        self._max_slots = max_slots
        self._lock = threading.Lock()
        self._free: list[Slot] = []
        self._busy: set[Slot] = set()
        self._leased: dict[Slot, int] = {}  # slot -> arrays still viewing it
        self._returned: deque[Slot] = deque()  # filled by finalisers on any thread; drained under the lock
        self._closed = False
        self._retiring = False  # a worker is trying the quarantined regions now
        self._retry_at = 0.0  # not before this time.monotonic() again
        self.registrations = 0  # how many regions were registered (tests and logs read it)

    def acquire(self, byte_size: int, *, deadline: float | None = None) -> Slot:
        """A slot whose region holds ``byte_size`` bytes, registered; grows a free slot if needed.

        ``deadline`` (the request's) bounds the calls made on the way: a region's registration, and the tries
        to let go of quarantined ones (the thread may be the caller's, which waits for its deadline only).
        """
        self._retire_quarantined(deadline)
        with self._lock:
            if self._closed:
                raise CallError(Status.CANCELLED, "the backend is closing")
            self._drain_returned()
            fitting = [s for s in self._free if s.capacity >= byte_size]
            if not self._free and len(self._busy) + len(self._leased) >= self._max_slots:
                raise PoolExhausted(f"all {self._max_slots} shared memory slots are busy or leased")
            slot = fitting[0] if fitting else (self._free[-1] if self._free else Slot())
            if slot in self._free:
                self._free.remove(slot)
                if slot.region is not None and not owner.take(slot.region):
                    raise CallError(Status.CANCELLED, "the process is exiting")  # the exit sweep took the region
            self._busy.add(slot)
        try:
            if slot.capacity < byte_size:
                self._grow(slot, byte_size, deadline)
        except BaseException:
            self.release(slot)
            raise
        return slot

    def _grow(self, slot: Slot, byte_size: int, deadline: float | None) -> None:
        _time_to_register(deadline)
        old = slot.region
        size = max(byte_size, 2 * old.byte_size) if old is not None else byte_size
        slot.region = None
        if old is not None:
            self._retire(old, deadline)
        try:
            region = owner.create(size, holder=self)
        except RegionRefusedError as exc:
            raise CallError(Status.CANCELLED, str(exc)) from exc
        # The janitor hears of it before the server does: a process killed between the two would leave it
        # registered for good. Unregistering a name the server does not know succeeds, so a registration that
        # failed (or whose answer never came) is handed to the janitor too.
        if not owner.announce(region, self._access):
            raise CallError(Status.CANCELLED, _CLOSED_WHILE_REGISTERING)
        try:
            timeout = _time_to_register(deadline)  # what is left after retiring the old region
            self._transport.register_system_shm(region.name, region.key, region.byte_size, timeout_s=timeout)
        except BaseException as exc:
            if region.state is State.HANDED_OFF:  # a close or the exit sweep took it (its file may be gone already)
                raise CallError(Status.CANCELLED, _CLOSED_WHILE_REGISTERING) from exc
            owner.hand_off(region)
            raise
        if not owner.registered(region, self._unregister):
            raise CallError(Status.CANCELLED, _CLOSED_WHILE_REGISTERING)
        slot.region = region
        self.registrations += 1
        logger.debug("registered shared memory region %s (%d bytes)", region.name, region.byte_size)

    def _retire(self, region: SystemRegion, deadline: float | None) -> None:
        """Retire a grown slot's old region as a quarantined one: the server can hold a region a moment after
        its last response (Triton refuses to unregister a region in use, ``SharedMemoryManager::Unregister``), so
        unregistering is tried again until it lets go, not once."""
        if owner.quarantine(region):
            timeout = _call_timeout(deadline)
            if timeout > 0:
                owner.try_unregister(region, timeout)  # most often at once; else the next request or close() again

    def _unregister(self, name: str, timeout_s: float) -> None:
        self._transport.unregister_system_shm(name, timeout_s=timeout_s)

    # -- leases -----------------------------------------------------------------------------------
    def can_lease(self) -> bool:
        """Whether outputs may stay in their slot: not past ``LEASE_CAP_BYTES`` nor ``LEASE_CAP_SLOTS`` leased."""
        with self._lock:
            self._drain_returned()
            held = sum(s.capacity for s in self._leased)
            room = min(LEASE_CAP_SLOTS, self._max_slots - 2)  # keep slots for the requests still to come
            return not self._closed and held < LEASE_CAP_BYTES and len(self._leased) < room

    def lease_views(self, slot: Slot, views: list[tuple[np.dtype[Any], tuple[int, ...], int]]) -> list[np.ndarray]:
        """Arrays on ``slot`` (dtype, shape, offset each); the slot is busy until all of them are gone."""
        region = slot.region
        assert region is not None  # noqa: S101 - a slot with outputs has a region
        arrays = []
        for dtype, shape, offset in views:
            count = math.prod(shape)
            base = np.frombuffer(region.buffer, dtype=dtype, count=count, offset=offset)
            weakref.finalize(base, self._returned.append, slot)  # every view of it keeps ``base`` alive
            arrays.append(base.reshape(shape))
        with self._lock:
            owner.lease(region)  # False once a close or the exit sweep took it: the arrays stay valid all the same
            self._busy.discard(slot)
            self._leased[slot] = self._leased.get(slot, 0) + len(arrays)
        return arrays

    def _drain_returned(self) -> None:
        """Slots whose arrays are all gone go back to the free list (called with the lock held); once the pool is
        closing, the owner has taken their regions (``close_holder``)."""
        while self._returned:
            slot = self._returned.popleft()
            left = self._leased.get(slot, 0) - 1
            if left > 0:
                self._leased[slot] = left
                continue
            self._leased.pop(slot, None)
            if not self._closed and slot.region is not None and owner.give_back(slot.region):
                self._free.append(slot)

    def release(self, slot: Slot) -> None:
        """Give back a slot whose request got its response. Once ``close()`` has begun its region is quarantined:
        the response can reach us a moment before the server lets go of the region (Triton refuses to unregister a
        region in use), so ``close()`` tries to unregister it until its deadline, then hands it off."""
        region = slot.region
        with self._lock:
            self._busy.discard(slot)
            if not self._closed:
                if region is None or owner.give_back(region):
                    self._free.append(slot)  # else the exit sweep took its region: the slot goes
                return
        if region is not None:
            owner.quarantine(region)  # False when close() is over: it handed the region off already

    def quarantine(self, slot: Slot, *, deadline: float | None = None) -> None:
        """Retire a slot the server may still be using; its region is unlinked once the server lets it go."""
        with self._lock:
            self._busy.discard(slot)
        region = slot.region  # the slot itself is forgotten: never reused
        if region is not None and owner.quarantine(region):
            self._retire_quarantined(deadline)  # the server often lets go at once (a refused or queue-full request)

    def _retire_quarantined(self, deadline: float | None = None) -> None:
        """Try to unregister this pool's quarantined regions, on the calling thread, at most every
        ``_REAP_INTERVAL_S``; each try ends by ``deadline`` (none is made past it: the next request, or ``close()``,
        tries again)."""
        if _call_timeout(deadline) <= 0:
            return
        with self._lock:
            if self._closed or self._retiring or time.monotonic() < self._retry_at:
                return
            self._retiring = True
        try:
            for region in owner.regions(self, (State.RELEASING,)):
                timeout = _call_timeout(deadline)
                if timeout <= 0:
                    break
                owner.try_unregister(region, timeout)
        finally:
            with self._lock:
                self._retiring = False
                self._retry_at = time.monotonic() + _REAP_INTERVAL_S

    def close(self, deadline: float) -> None:
        """Unregister and unlink every region, retrying until ``deadline`` (every call ends by then too).

        The backend has ended or abandoned its calls still out (``Transport.end_calls``): their slots are not
        waited for (the server holds their regions until it has run their requests, whenever the call ends). The
        free and leased regions, and the quarantined ones, are unregistered, retried until the deadline while the
        server has not let go (a response can reach us a moment before the server lets go: "currently in use"). A
        leased region's mapping stays until its last array goes. What is left then (those regions, the abandoned
        requests', one whose registration is still under way) is unlinked now and handed to the janitor, which
        unregisters it once the server lets go.
        """
        with self._lock:
            self._closed = True
            self._drain_returned()
            self._free.clear()
            owner.close_holder(self)  # no region is created for this pool from now on
        while True:
            for region in owner.regions(self, (State.RELEASING,)):
                timeout = _call_timeout(deadline)
                if timeout > 0:
                    owner.try_unregister(region, timeout)
            pending = owner.regions(self, (State.RELEASING, State.UNREGISTERING))  # a response that came meanwhile
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(_REAP_INTERVAL_S)
        with self._lock:
            self._busy.clear()
            self._leased.clear()
        left = owner.hand_off_all(self)
        if left:
            logger.warning(
                "%d shared memory region(s) still in use by the server at close (requests it still runs); unlinked "
                "now, unregistered by the janitor once the server lets go: %s",
                len(left),
                ", ".join(left),
            )
