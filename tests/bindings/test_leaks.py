"""No leaks: 5,000 requests after warm-up keep RSS within 5 %, and nothing the binding made is left alive.

The loop runs with the cyclic garbage collector off: every request, response, buffer and handle must be
freed by reference counting alone (no cycles), and the count of live wrappers is checked after it. So do
the failing inferences: an allocator that raises for the second of two outputs, a response callback that
raises; their errors are still held by the caller when the counts are checked.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from .conftest import run_case

pytestmark = pytest.mark.triton

PRELUDE = """
import gc
import numpy as np
from monai_triton_ops import bindings as b
from monai_triton_ops.bindings._object import TritonObject
from tests import triton_models
from tests.bindings.harness import case_server, make_request, rss_bytes, submit

def fast(repo):
    triton_models.passthrough(repo, "fast")

def wrappers():
    return sum(1 for o in gc.get_objects() if isinstance(o, TritonObject))

def two_outputs(repo):
    triton_models.identity(repo, "two", dtypes=("TYPE_FP32", "TYPE_FP32"), dims=(-1,))

class Boom(Exception):
    pass

def raised_in(exc):
    return "".join(getattr(exc, "__notes__", []))

def expect_deleted(response, because):
    try:
        response.output_count
    except b.OwnershipError as exc:
        assert because in str(exc), exc
    else:
        raise AssertionError(f"the response is still usable: not deleted when {because}")
"""


def case(body: str) -> str:
    return run_case(PRELUDE + textwrap.dedent(body), timeout_s=300).stdout


def test_five_thousand_requests_keep_rss_flat_and_free_everything() -> None:
    out = case("""
    with case_server(fast, ["fast"]) as started:
        server, allocator = started.server, b.ArrayAllocator()
        x = np.arange(16, dtype=np.float32)

        def run(n):
            for _ in range(n):
                future, outcome = submit(server, "fast", {"INPUT__0": x}, allocator=allocator)
                future.result(30)
                assert outcome.outputs["OUTPUT__0"][15] == 15

        run(200)
        gc.collect()
        handles, objects, rss = b.live_handles(), wrappers(), rss_bytes()
        gc.disable()
        run(5000)
        assert b.live_handles() == handles and allocator.buffers_in_use == 0
        assert wrappers() == objects, (wrappers(), objects)
        gc.enable()
        print("rss", rss, rss_bytes())
    """)
    before, after = map(int, re.search(r"rss (\d+) (\d+)", out).groups())  # type: ignore[union-attr]
    print(f"RSS after warm-up {before / 2**20:.1f} MiB, after 5,000 requests {after / 2**20:.1f} MiB")
    assert after <= before * 1.05, f"RSS grew from {before} to {after} bytes over 5,000 requests"


def test_failing_requests_leak_nothing_either() -> None:
    out = case("""
    with case_server(fast, ["fast"]) as started:
        server = started.server

        def run(n):
            for _ in range(n):
                try:
                    submit(server, "fast", {"NOT_AN_INPUT": np.ones(4, np.float32)})
                except b.InvalidArgumentError:
                    pass
                else:
                    raise AssertionError("an unknown input was accepted")

        run(200)
        gc.collect()
        handles, objects, rss = b.live_handles(), wrappers(), rss_bytes()
        gc.disable()
        run(3000)
        assert b.live_handles() == handles
        assert wrappers() == objects, (wrappers(), objects)
        gc.enable()
        print("rss", rss, rss_bytes())
    """)
    before, after = map(int, re.search(r"rss (\d+) (\d+)", out).groups())  # type: ignore[union-attr]
    print(f"RSS after warm-up {before / 2**20:.1f} MiB, after 3,000 failed submissions {after / 2**20:.1f} MiB")
    assert after <= before * 1.05, f"RSS grew from {before} to {after} bytes over 3,000 failed submissions"


def test_a_failed_second_allocation_releases_the_first_buffer_and_the_response() -> None:
    case("""
    with case_server(two_outputs, ["two"]) as started:
        server, x = started.server, np.arange(4, dtype=np.float32)
        allocated, released = [], []

        def alloc(allocator, name, size, kind, device, calls):
            calls.append(name)
            if len(calls) == 2:
                raise Boom(f"no memory for {name}")
            array = np.empty(size, np.uint8)
            allocated.append(int(array.ctypes.data))
            return int(array.ctypes.data), array, b.TRITONSERVER_MemoryType.CPU, 0

        def release(allocator, address, array, size, kind, device):
            released.append(address)

        def read(response, flags, _):
            if response is not None:
                response.output_count  # raises the response's error, chained to Boom

        allocator = b.TRITONSERVER_ResponseAllocator(alloc, release)

        def run(response_fn, kept):
            request = make_request(server, "two", {"INPUT__0": x, "INPUT__1": x})
            request.set_response_callback(allocator, [], response_fn, kept)
            future = server.infer_async(request)
            del request
            try:
                future.result(30)
            except Boom as exc:
                return exc
            raise AssertionError("the allocator's exception did not reach the caller")

        gc.collect()
        handles, objects = b.live_handles(), wrappers()
        gc.disable()
        errors = [run(read, None) for _ in range(20)]
        assert len(allocated) == 20 and len(released) == 20, (len(allocated), len(released))
        assert allocator.buffers_in_use == 0 and b.live_handles() == handles, (b.live_handles(), handles)
        assert wrappers() == objects, (wrappers(), objects)  # the errors the caller holds keep none
        assert all("no memory for OUTPUT__" in str(e) and "in alloc" in raised_in(e) for e in errors), errors
        kept = []  # a callback that keeps the response and returns: its outputs are unusable, it is deleted
        run(lambda response, flags, kept: kept.append(response) if response else None, kept)
        expect_deleted(kept.pop(), "an allocation of its outputs failed")
        assert allocator.buffers_in_use == 0 and b.live_handles() == handles
        gc.enable()
    """)


def test_a_raising_response_callback_releases_its_response() -> None:
    case("""
    with case_server(two_outputs, ["two"]) as started:
        server, x = started.server, np.arange(4, dtype=np.float32)
        allocator = b.ArrayAllocator()

        def fail(response, flags, kept):
            if response is not None:
                if kept is not None:
                    kept.append(response)
                raise Boom("the callback failed")

        def run(kept):
            request = make_request(server, "two", {"INPUT__0": x, "INPUT__1": x})
            request.set_response_callback(allocator, None, fail, kept)
            future = server.infer_async(request)
            del request
            try:
                future.result(30)
            except Boom as exc:
                return exc
            raise AssertionError("the response callback's exception did not reach the caller")

        gc.collect()
        handles, objects = b.live_handles(), wrappers()
        gc.disable()
        errors = [run(None) for _ in range(20)]
        assert allocator.buffers_in_use == 0 and b.live_handles() == handles, (b.live_handles(), handles)
        assert wrappers() == objects, (wrappers(), objects)  # the errors the caller holds keep none
        assert all("in fail" in raised_in(e) for e in errors), [raised_in(e) for e in errors]
        kept = []  # a callback that keeps the response, then raises: it did not take it, it is deleted
        run(kept)
        expect_deleted(kept.pop(), "its response callback raised")
        assert allocator.buffers_in_use == 0 and b.live_handles() == handles
        gc.enable()
    """)
