"""The worker pool (``Workers``): how many threads, whose thread a resource lives on, stop(), and control calls."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest

from monai_triton_ops.client.status import CallError, Status
from monai_triton_ops.client.workers import Workers

WAIT_S = 30.0  # a bound on waits for another thread, never reached when the code is right


@pytest.fixture
def make_workers() -> Iterator[Callable[[str, int], Workers]]:
    made: list[Workers] = []

    def make(name: str, count: int) -> Workers:
        made.append(Workers(name, count))
        return made[-1]

    yield make
    for workers in made:
        workers.stop(join_timeout_s=WAIT_S)
    assert not [t for t in threading.enumerate() if t.name.startswith("units-")], "a worker thread outlived stop()"


def threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix + "-")]


def test_at_most_count_requests_run_at_once_each_on_its_own_thread(make_workers: Callable[[str, int], Workers]) -> None:
    workers = make_workers("units-three", 3)
    assert len(threads_named("units-three")) == 3
    running = threading.Barrier(4)  # the three workers and this thread
    release = threading.Event()
    lock = threading.Lock()
    active, most = [0], [0]

    def request(_: None) -> str:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        if not release.is_set():
            running.wait(WAIT_S)  # only the first three get here before release: the barrier holds four
            release.wait(WAIT_S)
        with lock:
            active[0] -= 1
        return threading.current_thread().name

    futures = [workers.submit(request, None) for _ in range(12)]
    running.wait(WAIT_S)  # three requests run at once, and there is no fourth thread to run another
    release.set()
    names = {f.result(WAIT_S) for f in futures}
    assert most[0] == 3
    assert names == {t.name for t in threads_named("units-three")}


def test_a_workers_resource_is_made_and_released_on_that_worker_once(
    make_workers: Callable[[str, int], Workers],
) -> None:
    workers = make_workers("units-local", 2)
    made: list[str] = []
    released: list[str] = []
    lock = threading.Lock()

    def make() -> tuple[str, Callable[[], None]]:
        owner = threading.current_thread().name
        with lock:
            made.append(owner)

        def release() -> None:
            with lock:
                released.append(f"{owner} released on {threading.current_thread().name}")

        return f"client of {owner}", release

    both = threading.Barrier(2)

    def request(_: None) -> tuple[str, str]:
        both.wait(WAIT_S)  # one request on each worker
        first = Workers.local("client", make)
        return threading.current_thread().name, first

    for _ in range(3):
        results = [workers.submit(request, None) for _ in range(2)]
        for owner, client in (f.result(WAIT_S) for f in results):
            assert client == f"client of {owner}"  # each worker its own, reused request after request
    assert sorted(made) == ["units-local-0", "units-local-1"]
    assert not released
    workers.stop(join_timeout_s=WAIT_S)
    assert sorted(released) == ["units-local-0 released on units-local-0", "units-local-1 released on units-local-1"]


def test_discard_releases_the_resource_now_and_the_next_use_makes_another(
    make_workers: Callable[[str, int], Workers],
) -> None:
    workers = make_workers("units-discard", 1)
    events: list[str] = []
    count = iter(range(10))

    def make() -> tuple[int, Callable[[], None]]:
        n = next(count)
        return n, lambda: events.append(f"released {n} on {threading.current_thread().name}")

    def request(_: None) -> tuple[int, int, int]:
        first = Workers.local("conn", make)
        Workers.discard("conn")  # a connection left mid-message
        return first, Workers.local("conn", make), Workers.local("conn", make)

    assert workers.submit(request, None).result(WAIT_S) == (0, 1, 1)
    assert events == ["released 0 on units-discard-0"]
    workers.stop(join_timeout_s=WAIT_S)
    assert events == ["released 0 on units-discard-0", "released 1 on units-discard-0"]


def test_stop_refuses_new_work_and_still_runs_what_was_queued(make_workers: Callable[[str, int], Workers]) -> None:
    workers = make_workers("units-stop", 1)
    started, release = threading.Event(), threading.Event()

    def first(_: None) -> str:
        started.set()
        release.wait(WAIT_S)
        return "first"

    running = workers.submit(first, None)
    assert started.wait(WAIT_S)
    queued = [workers.submit(lambda n: n * 10, n) for n in range(5)]
    workers.stop(join_timeout_s=0.0)  # begins stopping; returns without waiting for the busy worker
    with pytest.raises(CallError) as caught:
        workers.submit(lambda n: n, 1)
    assert caught.value.status is Status.CANCELLED
    release.set()
    assert running.result(WAIT_S) == "first"
    assert [f.result(WAIT_S) for f in queued] == [0, 10, 20, 30, 40]
    for thread in threads_named("units-stop"):
        thread.join(WAIT_S)
    assert not threads_named("units-stop")
    workers.stop(join_timeout_s=WAIT_S)  # idempotent


def test_stop_from_a_worker_itself_does_not_wait_for_itself(make_workers: Callable[[str, int], Workers]) -> None:
    workers = make_workers("units-self", 2)
    stopping = workers.submit(lambda _: workers.stop(join_timeout_s=WAIT_S), None)
    assert stopping.result(WAIT_S) is None
    assert workers.closed


def test_call_runs_on_a_worker_and_inline_when_the_caller_is_a_worker(
    make_workers: Callable[[str, int], Workers],
) -> None:
    workers = make_workers("units-call", 1)
    assert workers.call(lambda: threading.current_thread().name, timeout_s=WAIT_S) == "units-call-0"
    assert not Workers.on_worker()

    def on_the_worker(_: None) -> str:
        # Queued, this call would wait for the one worker, which is busy running this very request.
        return workers.call(lambda: threading.current_thread().name, timeout_s=WAIT_S)

    assert workers.submit(on_the_worker, None).result(WAIT_S) == "units-call-0"
    with pytest.raises(ZeroDivisionError):
        workers.call(lambda: 1 // 0, timeout_s=WAIT_S)


def test_a_call_no_worker_picks_up_fails_by_its_deadline_and_never_runs_later(
    make_workers: Callable[[str, int], Workers],
) -> None:
    workers = make_workers("units-late", 1)
    started, release = threading.Event(), threading.Event()

    def busy(_: None) -> None:
        started.set()
        release.wait(WAIT_S)

    blocking: Future[None] = workers.submit(busy, None)
    assert started.wait(WAIT_S)
    ran: list[str] = []
    with pytest.raises(CallError) as caught:
        workers.call(lambda: ran.append("late"), timeout_s=0.01)  # waits 0.01 s + QUEUE_GRACE_S
    assert caught.value.status is Status.DEADLINE
    assert "no worker answered within 0.01 s" in caught.value.message
    release.set()
    blocking.result(WAIT_S)
    workers.submit(lambda _: None, None).result(WAIT_S)  # everything queued before it has been taken
    assert not ran


def test_a_lazy_pool_starts_a_thread_only_for_work_that_would_wait_and_grows_its_limit() -> None:
    """A shared HTTP connection pool: calls one after another keep one thread (one connection); concurrent calls
    start more, up to the limit, which each model joining the pool raises."""
    workers = Workers("units-lazy", 2, lazy=True)
    try:
        for i in range(20):  # the caller hears back only once the thread is counted free again
            assert workers.call(lambda i=i: i, timeout_s=WAIT_S) == i
        assert workers.started == 1
        workers.grow(1)
        assert (workers.count, workers.started) == (3, 1)
        release = threading.Event()
        futures = [workers.submit(lambda _: release.wait(WAIT_S), None) for _ in range(4)]
        assert workers.started == 3  # the fourth waits for a free thread
        release.set()
        assert all(f.result(timeout=WAIT_S) for f in futures)
        assert workers.started == 3
    finally:
        workers.stop(join_timeout_s=WAIT_S)
    assert not threads_named("units-lazy")
