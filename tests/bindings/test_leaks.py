"""No leaks: 5,000 requests after warm-up keep RSS within 5 %, and nothing the binding made is left alive.

The loop runs with the cyclic garbage collector off: every request, response, buffer and handle must be
freed by reference counting alone (no cycles), and the count of live wrappers is checked after it.
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
from tests.bindings.harness import case_server, rss_bytes, submit

def fast(repo):
    triton_models.passthrough(repo, "fast")

def wrappers():
    return sum(1 for o in gc.get_objects() if isinstance(o, TritonObject))
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
