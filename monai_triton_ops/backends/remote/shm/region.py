"""One system shared memory region: a file in ``/dev/shm`` this process creates, maps once and unlinks.

Why not ``tritonclient.utils.shared_memory``: it attaches silently to an existing key of another
process unless ``create_only=True``, and goes through ``multiprocessing.shared_memory``, whose
resource tracker unlinks at exit and warns about "leaked" objects. Here a region is a file in
``/dev/shm`` opened with ``O_CREAT | O_EXCL`` (a name already taken is never attached to) and mapped once.

Names are ``mto_<pid>_<random>_<n>``: unique between processes (pid and random part) and within one
(a counter). The same string is the Triton region name and the key (``/`` + name).

When a region is created, registered, handed to the janitor, unregistered and unlinked is decided by one object,
``owner.py`` (its states and who asks it are there); this module only makes and removes the file. Regions left by
processes that no longer run are removed at the next open (:func:`remove_stale_regions`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import secrets
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

from ....processes import pid_exists
from .states import State

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")  # noqa: S108 - POSIX shared memory on Linux; only our own names are created or removed
PREFIX = "mto_"
PAGE = mmap.PAGESIZE
#: Free space kept in /dev/shm beyond a new region, so a region never takes the last bytes from other users.
_HEADROOM = 16 << 20

#: Unregister a region on the server it is registered on: ``(name, timeout_s)``.
Unregister = Callable[[str, float], None]
_token = secrets.token_hex(4)
_counter = count()


class ShmSpaceError(OSError):
    """``/dev/shm`` has too little free space for a planned region (tmpfs would SIGBUS on the first write)."""


def _name() -> str:
    return f"{PREFIX}{os.getpid()}_{_token}_{next(_counter)}"


class SystemRegion:
    """One region of ``byte_size`` bytes (rounded up to pages), created and mapped by this process.

    Made by ``owner.RegionOwner.create`` only (under the lock its exit sweep takes); ``state``, ``holder`` (the
    pool it serves) and ``unregister`` (its server's call) are the owner's, changed under its lock.
    """

    def __init__(self, byte_size: int, holder: object = None) -> None:
        size = max(PAGE, -(-byte_size // PAGE) * PAGE)
        self.byte_size = size
        self.pid = os.getpid()
        self.holder = holder
        self.state: State = State.CREATED
        self.unregister: Unregister | None = None
        self.name = self._create(size)
        self.key = "/" + self.name

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
        """Whether the file is gone (the owner unlinked it or handed it off)."""
        return self._mmap is None

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

    def unlink(self) -> None:
        """Unmap (the mapping goes with its last view when arrays still view it) and unlink; the owner's call."""
        mapping, self._mmap = self._mmap, None
        if mapping is not None:
            with contextlib.suppress(BufferError):
                mapping.close()
        _unlink(self.name)

    def __repr__(self) -> str:
        return f"<SystemRegion {self.name} {self.byte_size} bytes {self.state.value}>"


def check_free_space(byte_size: int) -> None:
    """Refuse a region ``/dev/shm`` cannot hold: tmpfs accepts ``ftruncate`` and ``mmap`` and SIGBUSes later."""
    stats = os.statvfs(SHM_DIR)
    free = stats.f_bavail * stats.f_frsize
    if free < byte_size + _HEADROOM:
        raise ShmSpaceError(f"{SHM_DIR} has {free} bytes free, too little for a {byte_size}-byte region")


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SHM_DIR / name)


# -- leftovers of killed processes -----------------------------------------------------------------
def remove_stale_regions(unregister: Callable[[str], None] | None = None) -> list[str]:
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
