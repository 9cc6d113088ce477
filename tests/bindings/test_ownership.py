"""Ownership as the C API defines it, enforced, under glibc's heap checks.

The cases share one fresh interpreter (the process boundary is the point twice: glibc's checks must be
preloaded at start, and a crash must fail the cases, not the suite) and two servers. They run in order;
each test reads its case's outcome, so a case that crashes the interpreter fails itself and marks the
ones after it as not run. ``test_the_heap_checks_are_on`` is the canary: a one-byte overrun in a child
started with the very same environment must abort, else the checks these cases claim are not running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from .conftest import CaseOutcomes, run_cases
from .harness import malloc_checked_environ

pytestmark = pytest.mark.triton

PRELUDE = """
import gc, json, os, sys, traceback
import numpy as np
from monai_triton_ops import bindings as b
from tests import triton_models
from tests.bindings.harness import case_server, make_request, submit, Outcome, stub_pids, shm_regions

def models(repo):
    triton_models.passthrough(repo, "slow", delay_s=0.3)
    triton_models.passthrough(repo, "fast")
    triton_models.slow(repo, "queued", delay_s=1.0, max_queue_size=1)

def read(response, flags, outcome):
    if response is not None:
        outcome.outputs["OUTPUT__0"] = response.output_array(0)

def expect_ownership_error(use, words):
    try:
        use()
    except b.OwnershipError as exc:
        assert words in str(exc), exc
    else:
        raise AssertionError(f"no OwnershipError ({words})")
