"""The request path's own promises: retries are a loop on the worker bounded by the deadline, counted exactly; no
thread per retry; one pool of ``max_in_flight`` threads; ``submit`` never waits for the network; a cancel frees a
worker waiting out a backoff; open/close cycles leave no threads or files. And ``infer()`` over gRPC on the
caller's thread: counted with submitted requests against ``max_in_flight``, ended by its deadline and by ``close()``.

Attempts are counted by the server, not by us: a model that answers every request with ``UNAVAILABLE`` (what Triton
says for a full queue or a model still loading) fails each attempt, and the statistics endpoint's execution count
is the number of attempts that reached it (2.51 counts an error response as a successful execution).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from monai_triton_ops import create_backend
from monai_triton_ops.errors import BackendStateError, InferenceTimeoutError, ServerUnavailableError
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ... import triton_models
from .conftest import Open, executions, serve, url

pytestmark = pytest.mark.triton
SCHEMES = ["grpc", "http"]


@pytest.fixture(scope="module")
def server(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    repo = tmp_path_factory.mktemp("request_path") / "repo"
    triton_models.write_python_model(
        repo,
        "busy",
        inputs=triton_models.FP32_IN,
        outputs=triton_models.FP32_OUT,
        execute="responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("
        "'busy, try later', pb_utils.TritonError.UNAVAILABLE)))\n",
    )
    triton_models.identity(repo, "ident", dims=(-1,))
    triton_models.slow(repo, "two_seconds", delay_s=2.0)
    yield from serve(repo, tmp_path_factory.mktemp("server_tmp"))


def _attempts(error: BaseException) -> int:
    found = re.search(r"after (\d+) attempts", str(error))
    assert found, f"the error does not say how many attempts were made: {error}"
    return int(found.group(1))


_X = np.ones(4, np.float32)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_transient_error_is_tried_exactly_retries_plus_one_times_and_the_error_says_so(
    server: LocalTritonServer, open_backend: Open, scheme: str
) -> None:
    backend = open_backend(f"{url(server, scheme)}?retries=3&backoff_s=0.01&max_backoff_s=0.02", "busy")
    before = executions(backend)
    with pytest.raises(ServerUnavailableError, match=r"model 'busy' on .*busy, try later") as caught:
        backend.infer({"INPUT__0": _X}, timeout_s=60)
    assert _attempts(caught.value) == 4
    assert executions(backend) - before == 4


@pytest.mark.parametrize("scheme", SCHEMES)
def test_retries_stop_at_the_deadline_and_the_count_matches_the_servers(
    server: LocalTritonServer, open_backend: Open, scheme: str
) -> None:
    """Many retries allowed, a short deadline: no backoff wait ends past it, so the loop stops there.

    It ends with the last attempt's error, which counts the attempts; or, when the deadline cut an attempt in flight
    (a loaded machine), with the deadline's error. Either way the server saw a number of attempts the deadline
    bounds, far below the thousand allowed.
    """
    backend = open_backend(f"{url(server, scheme)}?retries=1000&backoff_s=0.05&max_backoff_s=0.05", "busy")
    before = executions(backend)
    with pytest.raises((ServerUnavailableError, InferenceTimeoutError)) as caught:
        backend.infer({"INPUT__0": _X}, timeout_s=1.0)
    seen = executions(backend) - before
    assert 1 < seen < 100  # 25-50 ms per wait: about 20-40 attempts fit in a second
    if isinstance(caught.value, ServerUnavailableError):
        assert _attempts(caught.value) == seen


def test_retries_start_no_thread(server: LocalTritonServer, open_backend: Open) -> None:
    """Each retry used to start a ``threading.Timer``; now a worker waits out the backoff itself."""
    backend = open_backend(f"{server.grpc_url}?max_in_flight=4&retries=30&backoff_s=0.01&max_backoff_s=0.02", "busy")
    with pytest.raises(ServerUnavailableError):  # warm-up: whatever starts once per process has started
        backend.infer({"INPUT__0": _X}, timeout_s=60)
    threads_before = {t.ident for t in threading.enumerate()}
    futures = [backend.submit({"INPUT__0": _X}, timeout_s=60) for _ in range(4)]
    seen: set[int | None] = set()
    while not all(f.done() for f in futures):
        seen |= {t.ident for t in threading.enumerate()}
        time.sleep(0.002)
    assert all(isinstance(f.exception(), ServerUnavailableError) for f in futures)
    assert sum(_attempts(f.exception()) for f in futures) == 4 * 31  # type: ignore[arg-type]
    assert seen <= threads_before


@pytest.mark.parametrize("scheme", SCHEMES)
def test_one_pool_of_max_in_flight_threads_runs_every_request_and_goes_at_close(
    server: LocalTritonServer, scheme: str
) -> None:
    before = {t.ident for t in threading.enumerate()}
    backend = create_backend(f"{url(server, scheme)}?max_in_flight=3&shared_memory=system", "ident").open()
    futures = [backend.submit({"INPUT__0": _X * i}) for i in range(30)]
    for i, future in enumerate(futures):
        np.testing.assert_array_equal(future.result(timeout=60)["OUTPUT__0"], _X * i)
    ours = [t for t in threading.enumerate() if t.ident not in before]
    workers = [t for t in ours if t.name.startswith("remote-ident-")]
    assert len(workers) == 3
    backend.close(timeout_s=30)
    assert not any(t.is_alive() for t in workers)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_submit_never_waits_for_a_shared_memory_registration(
    server: LocalTritonServer, open_backend: Open, scheme: str
) -> None:
    """A mock, for what cannot be caused for real: a server slow to register a region (the first request of a new
    size grows its slot). ``submit()`` returns at once; the registration runs on a worker, not the caller's thread."""
    backend = open_backend(f"{url(server, scheme)}?shared_memory=system&max_in_flight=1", "ident")
    transport = backend._fleet.members.only_server().transport  # type: ignore[attr-defined]
    register = transport.register_system_shm
    started, release = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def slow_register(name: str, key: str, byte_size: int, *, timeout_s: float) -> None:
        threads.append(threading.current_thread())
        started.set()
        release.wait(timeout=60)
        register(name, key, byte_size, timeout_s=timeout_s)

    transport.register_system_shm = slow_register
    big = np.arange(1 << 20, dtype=np.float32)  # 4 MB: more than the first slot holds
    future = backend.submit({"INPUT__0": big}, timeout_s=120)
    assert started.wait(timeout=60)
    assert not future.done()
    assert threads
    assert all(t is not threading.current_thread() for t in threads)
    release.set()
    np.testing.assert_array_equal(future.result(timeout=60)["OUTPUT__0"], big)


