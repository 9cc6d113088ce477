"""Lent output buffers: reused only once every array made from them is gone, within bounds, from any thread."""

from __future__ import annotations

import gc
import threading

import numpy as np
import torch

from monai_triton_ops.backends.leases import BufferPool


def _address(array: np.ndarray) -> int:
    return int(array.ctypes.data)


def test_a_lease_is_exactly_the_size_asked_writable_and_reused_once_dropped() -> None:
    pool = BufferPool()
    lease = pool.lend(1000)
    assert (lease.dtype, lease.shape, lease.flags.writeable) == (np.uint8, (1000,), True)
    first = _address(lease)
    del lease
    again = pool.lend(900)  # fits the idle buffer (not more than twice as big): the same memory
    assert _address(again) == first
    assert pool.created == 1


def test_a_buffer_is_not_lent_again_while_any_view_of_its_lease_lives() -> None:
    pool = BufferPool()
    lease = pool.lend(4 * 64)
    view = lease.view(np.float32).reshape(8, 8)[2:, :]  # what a response hands out, then a caller's slice
    tensor = torch.from_numpy(lease.view(np.float32))  # and a torch tensor over it
    view[:] = 7.0
    address = _address(lease)
    del lease
    other = pool.lend(4 * 64)
    assert _address(other) != address  # the first buffer is still someone's
    other[:] = 0
    assert float(view.sum()) == 7.0 * 48
    del view
    assert _address(pool.lend(4 * 64)) != address  # the tensor still holds it
    del tensor
    gc.collect()
    again = [pool.lend(4 * 64) for _ in range(pool.idle)]  # every idle buffer, held at once
    assert address in {_address(lease) for lease in again}  # back once the last view went


def test_a_small_output_never_takes_a_big_buffer_and_idle_buffers_are_bounded() -> None:
    pool = BufferPool(max_idle_buffers=3, max_idle_bytes=10_000)
    big = pool.lend(8000)
    big_address = _address(big)
    del big
    small = pool.lend(100)
    assert _address(small) != big_address  # 8000 bytes for 100 would pin memory for nothing
    leases = [pool.lend(1000) for _ in range(6)]
    del leases, small
    assert pool.idle == 3  # the oldest went first (the 8000-byte one among them)
    pool.clear()
    assert pool.idle == 0


def test_threads_lending_and_dropping_at_once_never_share_a_buffer() -> None:
    pool = BufferPool()
    errors: list[str] = []

    def work(value: int) -> None:
        for _ in range(300):
            lease = pool.lend(4096)
            lease[:] = value
            if not (lease == value).all():
                errors.append(f"thread {value}: another thread wrote into its buffer")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert pool.created <= 8  # buffers went round, not one per lend