"""

CASES: dict[str, str] = {
    "referenced_twice": """
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
    """,
    "handover_seen_by_every_reference": """
        req = make_request(server, "slow", {"INPUT__0": np.ones(3, np.float32)})
        req.set_response_callback(b.ArrayAllocator(), None, read, Outcome())
        req_2 = req
        future = server.infer_async(req)
        for use in (lambda: req_2.id, lambda: req_2.add_requested_output("X"), req_2.delete,
                    lambda: server.infer_async(req_2)):
            expect_ownership_error(use, "belongs to Triton")
        future.result(30)
        req_2.id = "mine again"  # released: Python's again, through every reference
        assert req.id == "mine again"
        req.delete()
        for use in (lambda: req_2.id, req_2.delete, lambda: server.infer_async(req_2)):
            expect_ownership_error(use, "was deleted")
    """,
    "a_thousand_dropped_mid_flight": """
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
    """,
    "failed_submissions_leave_nothing": """
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
    """,
    "an_allocator_in_use_is_not_deleted": """
        allocator = b.ArrayAllocator()
        kept = []
        req = make_request(server, "fast", {"INPUT__0": np.arange(4, dtype=np.float32)})
        req.set_response_callback(allocator, None, lambda r, f, k: k.append(r) if r else None, kept)
        server.infer_async(req).result(30)
        req.delete()
        expect_ownership_error(allocator.delete, "1 output buffer")
        output = kept[0].output_array(0)
        kept.clear()
        gc.collect()
        allocator.delete()
        garbage = np.full(50_000_000, 1, np.float32)
        np.testing.assert_array_equal(output, [0, 1, 2, 3])
    """,
    "stop_deletes_responses_python_holds": """
        kept = []
        req = make_request(server, "fast", {"INPUT__0": np.ones(2, np.float32)})
        req.set_response_callback(b.ArrayAllocator(), None, lambda r, f, k: k.append(r) if r else None, kept)
        server.infer_async(req).result(30)
        server.stop()  # the last case on this server
        expect_ownership_error(lambda: kept[0].output(0), "its server was stopped")
        expect_ownership_error(lambda: req.id, "its server was stopped")
        assert "Exit timeout expired" not in started.log(), started.log()[-2000:]
    """,
}

#: Cases on a server of their own: (models, exit timeout, body). This one ends with the server undeletable.
LAST_CASE = (
    "a_server_is_not_deleted_under_its_requests",
    """
    import atexit, threading
    triton_models.passthrough(folder / "repo2", "very_slow", delay_s=3.0)
    exit_hooks, python_threads = atexit._ncallbacks(), threading.active_count()
    started = start_server(folder / "repo2", folder / "work2", models=["very_slow"], exit_timeout_s=1)
    server = started.server
    assert atexit._ncallbacks() == exit_hooks  # the binding registers no exit hook of its own
    outcome = Outcome()
    req = make_request(server, "very_slow", {"INPUT__0": np.arange(2, dtype=np.float32)})
    req.set_response_callback(b.ArrayAllocator(), None, read, outcome)
    future = server.infer_async(req)
    del req
    expect_ownership_error(server.delete, "1 request(s) still in flight")  # nothing asked of Triton
    assert server.is_live() and server.in_flight == 1
    try:
        server.stop()  # Triton's own wait: its exit timeout (1 s) expires before the request lands
    except b.InternalError as exc:
        assert "Exit timeout expired" in str(exc), exc
    else:
        raise AssertionError("stop returned with a request in flight past the exit timeout")
    assert server.stop_failed
    future.result(30)  # the request still lands, exactly
    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], [0, 1])
    expect_ownership_error(server.delete, "its stop failed")  # deleting now would crash in Triton
    assert threading.active_count() == python_threads  # and starts no thread to delete it later
    os.kill(stub_pids(started.shm_prefix)[0], 9)  # left undeleted: end its stub as its owner would
    remove_shm_regions(started.shm_prefix)
    """,
)


def _script() -> str:
    lines = [PRELUDE, "import tempfile", "from pathlib import Path", "from tests.bindings.harness import start_server"]
    lines.append("from monai_triton_ops.server.environment import remove_shm_regions")
    lines.append(f"CASES = {json.dumps({k: textwrap.dedent(v) for k, v in CASES.items()})}")
    lines.append("with case_server(models, ['slow', 'fast', 'queued'], exit_timeout_s=10) as started:")
    lines.append("    for name, body in CASES.items():")
    lines.append("        run_case_body(name, body, {**globals(), 'server': started.server, 'started': started})")
    lines.append("folder = Path(tempfile.mkdtemp())")
    body = textwrap.dedent(LAST_CASE[1])
    lines.append(f"run_case_body({LAST_CASE[0]!r}, {body!r}, {{**globals(), 'folder': folder}})")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def outcomes() -> CaseOutcomes:
    """Every case, run once in one interpreter under the heap checks."""
    return run_cases(_script(), env=malloc_checked_environ())


@pytest.mark.parametrize("name", [*CASES, LAST_CASE[0]])
def test_ownership_case(outcomes: CaseOutcomes, name: str) -> None:
    outcomes.check(name)


def test_the_cases_ran_under_the_heap_checks_and_left_nothing(outcomes: CaseOutcomes) -> None:
    assert outcomes.code == 0, outcomes.stderr[-4000:]
    for sign in ("free(): invalid", "corrupted", "double free"):
        assert sign not in outcomes.stderr


def test_the_heap_checks_are_on() -> None:
    """The canary: a one-byte overrun of a block from libpython's malloc, freed, in a child started with the
    cases' environment, must abort. (``ctypes`` lookups of ``malloc`` bind to libc's own, unchecked symbol;
    libpython's and Triton's calls bind to the version the preloaded library interposes.)"""
    canary = textwrap.dedent("""
        import ctypes
        api = ctypes.pythonapi
        api.PyMem_RawMalloc.restype = ctypes.c_void_p
        api.PyMem_RawMalloc.argtypes = [ctypes.c_size_t]
        api.PyMem_RawFree.argtypes = [ctypes.c_void_p]
        block = api.PyMem_RawMalloc(20)
        ctypes.memset(block + 20, 0x41, 1)
        api.PyMem_RawFree(block)
        print("the overrun went unnoticed")
    """)
    result = subprocess.run(
        [sys.executable, "-c", canary],
        capture_output=True,
        text=True,
        timeout=60,
        env=malloc_checked_environ(),
        check=False,
    )
    assert result.returncode < 0, f"heap checks are off: exit {result.returncode}, {result.stdout}{result.stderr}"
    assert "the overrun went unnoticed" not in result.stdout
