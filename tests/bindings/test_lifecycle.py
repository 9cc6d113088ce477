"""Stopping with requests in flight (from the main thread, another thread, an ``atexit`` handler), a second
server, and what a deleted server leaves behind: the binding's own stop and delete, no owner around them.

The cases share one fresh interpreter, each with servers of its own (the thread counts and the exit
handler need a process of their own; a deadlock is caught by the timeout, a crash by the outcomes). The
process's exit with requests in flight is the in-process owner's (``tests/backends/test_inprocess.py``).
"""

from __future__ import annotations

import textwrap

import pytest

from .conftest import CaseOutcomes, run_cases
from .harness import malloc_checked_environ

pytestmark = pytest.mark.triton

PRELUDE = """
import atexit, shutil, tempfile, threading
from pathlib import Path
import numpy as np
from monai_triton_ops import bindings as b
from tests import triton_models
from tests.bindings.harness import case_server, start_server, submit, thread_count, stub_pids

def slow(repo):
    triton_models.passthrough(repo, "slow", delay_s=0.2)

def eight_in_flight(server):
    released = []
    futures = []
    for i in range(8):
        future, outcome = submit(server, "slow", {"INPUT__0": np.full(2, i, np.float32)})
        future.add_done_callback(lambda f: released.append(1))
        futures.append((future, outcome))
    return futures, released

def check_landed(futures, released):
    for i, (future, outcome) in enumerate(futures):
        assert future.done(), "stop returned before a request landed"
        future.result(0)
        np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], [i, i])
    assert len(released) == 8, released
"""

CASES = {
    "stop_with_eight_in_flight_waits_for_them": """
        for round_ in range(3):
            with case_server(slow, ["slow"], exit_timeout_s=10) as started:
                futures, released = eight_in_flight(started.server)
                started.server.stop()
                check_landed(futures, released)
                try:
                    submit(started.server, "slow", {"INPUT__0": np.ones(1, np.float32)})
                except b.UnavailableError as exc:
                    assert "stopping" in str(exc)
                else:
                    raise AssertionError("a request was accepted after stop")
                assert "Exit timeout expired" not in started.log()
    """,
    "stop_from_another_thread": """
        with case_server(slow, ["slow"], exit_timeout_s=10) as started:
            futures, released = eight_in_flight(started.server)
            stopper = threading.Thread(target=started.server.stop)
            stopper.start()
            stopper.join(60)
            assert not stopper.is_alive(), "stop did not return"
            check_landed(futures, released)
            assert "Exit timeout expired" not in started.log()
    """,
    "a_second_server_in_the_same_process": """
        import re
        def successes(server):
            metrics = server.metrics()
            text = metrics.formatted()
            metrics.delete()
            found = re.findall(r'^nv_inference_request_success\\{[^}]*model="fast"[^}]*\\} (\\S+)$', text, re.M)
            return sum(float(v) for v in found)

        def fast(repo):
            triton_models.passthrough(repo, "fast")

        for round_ in range(2):
            with case_server(fast, ["fast"]) as started:
                before = successes(started.server)  # metrics are process-wide: compare deltas
                for i in range(5):
                    future, outcome = submit(started.server, "fast", {"INPUT__0": np.full(3, i, np.float32)})
                    future.result(30)
                    np.testing.assert_array_equal(outcome.outputs["OUTPUT__0"], [i, i, i])
                assert successes(started.server) - before == 5
    """,
    "a_deleted_server_leaves_no_thread_and_no_stub": """
        def fast(repo):
            triton_models.passthrough(repo, "fast", instances=2)

        counts = []
        for round_ in range(3):
            with case_server(fast, ["fast"]) as started:
                future, _ = submit(started.server, "fast", {"INPUT__0": np.ones(2, np.float32)})
                future.result(30)
                assert len(stub_pids(started.shm_prefix)) == 2
            counts.append(thread_count())  # case_server checked: no stub, no shared memory left
        # the first cycles may leave library-global threads; later cycles must not add any
        assert counts[1] == counts[2] <= counts[0], counts
    """,
    # the last case: its handler runs when the interpreter exits, after every case above
    "stop_from_an_atexit_handler": """
        folder = Path(tempfile.mkdtemp())
        slow(folder / "repo")
        started = start_server(folder / "repo", folder / "work", models=["slow"], exit_timeout_s=10)
        futures, released = eight_in_flight(started.server)

        def at_exit():
            started.server.stop()
            check_landed(futures, released)
            assert "Exit timeout expired" not in started.log()
            started.server.delete()
            shutil.rmtree(folder)
            print("stopped at exit", flush=True)

        atexit.register(at_exit)
    """,
}


@pytest.fixture(scope="module")
def outcomes() -> CaseOutcomes:
    script = PRELUDE + f"CASES = {CASES!r}\n"
    script += "for name, body in CASES.items():\n    run_case_body(name, textwrap.dedent(body), dict(globals()))\n"
    return run_cases("import textwrap\n" + textwrap.dedent(script), env=malloc_checked_environ(), timeout_s=300)


@pytest.mark.parametrize("name", list(CASES))
def test_lifecycle_case(outcomes: CaseOutcomes, name: str) -> None:
    outcomes.check(name)
    if name == "stop_from_an_atexit_handler":
        assert outcomes.stdout.rstrip().endswith("stopped at exit"), outcomes.stderr[-3000:]
        assert outcomes.code == 0, outcomes.stderr[-3000:]
