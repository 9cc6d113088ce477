"""System shared memory regions this process creates for a Triton server, and their cleanup in every case.

Why not ``tritonclient.utils.shared_memory``: it attaches silently to an existing key of another
process unless ``create_only=True``, and goes through ``multiprocessing.shared_memory``, whose
resource tracker unlinks at exit and warns about "leaked" objects. Here a region is a file in
``/dev/shm`` opened with ``O_CREAT | O_EXCL`` (a name already taken is never attached to) and mapped once.

Names are ``mto_<pid>_<random>_<n>``: unique between processes (pid and random part) and within one
(a counter). The same string is the Triton region name and the key (``/`` + name).

Cleanup, whatever ends the process:

- ``close()`` (the backend's close): unregister on the server, then unmap and unlink.
- ``atexit``: the same for every region still alive (a Python exit: the end of the script, ``sys.exit``,
  an exception, a host program's signal handler that exits that way). A region is created and tracked under the
  same lock that sweep takes, and none is created once it has begun: a worker thread still running a request
  at exit (daemon threads run on while the interpreter finalises) cannot leave a file nobody unlinks.
- After ``fork()`` the child forgets the parent's regions, so its exit never unlinks them.
- Whatever else ends it (a signal's default action, SIGKILL, Holoscan's own SIGTERM handling, an exit
  from C++, ``os._exit``): the janitor process (``janitor.py``) unregisters, with the client's own
  connection settings, and unlinks what is left; :func:`remove_stale_regions` removes regions whose
  creator pid is gone at the next open.

No signal handler is installed here: signals belong to the program (``interrupts.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import mmap
import os
import secrets
import threading
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

from ....processes import pid_exists
from .janitor import janitor

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")  # noqa: S108 - POSIX shared memory on Linux; only our own names are created or removed
PREFIX = "mto_"
PAGE = mmap.PAGESIZE
#: Free space kept in /dev/shm beyond a new region, so a region never takes the last bytes from other users.
_HEADROOM = 16 << 20

Unregister = Callable[[str], None]

_lock = threading.RLock()  # re-entrant: a program's signal handler may close a backend on a thread inside it
_live: dict[str, SystemRegion] = {}
_token = secrets.token_hex(4)
_counter = count()
_hooks_installed = False
_exiting = False  # close_all() has begun: no region is created after it


class ShmSpaceError(OSError):
    """``/dev/shm`` has too little free space for a planned region (tmpfs would SIGBUS on the first write)."""


class RegionRefusedError(RuntimeError):
    """No region is created once the process has begun to exit (``close_all`` has run or is running)."""


def _name() -> str:
    return f"{PREFIX}{os.getpid()}_{_token}_{next(_counter)}"


class SystemRegion:
    """One region of ``byte_size`` bytes, created by this process; ``unregister`` is called once before unlink."""

    def __init__(self, byte_size: int) -> None:
        size = max(PAGE, -(-byte_size // PAGE) * PAGE)
        check_free_space(size)
        self.byte_size = size
        self.pid = os.getpid()
        self.unregister: Unregister | None = None
        self.announced = False  # the janitor knows it (it is registered on a server)
        self._closed = False
        with _lock:  # the file exists only while tracked: close_all() never misses one (the module's docstring)
            if _exiting:
                raise RegionRefusedError("the process is exiting: no new shared memory region is created")
            self.name = self._create(size)
            self.key = "/" + self.name
            _track(self)

    def _create(self, size: int) -> str:
        """Create, size and map a new file in ``/dev/shm`` under a name nobody holds; its name."""
        while True:
            name = _name()
            try:
                fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            except FileExistsError:  # someone took our name: pick another, never attach
                logger.warning("shared memory name %s is taken by another process; choosing another", name)
                continue
            break
        try:
            os.ftruncate(fd, size)
            self._mmap: mmap.mmap | None = mmap.mmap(fd, size)
        except BaseException:
            _unlink(name)
            raise
        finally:
            os.close(fd)
        return name

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def buffer(self) -> mmap.mmap:
        if self._mmap is None:
            raise ValueError(f"shared memory region {self.name} is closed")
        return self._mmap

    def view(self, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int) -> np.ndarray:
        """A numpy view of the region (valid until close; copy before handing it to anyone)."""
        items = math.prod(shape)
        return np.frombuffer(self.buffer, dtype=dtype, count=items, offset=offset).reshape(shape)

    def write(self, array: np.ndarray, offset: int) -> None:
        """Copy ``array`` into the region at ``offset`` (one copy, no temporary)."""
        np.copyto(self.view(array.dtype, array.shape, offset), array, casting="no")

    def write_bytes(self, data: bytes, offset: int) -> None:
        self.buffer[offset : offset + len(data)] = data

    def close(self, *, unregister: bool = True) -> None:
        """Unregister (if asked and a server knows the region), unmap and unlink; idempotent; creator only.

        A region the server may still hold (``unregister=False`` while announced, or an unregister that
        failed: "currently in use" while a cut-off request still runs) stays with the janitor, which
        unregisters it once this process is gone.
        """
        if self._closed or os.getpid() != self.pid:
            return
        self._closed = True
        _untrack(self)
        hook, self.unregister = self.unregister, None
        if unregister and hook is not None:
            try:
                hook(self.name)
            except Exception as exc:  # the file goes anyway; the server keeps its mapping until it unregisters
                logger.warning("could not unregister shared memory region %s: %s", self.name, exc)
            else:
                self.forget_registration()
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with its last view
                mapping.close()
        _unlink(self.name)

    def forget_registration(self) -> None:
        """The server no longer knows this region: the janitor need not unregister it."""
        if self.announced:
            self.announced = False
            janitor.drop(self.name)

    def __repr__(self) -> str:
        return f"<SystemRegion {self.name} {self.byte_size} bytes{' closed' if self._closed else ''}>"


def check_free_space(byte_size: int) -> None:
    """Refuse a region ``/dev/shm`` cannot hold: tmpfs accepts ``ftruncate`` and ``mmap`` and SIGBUSes later."""
    stats = os.statvfs(SHM_DIR)
    free = stats.f_bavail * stats.f_frsize
    if free < byte_size + _HEADROOM:
        raise ShmSpaceError(f"{SHM_DIR} has {free} bytes free, too little for a {byte_size}-byte region")


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SHM_DIR / name)


def live_regions() -> list[str]:
    """Names of the regions this process holds now."""
    with _lock:
        return sorted(_live)


# -- cleanup at exit and after fork ---------------------------------------------------------------
def _track(region: SystemRegion) -> None:
    with _lock:
        _live[region.name] = region
    _install_hooks()


def _untrack(region: SystemRegion) -> None:
    with _lock:
        _live.pop(region.name, None)


def close_all() -> None:
    """Close every region this process created, and refuse new ones from then on (``atexit`` calls it)."""
    global _exiting
    with _lock:
        _exiting = True
        regions = [r for r in _live.values() if r.pid == os.getpid()]
    for region in regions:
        region.close()


def _install_hooks() -> None:
    global _hooks_installed
    with _lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    atexit.register(close_all)
    os.register_at_fork(after_in_child=_forget_parent_regions)


def _forget_parent_regions() -> None:
    global _lock, _exiting
    _lock = threading.RLock()  # another parent thread may have held it at fork time
    _exiting = False  # a child forked while its parent exits still runs its own program
    _live.clear()  # the parent's: never unlinked by this child (hooks are inherited and find only the child's own)


# -- leftovers of killed processes -----------------------------------------------------------------
def remove_stale_regions(unregister: Unregister | None = None) -> list[str]:
    """Unregister (on the given server) and unlink regions whose creating process no longer exists."""
    removed = []
    for path in SHM_DIR.glob(f"{PREFIX}*_*_*"):
        pid = path.name[len(PREFIX) :].split("_", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or pid_exists(int(pid)):
            continue
        if unregister is not None:
            with contextlib.suppress(Exception):
                unregister(path.name)
        _unlink(path.name)
        removed.append(path.name)
    if removed:
        logger.info("removed %d shared memory regions left by processes that no longer run", len(removed))
    return removed
