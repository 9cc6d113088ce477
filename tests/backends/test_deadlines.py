"""The deadline thread: fires in order, wakes for an earlier deadline, and holds nothing a cancel gave up."""

from __future__ import annotations

import gc
import threading
import time
import weakref

from monai_triton_ops.backends.deadlines import _Scheduler


class _Payload:
    """Stands for what a request's deadline callback holds (the call, its inputs)."""


def test_an_earlier_deadline_set_after_a_later_one_still_fires_first() -> None:
    scheduler = _Scheduler()
    fired: list[str] = []
    done = threading.Event()
    scheduler.at(time.monotonic() + 3600, lambda: fired.append("late"))  # the thread now sleeps for an hour
    soon = time.monotonic() + 0.05
    scheduler.at(soon, lambda: (fired.append("soon"), done.set()))
    assert done.wait(30)
    assert fired == ["soon"]
    assert time.monotonic() >= soon


def test_a_cancelled_timer_lets_go_of_its_callback_at_once() -> None:
    scheduler = _Scheduler()
    payload = _Payload()
    gone = weakref.ref(payload)
    timer = scheduler.at(time.monotonic() + 3600, lambda payload=payload: None)
    del payload
    timer.cancel()
    gc.collect()
    assert gone() is None  # the heap may keep the entry for an hour; it must not keep the request alive


def test_cancelled_entries_do_not_pile_up() -> None:
    scheduler = _Scheduler()
    for _ in range(20):  # a long run of requests that all finished before their deadlines
        for timer in [scheduler.at(time.monotonic() + 3600, lambda: None) for _ in range(500)]:
            timer.cancel()
    assert len(scheduler) <= 2 * 1024


def test_timers_fire_in_deadline_order_from_one_thread() -> None:
    scheduler = _Scheduler()
    order: list[int] = []
    threads: set[str] = set()
    done = threading.Event()
    start = time.monotonic()
    for i in (3, 1, 2):

        def fire(i: int = i) -> None:
            order.append(i)
            threads.add(threading.current_thread().name)
            if len(order) == 3:
                done.set()

        scheduler.at(start + 0.2 * i, fire)  # far enough apart that a stalled registration keeps the order
    assert done.wait(30)
    assert order == [1, 2, 3]
    assert threads == {"monai-triton-deadlines"}
