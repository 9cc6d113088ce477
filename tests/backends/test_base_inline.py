"""``infer()`` on the caller's thread: what the base promises for a request whose ``_infer`` it runs there.

A backend that allows it (``_can_infer_here``) has a one-request ``infer()`` run on the calling thread
while fewer than ``max_in_flight`` requests are out. These tests hold it to the same promises as a request
handed to the pool: its place among ``max_in_flight`` (shared with submitted requests), the deadline and its
message, ``close()`` waiting for it and cutting it off (with ``_cancel``), every error, and the thread it ran
on. The backend here is written for the test (a request does what the test says, on whichever thread the base
runs it); everything under test is the real ``BaseBackend``. The remote backend's own run is tested against
a real server in ``remote/test_request_path.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch

from monai_triton_ops.backends.base import BackendState, BaseBackend, InferRequest
from monai_triton_ops.backends.options import BackendOptions
from monai_triton_ops.client.workers import Workers
from monai_triton_ops.errors import BackendStateError, InferenceError, InferenceTimeoutError
from monai_triton_ops.signature import ModelSignature

from .test_base import SIGNATURE, X

Behaviour = Callable[[InferRequest], Mapping[str, Any]]


def _echo(request: InferRequest) -> Mapping[str, Any]:
    return {"y": request.inputs["x"]}


class Here(BaseBackend):
    """Runs ``behaviour(request)`` wherever the base puts the request, recording where and how many were out."""

    kind = "here"

    def __init__(self, behaviour: Behaviour = _echo, *, inline: bool = True, **options: Any) -> None:
        super().__init__("m", options=BackendOptions(**options))
        self.behaviour = behaviour
        self.inline = inline
        self.ran: list[tuple[str, threading.Thread]] = []  # ("here" | "pool", the thread)
        self.most_in_flight = 0
        self.cancelled = threading.Event()
        self._record = threading.Lock()

    def _open(self) -> ModelSignature:
        return SIGNATURE

    def _can_infer_here(self) -> bool:
        return self.inline

    def _infer(self, request: InferRequest) -> Mapping[str, Any]:
        return self._run("pool" if Workers.on_worker() else "here", request)

    def _cancel(self, request: InferRequest) -> None:
        self.cancelled.set()

    def _run(self, where: str, request: InferRequest) -> Mapping[str, Any]:
        with self._record:
            self.ran.append((where, threading.current_thread()))
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return self.behaviour(request)


@pytest.fixture
def opened() -> Iterator[list[BaseBackend]]:
    backends: list[BaseBackend] = []
    yield backends
    for backend in backends:
        backend.close(timeout_s=10)


def _open(opened: list[BaseBackend], behaviour: Behaviour = _echo, **options: Any) -> Here:
    backend = Here(behaviour, **options).open()
    opened.append(backend)
    return backend


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on a new thread; its result or error lands in the returned dict."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as exc:  # the test reads it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.005)


def test_infer_runs_on_the_callers_thread_submit_and_split_batches_on_the_pool(opened: list[BaseBackend]) -> None:
    backend = _open(opened)
    out = backend.infer({"x": X})
    np.testing.assert_array_equal(out["y"], X)
    assert backend.ran == [("here", threading.current_thread())]
    assert isinstance(backend.infer({"x": torch.ones(1, 2)})["y"], torch.Tensor)  # the caller's family, as ever
    backend.submit({"x": X}).result(timeout=10)
    assert backend.ran[-1][0] == "pool"
    assert backend.ran[-1][1] is not threading.current_thread()
    backend.ran.clear()
    backend.infer({"x": np.ones((3, 2), np.float32)})  # max_batch_size 2: two requests, handed to the pool
    assert [where for where, _ in backend.ran] == ["pool", "pool"]
    no_inline = _open(opened, inline=False)
    no_inline.infer({"x": X})
    assert no_inline.ran[0][0] == "pool"  # a backend that does not allow it is never asked
    assert backend.in_flight == 0


def test_an_inline_call_takes_its_place_among_max_in_flight_with_submitted_requests(
    opened: list[BaseBackend],
) -> None:
    """One limit for both: an inline call counts as a request out; with every place taken, ``infer()`` waits in the
    queue and runs on the pool; a request submitted while an inline call holds the last place waits for it."""
    gate = threading.Event()

    def blocking(request: InferRequest) -> Mapping[str, Any]:
        if float(np.asarray(request.inputs["x"])[0, 0]) == 2.0:
            assert gate.wait(timeout=30)
        return _echo(request)

    backend = _open(opened, blocking, max_in_flight=2)
    held = backend.submit({"x": X * 2})
    _wait_for(lambda: backend.in_flight == 1)
    backend.infer({"x": X})  # one place left: runs here, with the submitted one out
    assert backend.ran[-1] == ("here", threading.current_thread())
    assert backend.most_in_flight == 2
    also_held = backend.submit({"x": X * 2})
    _wait_for(lambda: len(backend.ran) == 3)
    thread, outcome = _in_thread(lambda: backend.infer({"x": X * 3}))  # no place: queued behind the two
    time.sleep(0.1)
    assert len(backend.ran) == 3
    gate.set()
    thread.join(timeout=30)
    np.testing.assert_array_equal(outcome["result"]["y"], X * 3)
    assert backend.ran[-1][0] == "pool"
    assert backend.ran[-1][1] is not thread
    for future in (held, also_held):
        future.result(timeout=10)
    assert backend.most_in_flight == 2

    release = threading.Event()
    single = _open(opened, lambda r: (release.wait(timeout=30), _echo(r))[1], max_in_flight=1)
    thread, outcome = _in_thread(lambda: single.infer({"x": X}))
    _wait_for(lambda: single.in_flight == 1)
    queued = single.submit({"x": X})  # the inline call holds the only place
    time.sleep(0.1)
    assert not queued.done()
    assert single.in_flight == 1
    release.set()
    thread.join(timeout=30)
    np.testing.assert_array_equal(queued.result(timeout=10)["y"], X)
    assert [where for where, _ in single.ran] == ["here", "pool"]
    assert single.most_in_flight == 1


def test_an_inline_call_meets_its_deadline_with_the_usual_error(opened: list[BaseBackend]) -> None:
    """The backend keeps the deadline on the caller's thread; its error reads as the caller's deadline, and an answer
    that comes after the deadline is that error too, as a timer would have had it on the pool."""

    def keeps_deadline(request: InferRequest) -> Mapping[str, Any]:
        time.sleep(max(0.0, request.remaining_s() or 0.0))
        raise InferenceTimeoutError("transport deadline")

    backend = _open(opened, keeps_deadline)
    with pytest.raises(InferenceTimeoutError, match=r"model 'm': no answer within the deadline of 0\.1 s") as info:
        backend.infer({"x": X}, timeout_s=0.1)
    assert "transport deadline" in str(info.value.__cause__)
    assert backend.ran[-1][0] == "here"

    late = _open(opened, lambda r: (time.sleep(0.3), _echo(r))[1])
    with pytest.raises(InferenceTimeoutError, match=r"no answer within the deadline of 0\.1 s"):
        late.infer({"x": X}, timeout_s=0.1)
    np.testing.assert_array_equal(late.infer({"x": X}, timeout_s=30)["y"], X)  # in time: the answer
    assert late.in_flight == 0


def test_close_waits_for_an_inline_call_then_cuts_it_off_and_cancels_it(opened: list[BaseBackend]) -> None:
    backend = Here(lambda r: (backend.cancelled.wait(timeout=30), _echo(r))[1]).open()
    thread, outcome = _in_thread(lambda: backend.infer({"x": X}))
    _wait_for(lambda: backend.in_flight == 1)
    backend.close(timeout_s=0.05)
    assert backend.cancelled.is_set()  # the request was told to stop
    thread.join(timeout=30)
    assert isinstance(outcome.get("error"), BackendStateError), outcome
    assert "closed after waiting 0.05 s" in str(outcome["error"])
    assert backend.state is BackendState.CLOSED

    release = threading.Event()
    patient = Here(lambda r: (release.wait(timeout=30), _echo(r))[1]).open()
    thread, outcome = _in_thread(lambda: patient.infer({"x": X}))
    _wait_for(lambda: patient.in_flight == 1)
    closer, _ = _in_thread(lambda: patient.close(timeout_s=30))
    time.sleep(0.1)
    assert closer.is_alive()  # close() waits for the call running on the caller's thread
    release.set()
    closer.join(timeout=30)
    thread.join(timeout=30)
    np.testing.assert_array_equal(outcome["result"]["y"], X)
    assert not patient.cancelled.is_set()


@pytest.mark.parametrize(
    ("behaviour", "error", "match"),
    [
        (lambda r: (_ for _ in ()).throw(ValueError("boom")), InferenceError, r"here backend failed: ValueError"),
        (lambda r: {"z": X}, InferenceError, r"returned outputs \['z'\], requested \['y'\]"),
        (lambda r: {"y": X.astype(np.float64)}, InferenceError, "output 'y': expected dtype FP32, got FP64"),
        (lambda r: (_ for _ in ()).throw(KeyboardInterrupt()), KeyboardInterrupt, None),
    ],
    ids=["foreign-error", "names", "dtype", "interrupt"],
)
def test_what_an_inline_call_raises_reaches_the_caller_and_frees_its_place(
    opened: list[BaseBackend], behaviour: Behaviour, error: type[BaseException], match: str | None
) -> None:
    backend = _open(opened, behaviour, max_in_flight=1)
    with pytest.raises(error, match=match):
        backend.infer({"x": X})
    assert backend.ran[-1][0] == "here"
    assert backend.in_flight == 0
    backend.behaviour = _echo
    np.testing.assert_array_equal(backend.infer({"x": X})["y"], X)  # its place is free again
    started = time.monotonic()
    backend.close(timeout_s=30)  # nothing left to wait for
    assert time.monotonic() - started < 5
