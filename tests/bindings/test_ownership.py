"""Ownership as the C API defines it, enforced: each case runs in its own interpreter, so a crash fails the case.

The cases run under ``MALLOC_CHECK_=3`` (glibc aborts on a double free or a corrupted heap) and end with the
harness's checks: server deleted, no stub process and no shared memory of its prefix left.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from .conftest import run_case

pytestmark = pytest.mark.triton
MALLOC_CHECKED = {**os.environ, "MALLOC_CHECK_": "3"}

PRELUDE = """
import gc
import numpy as np
from monai_triton_ops import bindings as b
from tests import triton_models
from tests.bindings.harness import case_server, make_request, submit, Outcome

def slow(repo):
    triton_models.passthrough(repo, "slow", delay_s=0.3)
    triton_models.passthrough(repo, "fast")

def read(response, flags, outcome):
    if response is not None:
        outcome.outputs["OUTPUT__0"] = response.output_array(0)
"""


def case(body: str, **kwargs: object) -> str:
    return run_case(PRELUDE + textwrap.dedent(body), env=MALLOC_CHECKED, **kwargs).stdout  # type: ignore[arg-type]


def test_a_request_referenced_twice_is_not_freed_while_triton_uses_it() -> None:
    out = case("""
    with case_server(slow, ["slow"]) as started:
        server = started.server
        baseline = b.live_handles()
        x = np.arange(1000, dtype=np.float32)
        req = make_request(server, "slow", {"INPUT__0": x})
        outcome = Outcome()
        req.set_response_callback(b.ArrayAllocator(), None, read, outcome)
        req_2 = req
        future = server.infer_async(req)
        del req
        del req_2
        gc.collect()
        garbage = np.full(10_000_000, 9, np.float32)
        future.result(30)
        np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], x)
        assert b.live_handles() == baseline, (b.live_handles(), baseline)
    print("exact after both references were deleted mid-flight")
    """)
    assert "exact after both references" in out


def test_every_reference_sees_the_handover_and_the_return() -> None:
    out = case("""
    with case_server(slow, ["slow"]) as started:
        server = started.server
        req = make_request(server, "slow", {"INPUT__0": np.ones(3, np.float32)})
        req.set_response_callback(b.ArrayAllocator(), None, read, Outcome())
        req_2 = req
        future = server.infer_async(req)
        for use in (lambda: req_2.id, lambda: req_2.add_requested_output("X"), req_2.delete,
                    lambda: server.infer_async(req_2)):
            try:
                use()
            except b.OwnershipError as exc:
                assert "belongs to Triton" in str(exc), exc
            else:
                raise AssertionError("a handed-over request was usable")
        future.result(30)
        req_2.id = "mine again"  # released: Python's again, through every reference
        assert req.id == "mine again"
        req.delete()
        for use in (lambda: req_2.id, req_2.delete, lambda: server.infer_async(req_2)):
            try:
                use()
            except b.OwnershipError as exc:
                assert "was deleted" in str(exc), exc
            else:
                raise AssertionError("a deleted request was usable")
    print("handover seen by every reference")
    """)
    assert "handover seen by every reference" in out


def test_dropping_everything_mid_flight_for_a_thousand_requests() -> None:
    out = case("""
    with case_server(slow, ["fast"]) as started:
        server = started.server
        baseline = b.live_handles()
        futures = []
        for i in range(1000):
            req = make_request(server, "fast", {"INPUT__0": np.full(4, i, np.float32)})
            seen = []
            req.set_response_callback(b.ArrayAllocator(), seen, lambda r, f, s: s.append(r and r.output_array(0)), seen)
            req.set_release_callback(lambda r, f, u: None, object())
            futures.append(server.infer_async(req))
            del req, seen
            if i % 100 == 0:
                gc.collect()
        for future in futures:
            future.result(60)
        gc.collect()
        assert b.live_handles() == baseline
    print("1000 requests, no references kept")
    """)
    assert "1000 requests" in out


def test_failed_submissions_leave_nothing_behind() -> None:
    out = case("""
    def repo(path):
        triton_models.passthrough(path, "fast")
        triton_models.slow(path, "queued", delay_s=1.0, max_queue_size=1)
    with case_server(repo, ["fast", "queued"]) as started:
        server = started.server
        baseline = b.live_handles()
        released = []
        for _ in range(1000):
            trace = b.TRITONSERVER_InferenceTrace(b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS, 0,
                                                  lambda *a: None, lambda t, u: released.append(1))
            req = make_request(server, "fast", {"INPUT__0": np.ones(2, np.int64)})
            req.set_response_callback(b.ArrayAllocator(), None, lambda *a: None)
            try:
                server.infer_async(req, trace)
            except b.InvalidArgumentError:
                pass
            else:
                raise AssertionError("a wrong dtype was accepted")
            assert req.owner_state is b.State.OWNED and trace.owner_state is b.State.OWNED
        del req, trace
        gc.collect()
        assert b.live_handles() == baseline, (b.live_handles(), baseline)
        assert len(released) <= 1000
        # the queue holds one request, the instance runs one: the third is refused synchronously
        futures, refused = [], []
        for i in range(3):
            trace = b.TRITONSERVER_InferenceTrace(b.TRITONSERVER_InferenceTraceLevel.TIMESTAMPS, 0,
                                                  lambda *a: None, None)
            req = make_request(server, "queued", {"INPUT__0": np.ones((1, 1), np.float32)})
            req.set_response_callback(b.ArrayAllocator(), None, lambda *a: None)
            try:
                futures.append(server.infer_async(req, trace))
            except b.UnavailableError as exc:
                refused.append(str(exc))
                assert req.owner_state is b.State.OWNED and trace.owner_state is b.State.OWNED
        assert refused and "queue" in refused[0], refused
        for future in futures:
            try:
                future.result(30)
            except b.TritonError:
                pass
        del req, trace
        gc.collect()
        assert b.live_handles() == baseline
    print("failed submissions: nothing left")
    """)
    assert "nothing left" in out


def test_an_allocator_in_use_cannot_be_deleted() -> None:
    out = case("""
    with case_server(slow, ["fast"]) as started:
        server = started.server
        allocator = b.ArrayAllocator()
        kept = []
        req = make_request(server, "fast", {"INPUT__0": np.arange(4, dtype=np.float32)})
        req.set_response_callback(allocator, None, lambda r, f, k: k.append(r) if r else None, kept)
        server.infer_async(req).result(30)
        req.delete()
        try:
            allocator.delete()
        except b.OwnershipError as exc:
            assert "1 output buffer" in str(exc), exc
        else:
            raise AssertionError("deleted an allocator whose buffer a response holds")
        output = kept[0].output_array(0)
        kept.clear()
        gc.collect()
        allocator.delete()
        garbage = np.full(50_000_000, 1, np.float32)
        np.testing.assert_array_equal(output, [0, 1, 2, 3])
    print("allocator deleted after its responses")
    """)
    assert "allocator deleted after its responses" in out


def test_stop_deletes_responses_python_still_holds() -> None:
    out = case("""
    with case_server(slow, ["fast"], exit_timeout_s=3) as started:
        server = started.server
        kept = []
        req = make_request(server, "fast", {"INPUT__0": np.ones(2, np.float32)})
        req.set_response_callback(b.ArrayAllocator(), None, lambda r, f, k: k.append(r) if r else None, kept)
        server.infer_async(req).result(30)
        server.stop()
        try:
            kept[0].output(0)
        except b.OwnershipError as exc:
            assert "its server was stopped" in str(exc), exc
        else:
            raise AssertionError("a response outlived its server's stop")
        try:
            req.id
        except b.OwnershipError:
            pass
        log = started.log()
    assert "Exit timeout expired" not in log, log[-2000:]
    print("stop did not wait for a held response")
    """)
    assert "stop did not wait" in out


def test_a_delete_that_times_out_finishes_when_the_request_lands() -> None:
    out = case("""
    def repo(path):
        triton_models.passthrough(path, "very_slow", delay_s=4.0)
    with case_server(repo, ["very_slow"], exit_timeout_s=1) as started:
        server = started.server
        outcome = Outcome()
        req = make_request(server, "very_slow", {"INPUT__0": np.ones(2, np.float32)})
        req.set_response_callback(b.ArrayAllocator(), None, read, outcome)
        future = server.infer_async(req)
        del req
        try:
            server.delete()
        except b.TritonError as exc:
            print("delete raised:", type(exc).__name__, exc)
        else:
            raise AssertionError("delete returned with a request in flight past the exit timeout")
        future.result(30)  # the model finished: the response still came
        assert server.wait_deleted(30) and server.deleted
    print("deleted after the request landed")
    """)
    assert "delete raised: InternalError" in out
    assert "deleted after the request landed" in out
