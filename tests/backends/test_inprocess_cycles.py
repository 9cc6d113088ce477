"""A long-running host of the ``triton`` backend loses nothing: open, 8 requests in flight, ``close()`` cutting them
off (or the backend dropped without ``close()``), open again. One fresh interpreter runs the cycles and counts
what the process holds after each (``docs/inprocess.md``, "What a long-running host can rely on"); an owner-level
child takes a retiring server back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .. import triton_models
from .test_inprocess import assert_clean_exit, run_owner_child, run_python

pytestmark = [pytest.mark.triton]

#: Per request: short, so that what close() cut off lands within a few seconds (one instance: one at a time).
DELAY_S = 0.15
CYCLES = 3

CHILD = """
import gc, glob, json, os, sys, tempfile, time
from pathlib import Path
import numpy as np
from monai_triton_ops import create_backend
from monai_triton_ops.backends.inprocess import shared

REPO, CYCLES, PID = sys.argv[1], int(sys.argv[2]), os.getpid()


def stubs():
    found = 0
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        found += b"triton_python_backend_stub" in cmdline and f"monai_triton_{PID}_".encode() in cmdline
    return found


def held():
    return {
        "threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "shm": len(glob.glob(f"/dev/shm/monai_triton_{PID}_*")),
        "stubs": stubs(),
        "temp": len(glob.glob(f"{tempfile.gettempdir()}/monai_triton_inprocess_{PID}_*")),
    }


servers = []  # every server a cycle used, kept: distinct objects are distinct servers


def cycle(end):
    gc.collect()  # a backend the last cycle dropped is gone
    backend = create_backend("triton", "sleepy", model_repository=REPO, max_in_flight=8).open()
    futures = [backend.submit({"INPUT__0": np.ones(4, np.float32)}) for _ in range(8)]
    servers.append(shared.current())
    end(backend)
    return held()


def dropped(backend):  # neither closed nor kept: the cycle's end drops the last reference
    pass


before = held()
closed = [cycle(lambda backend: backend.close(timeout_s=0.1)) for _ in range(CYCLES)]
retiring = shared.retiring()
print("closed", json.dumps({"before": before, "cycles": closed, "servers": len({id(s) for s in servers})}))
ended = retiring is not None and retiring.wait_closed(60)
settle_by = time.monotonic() + 10  # the ending's own thread returns just after it reports the server closed
while held()["threads"] > before["threads"] and time.monotonic() < settle_by:
    time.sleep(0.05)
print("ended", ended, ended and retiring.ending.deleted, json.dumps(held()))
servers.clear()
drops = [cycle(dropped) for _ in range(CYCLES)]
print("dropped", json.dumps({"cycles": drops, "servers": len({id(s) for s in servers})}))
print("pid", PID)
sys.stdout.flush()
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inprocess_cycles") / "repo"
    triton_models.passthrough(path, "sleepy", delay_s=DELAY_S)  # one instance: requests run one after another
    return path


def test_open_close_cycles_with_requests_cut_off_leave_nothing_behind(repo: Path) -> None:
    """Cycles with ``close(timeout_s=0.1)`` cutting 8 requests off: after the first, threads, file descriptors,
    ``/dev/shm`` files, stubs and temporary folders stay where the first left them (each cycle left a whole
    undeleted server before: 39 more threads a cycle); the server, taken back by each open, ends once Triton
    lets go of what was cut off. Then the same cycles with the backend dropped instead of closed; the exit
    drains what is left and leaves nothing."""
    result = run_python(CHILD, args=(str(repo), str(CYCLES)), timeout_s=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    closed = json.loads(lines["closed"])
    first = closed["cycles"][0]
    for later in closed["cycles"][1:]:
        for what, count in later.items():
            assert count <= first[what], f"{what} grew across cycles: {closed['cycles']}"
    assert closed["servers"] == 1, closed
    ended, deleted, after = lines["ended"].split(" ", 2)
    assert (ended, deleted) == ("True", "True"), lines["ended"]
    left = json.loads(after)
    assert (left["shm"], left["stubs"], left["temp"]) == (0, 0, 0), left
    assert left["threads"] <= closed["before"]["threads"], (closed["before"], left)
    dropped = json.loads(lines["dropped"])
    for later in dropped["cycles"][1:]:
        for what, count in later.items():
            assert count <= dropped["cycles"][0][what], f"{what} grew across dropped cycles: {dropped['cycles']}"
    assert dropped["servers"] == 1, dropped
    assert_clean_exit(result, int(lines["pid"]))


#: At the owner's level (no torch): a retiring server refuses other server options, is taken back with the same.
TAKEN_BACK = """
from monai_triton_ops.backends.inprocess import shared
from monai_triton_ops.errors import ConfigError


class Holder:  # a backend, as far as the holds go
    pass


first, second = Holder(), Holder()
server = shared.acquire(ServerSettings(exit_timeout_s=60), REPO, "sleepy", first)
flights = [submit(server, "sleepy", 1.0)[0] for _ in range(16)]  # 2.4 s of work: still out below
shared.release("sleepy", first, 0)
print("retiring", shared.retiring() is server, server.phase.value, flush=True)
try:
    shared.acquire(ServerSettings(exit_timeout_s=5), REPO, "sleepy", Holder())
except ConfigError as exc:
    print("refused", "other server options" in str(exc), flush=True)
again = shared.acquire(ServerSettings(exit_timeout_s=60), REPO, "sleepy", second)
print("taken back", again is server, server.phase.value, shared.retiring() is None, flush=True)
for flight in flights:
    try:
        flight.result(30)
    except b.TritonError:
        pass
shared.release("sleepy", second, 30)
print("ended", server.ending.deleted, flush=True)
sys.exit(0)
"""


def test_a_retiring_server_is_taken_back_with_the_same_options_and_refuses_others(repo: Path) -> None:
    """The next open takes the retiring server back (one server, its model still loaded) only with the options it
    runs with; other options are refused with one ``ConfigError`` while it still holds cut-off requests."""
    result, pid = run_owner_child(TAKEN_BACK, repo)
    assert "retiring True retiring" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "refused True" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "taken back True running True" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "ended True" in result.stdout, result.stdout + result.stderr[-3000:]
    assert_clean_exit(result, pid)