def test_cancelling_a_request_ends_its_backoff_wait_and_frees_the_worker(
    server: LocalTritonServer, open_backend: Open
) -> None:
    backend = open_backend(f"{server.grpc_url}?max_in_flight=1&retries=5&backoff_s=30&max_backoff_s=30", "busy")
    before = executions(backend)  # earlier tests of the module ran 'busy' too
    first = backend.submit({"INPUT__0": _X}, timeout_s=120)
    deadline = time.monotonic() + 30
    while executions(backend) == before and time.monotonic() < deadline:  # its first attempt failed: in backoff
        time.sleep(0.05)
    assert executions(backend) > before, "the first attempt never reached the server"
    assert first.cancel() or first.done()
    # One worker: had it stayed in its 30 s backoff, this request would meet its 5 s deadline in the queue.
    with pytest.raises(ServerUnavailableError):
        backend.infer({"INPUT__0": _X}, timeout_s=5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_open_close_cycles_leave_no_threads_or_open_files(server: LocalTritonServer, scheme: str) -> None:
    """HTTP workers each own a client and a gevent hub: both must go with the worker, on its own thread."""

    def cycle() -> None:
        with create_backend(f"{url(server, scheme)}?max_in_flight=2", "ident") as backend:
            for i in range(4):
                np.testing.assert_array_equal(backend.infer({"INPUT__0": _X * i})["OUTPUT__0"], _X * i)

    cycle()  # the first cycle may start process-wide things once (the janitor, the deadline thread, gRPC's own)
    files, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for _ in range(4):
        cycle()
    # A leak stays; gRPC closes a channel's sockets a moment after close() returns.
    deadline = time.monotonic() + 10
    while len(os.listdir("/proc/self/fd")) > files and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(os.listdir("/proc/self/fd")) <= files
    assert threading.active_count() <= threads


# -- infer() on the caller's thread (gRPC) ------------------------------------------------------------
def _spy_on_sends(backend: object) -> tuple[list[threading.Thread], list[int]]:
    """Record the thread of every attempt and the most attempts out at once (a spy: the real send runs)."""
    exchange = backend._exchange  # type: ignore[attr-defined]
    send, lock = exchange.send, threading.Lock()
    threads: list[threading.Thread] = []
    out, most = [0], [0]

    def spying(transport: object, request: object) -> object:
        with lock:
            threads.append(threading.current_thread())
            out[0] += 1
            most[0] = max(most[0], out[0])
        try:
            return send(transport, request)
        finally:
            with lock:
                out[0] -= 1

    exchange.send = spying
    return threads, most


@pytest.mark.parametrize("scheme", SCHEMES)
def test_infer_runs_on_the_callers_thread_and_http_calls_on_the_servers_connection_pool(
    server: LocalTritonServer, open_backend: Open, scheme: str
) -> None:
    """``infer()`` sends from the caller's thread on both protocols; tritonclient's HTTP client belongs to the thread
    that made it, so an HTTP call itself runs on the server's connection pool (one per server in the process)."""
    backend = open_backend(f"{url(server, scheme)}?shared_memory=system", "ident")
    threads, _ = _spy_on_sends(backend)
    for i in range(3):
        np.testing.assert_array_equal(backend.infer({"INPUT__0": _X * i})["OUTPUT__0"], _X * i)
    assert threads == [threading.current_thread()] * 3
    pool = [t.name for t in threading.enumerate() if t.name.startswith(f"http-127.0.0.1:{server.http_port}-")]
    assert len(pool) == (1 if scheme == "http" else 0), pool  # calls one at a time: one thread, one connection


def test_inline_and_submitted_requests_share_max_in_flight(server: LocalTritonServer, open_backend: Open) -> None:
    backend = open_backend(f"{server.grpc_url}?max_in_flight=2&shared_memory=system", "ident")
    threads, most = _spy_on_sends(backend)
    results: dict[tuple[int, int], np.ndarray] = {}

    def caller(k: int) -> None:
        for i in range(15):
            results[k, i] = backend.infer({"INPUT__0": _X * (100 * k + i)})["OUTPUT__0"]

    callers = [threading.Thread(target=caller, args=(k,)) for k in range(3)]
    for thread in callers:
        thread.start()
    futures = [backend.submit({"INPUT__0": _X * -i}) for i in range(30)]
    for thread in callers:
        thread.join(timeout=120)
    for i, future in enumerate(futures):
        np.testing.assert_array_equal(future.result(timeout=60)["OUTPUT__0"], _X * -i)
    for (k, i), out in results.items():
        np.testing.assert_array_equal(out, _X * (100 * k + i))
    assert len(results) == 45
    assert most[0] <= 2
    assert any(t in callers for t in threads), "no infer() ran on its caller's thread"
    assert any(t.name.startswith("remote-ident-") for t in threads)


def test_an_inline_call_ends_at_its_deadline(server: LocalTritonServer, open_backend: Open) -> None:
    """The gRPC call carries the time left: the caller gets the deadline's error then, not when the model is done."""
    backend = open_backend(f"{server.grpc_url}?shared_memory=system", "two_seconds")
    started = time.monotonic()
    with pytest.raises(InferenceTimeoutError, match=r"model 'two_seconds': no answer within the deadline of 0\.3 s"):
        backend.infer({"INPUT__0": _X}, timeout_s=0.3)
    assert time.monotonic() - started < 1.6  # the model takes 2 s


def test_close_ends_an_inline_call_waiting_out_a_backoff(server: LocalTritonServer, open_backend: Open) -> None:
    backend = open_backend(f"{server.grpc_url}?retries=5&backoff_s=30&max_backoff_s=30", "busy")
    before = executions(backend)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            backend.infer({"INPUT__0": _X}, timeout_s=120)
        except BaseException as exc:  # read below
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 30
    while executions(backend) == before and time.monotonic() < deadline:  # its first attempt failed: in backoff
        time.sleep(0.05)
    backend.close(timeout_s=0.1)
    caller.join(timeout=10)  # not the 30 s backoff
    assert not caller.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], BackendStateError), outcome
