"""Stopping with requests in flight, interpreter exit, a second server, and what a deleted server leaves behind.

Each case runs in its own interpreter: a deadlock is caught by the case's timeout, a crash by its exit code.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import run_case
from .harness import REPO_ROOT, stub_pids

pytestmark = pytest.mark.triton

PRELUDE = """
import threading
import numpy as np
from monai_triton_ops import bindings as b
from tests import triton_models
from tests.bindings.harness import case_server, submit, thread_count, stub_pids

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


def case(body: str, timeout_s: float = 120) -> str:
    return run_case(PRELUDE + textwrap.dedent(body), timeout_s=timeout_s).stdout


def test_stop_with_eight_requests_in_flight_waits_for_them() -> None:
    out = case("""
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
        print("round", round_, "ok")
    """)
    assert out.count(" ok") == 3


def test_stop_from_another_thread() -> None:
    out = case("""
    with case_server(slow, ["slow"], exit_timeout_s=10) as started:
        futures, released = eight_in_flight(started.server)
        stopper = threading.Thread(target=started.server.stop)
        stopper.start()
        stopper.join(60)
        assert not stopper.is_alive(), "stop did not return"
        check_landed(futures, released)
        assert "Exit timeout expired" not in started.log()
    print("stopped from a thread")
    """)
    assert "stopped from a thread" in out


def test_stop_from_an_atexit_handler() -> None:
    out = case("""
    import atexit, shutil
    from pathlib import Path
    from tests.bindings.harness import start_server
    folder = Path(__import__("tempfile").mkdtemp())
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
    """)
    assert "stopped at exit" in out


def test_exit_without_closing_anything(tmp_path: Path) -> None:
    script = PRELUDE + textwrap.dedent(f"""
    import sys
    from tests.bindings.harness import start_server
    from pathlib import Path
    folder = Path({str(tmp_path)!r})
    slow(folder / "repo")
    started = start_server(folder / "repo", folder / "work", models=["slow"], exit_timeout_s=10)
    futures, released = eight_in_flight(started.server)
    print("prefix", started.shm_prefix, flush=True)
    sys.exit(0)
    """)
    prelude = f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
    prelude += "from tests.bindings.harness import light_import\nlight_import()\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for fatal in ("FATAL", "terminate called", "Fatal Python error", "Segmentation fault"):
        assert fatal not in result.stderr
    match = re.search(r"prefix (\S+)", result.stdout)
    assert match
    assert not stub_pids(match.group(1))


def test_a_second_server_in_the_same_process() -> None:
    out = case("""
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
        print("server", round_, "ok")
    """)
    assert out.count(" ok") == 2


def test_a_deleted_server_leaves_no_thread_and_no_stub() -> None:
    out = case("""
    def fast(repo):
        triton_models.passthrough(repo, "fast", instances=2)

    counts = []
    for round_ in range(3):
        with case_server(fast, ["fast"]) as started:
            future, _ = submit(started.server, "fast", {"INPUT__0": np.ones(2, np.float32)})
            future.result(30)
            assert len(stub_pids(started.shm_prefix)) == 2
        counts.append(thread_count())  # case_server checked: no stub, no shared memory left
    # the first cycle may leave library-global threads; later cycles must not add any
    assert counts[1] == counts[2] <= counts[0], counts
    print("threads after each server", counts)
    """)
    assert "threads after each server" in out
