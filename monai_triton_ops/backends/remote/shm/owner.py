"""The one owner of every shared memory region of this process: it alone moves a region from state to state.

A region's end used to be decided wherever it was needed (the pool's quarantine, retire and close, the exit and
fork hooks, the janitor, the backend's close); each race between two of them needed a fix of its own. Here every
region has one :class:`State`, changed only by :class:`RegionOwner`, under one lock, along :data:`MOVES`; the pool,
the exit and fork hooks, the janitor and close ask it. Network calls (unregister) are made outside the lock, with
the region in a state that says a call is out (``UNREGISTERING``).

::

    CREATED ──announce──> ANNOUNCED ──registered──> IN_USE <──take── IDLE <──give_back── IN_USE, LEASED
       │                     │                        │  └──lease──> LEASED                    │
       │(hand_off)           │(hand_off)              └───quarantine───> RELEASING <──quarantine─┘
       v                     v                                            │   ^
    UNLINKED            HANDED_OFF <──────────hand_off──── (any live)     │   │ refused ("in use")
                                                              try_unregister  │
                                                                          v   │
                                    UNLINKED <── UNREGISTERED <──ok── UNREGISTERING

- ``CREATED``: the file exists and is mapped; the exit sweep sees it (it is tracked under the lock the sweep takes).
- ``ANNOUNCED``: the janitor knows its name, before the server does (a kill between the two leaves nothing
  registered for good); its registration is under way.
- ``IDLE``, ``IN_USE``, ``LEASED``: registered; in a free slot, in a request's slot, or viewed by the caller's
  output arrays (the server is done with it).
- ``RELEASING``: the server may still hold it (a request cut off, a grown slot's old region, a pool closing);
  unregistering is tried until the server lets go (Triton refuses "currently in use").
- ``UNREGISTERING``: one unregister call is out (never two at once).
- ``UNREGISTERED`` then ``UNLINKED``: the server let go (the janitor forgets it), then unmapped and unlinked.
- ``HANDED_OFF``: unlinked now while the server may still hold it; the janitor unregisters it as soon as the
  server lets go (``janitor.py``).

A move asked from a state not in :data:`MOVES` raises :class:`RegionStateError`, except a *late* one: the request
path (``registered``, ``take``, ``lease``, ``give_back``, ``quarantine``) finding its region already moved on by a
close or the exit sweep gets ``False`` (the region is not the caller's any more), and ending an ended region does
nothing. A region of another process (inherited through ``fork()``) is never touched.

A holder (a pool) is closed through :meth:`RegionOwner.close_holder`: no region is created for it from then on, so
one whose creation raced the close cannot escape it. At exit, :meth:`RegionOwner.at_exit` (``atexit``) runs the
hooks given to :meth:`before_sweep` (``exit_hook.py`` closes the backends still open) and then :meth:`sweep`: no
region is created from then on, the registered regions no request uses are unregistered, the others handed off.
After ``fork()`` the child forgets the parent's regions.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable, Collection

from .janitor import ServerAccess, janitor
from .region import SystemRegion, Unregister, check_free_space
from .states import ENDED, MOVES, TAKEN, UNUSED, State

logger = logging.getLogger(__name__)

#: Deadline of each unregister call the exit sweep makes (regions of backends dropped without ``close()``).
SWEEP_CALL_S = 2.0


class RegionStateError(RuntimeError):
    """A move :data:`MOVES` does not allow: a bug in the caller, never a race the owner expects."""


class RegionRefusedError(RuntimeError):
    """No region is created once the process has begun to exit, nor for a holder that is closing."""


class RegionOwner:
    """Decides every move of every region of this process (module docstring); thread-safe, one per process."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a signal handler may close a backend on a thread inside it
        self._live: dict[str, SystemRegion] = {}
        self._closed_holders: weakref.WeakSet[object] = weakref.WeakSet()
        self._exiting = False
        self._before: list[Callable[[], None]] = []
        self._fork_hook = False
        self._pid = os.getpid()  # this process (set again in a forked child): a region of another is never touched

    # -- moves ------------------------------------------------------------------------------------
    def _move(self, region: SystemRegion, to: State, *, late_ok: bool = False) -> bool:
        """Move ``region`` to ``to`` (the lock held); ``False`` for a late move (``late_ok``) or a foreign region."""
        if region.pid != self._pid:
            return False
        if to not in MOVES[region.state]:
            if late_ok and region.state in TAKEN:
                return False
            raise RegionStateError(
                f"shared memory region {region.name}: no move from {region.state.value} to {to.value}"
            )
        region.state = to
        if to in ENDED:
            self._live.pop(region.name, None)
        return True

    def create(self, byte_size: int, holder: object = None) -> SystemRegion:
        """A new region (``CREATED``), tracked before its file exists; refused at exit or for a closed ``holder``."""
        check_free_space(byte_size)
        with self._lock:
            if self._exiting:
                raise RegionRefusedError("the process is exiting: no new shared memory region is created")
            if holder is not None and holder in self._closed_holders:
                raise RegionRefusedError("the backend is closing: no new shared memory region is created")
            region = SystemRegion(byte_size, holder)
            self._live[region.name] = region
        self._install_fork_hook()
        return region

    def announce(self, region: SystemRegion, access: ServerAccess) -> bool:
        """``CREATED`` -> ``ANNOUNCED``: the janitor hears of the region before the server does. ``False`` when a
        close or the exit sweep unlinked it first."""
        with self._lock:
            if not self._move(region, State.ANNOUNCED, late_ok=True):
                return False
            janitor.add(region.name, access)
            return True

    def registered(self, region: SystemRegion, unregister: Unregister) -> bool:
        """``ANNOUNCED`` -> ``IN_USE``: the server took it. ``False`` when a close or the exit sweep handed it off while
        the call was out: the janitor is told again, to unregister what the server has just registered."""
        with self._lock:
            if region.state is State.HANDED_OFF:
                janitor.retire(region.name)
                return False
            moved = self._move(region, State.IN_USE)
            region.unregister = unregister
            return moved

    def take(self, region: SystemRegion) -> bool:
        """``IDLE`` -> ``IN_USE`` (a request's slot); ``False`` when the exit sweep took it."""
        with self._lock:
            return self._move(region, State.IN_USE, late_ok=True)

    def lease(self, region: SystemRegion) -> bool:
        """``IN_USE`` -> ``LEASED``: the response arrived; the caller's output arrays view the region."""
        with self._lock:
            return self._move(region, State.LEASED, late_ok=True)

    def give_back(self, region: SystemRegion) -> bool:
        """``IN_USE`` or ``LEASED`` -> ``IDLE``; ``False`` when a close or the exit sweep took it meanwhile."""
        with self._lock:
            return self._move(region, State.IDLE, late_ok=True)

    def quarantine(self, region: SystemRegion) -> bool:
        """-> ``RELEASING``: the server may still use it; ``False`` when it is released or ended already."""
        with self._lock:
            return self._move(region, State.RELEASING, late_ok=True)

    def try_unregister(self, region: SystemRegion, timeout_s: float) -> bool:
        """One unregister call for a ``RELEASING`` region; on success it is unlinked. Whether it is gone."""
        with self._lock:
            if region.state in ENDED or region.pid != self._pid:
                return True
            if region.state is not State.RELEASING:  # another thread's call is out, or it is not released
                return False
            self._move(region, State.UNREGISTERING)
            call = region.unregister
        try:
            if call is not None:
                call(region.name, timeout_s)
        except Exception as exc:  # most often "currently in use": the server still runs a request on it
            logger.debug("region %s not released yet: %s", region.name, exc)
            with self._lock:
                if _state(region) is State.UNREGISTERING:  # not handed off meanwhile
                    self._move(region, State.RELEASING)
            return False
        with self._lock:
            if _state(region) is State.HANDED_OFF:  # handed off while the call was out: the janitor need not
                janitor.drop(region.name)
                return True
            self._move(region, State.UNREGISTERED)
            janitor.drop(region.name)
            region.unlink()
            self._move(region, State.UNLINKED)
        return True

    def hand_off(self, region: SystemRegion) -> None:
        """Unlink now; a region the janitor knows is unregistered by it once the server lets go (``HANDED_OFF``).
        One nobody else knows (``CREATED``) is simply ``UNLINKED``. An ended region stays as it is."""
        with self._lock:
            if region.state in ENDED or region.pid != self._pid:
                return
            if region.state is State.CREATED:
                region.unlink()
                self._move(region, State.UNLINKED)
                return
            self._move(region, State.HANDED_OFF)
            janitor.retire(region.name)
            region.unlink()

    # -- holders (pools) --------------------------------------------------------------------------
    def close_holder(self, holder: object) -> None:
        """``holder`` closes: no region is created for it from now on; its unused ones go ``RELEASING``."""
        with self._lock:
            self._closed_holders.add(holder)
            for region in self.regions(holder, UNUSED):
                self._move(region, State.RELEASING)

    def hand_off_all(self, holder: object) -> list[str]:
        """Hand off every live region of ``holder`` (its close is over); their names."""
        with self._lock:
            left = self.regions(holder)
            for region in left:
                self.hand_off(region)
        return [region.name for region in left]

    def regions(self, holder: object = None, states: Collection[State] | None = None) -> list[SystemRegion]:
        """Live regions of this process (of ``holder``, in ``states``, when given)."""
        with self._lock:
            return [
                r
                for r in self._live.values()
                if (holder is None or r.holder is holder) and (states is None or r.state in states)
            ]

    def names(self) -> list[str]:
        """Names of the regions this process holds now."""
        with self._lock:
            return sorted(self._live)

    # -- the process's end and fork ---------------------------------------------------------------
    def before_sweep(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` at exit before the sweep (``exit_hook.py``: close the open backends first, so that no
        region is unregistered through an HTTP worker still busy with a call). ``at_exit`` is registered again,
        last, so it runs before the ``atexit`` hooks registered earlier."""
        with self._lock:
            if hook not in self._before:
                self._before.append(hook)
        atexit.unregister(self.at_exit)
        atexit.register(self.at_exit)

    def at_exit(self) -> None:
        """The hooks given to :meth:`before_sweep`, then :meth:`sweep` (``atexit`` calls it)."""
        with self._lock:
            hooks = list(self._before)
        for hook in hooks:
            try:
                hook()
            except Exception:  # the sweep runs whatever a hook did
                logger.exception("exit hook %r failed", hook)
        self.sweep()

    def sweep(self) -> None:
        """No region is created from now on; the unused registered ones are unregistered (one call each), every
        other one handed off, those nobody knows unlinked: no file of this process outlives it."""
        with self._lock:
            self._exiting = True
            unused = self.regions(states=UNUSED)
            for region in unused:
                self._move(region, State.RELEASING)
        for region in unused:
            self.try_unregister(region, SWEEP_CALL_S)
        with self._lock:
            for region in self.regions():
                self.hand_off(region)

    def _install_fork_hook(self) -> None:
        with self._lock:
            if self._fork_hook:
                return
            self._fork_hook = True
        atexit.register(self.at_exit)  # moved last again by before_sweep
        os.register_at_fork(after_in_child=self._forget_parent_regions)

    def _forget_parent_regions(self) -> None:
        """In a forked child: the parent's regions are not its own (never unlinked by it); it runs its own program
        (a child forked while its parent exits may create regions)."""
        self._lock = threading.RLock()  # another parent thread may have held it at fork time
        self._pid = os.getpid()
        self._exiting = False
        self._live.clear()
        self._closed_holders = weakref.WeakSet()


def _state(region: SystemRegion) -> State:
    """``region.state`` read again: another thread may have moved it while this one's call was out."""
    return region.state


owner = RegionOwner()
