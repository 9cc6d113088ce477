"""2,000 requests after warm-up, and open/close cycles with requests in flight at every close, leave this client's
memory, open files, threads and /dev/shm as they were."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from monai_triton_ops import create_backend
from monai_triton_ops.backends.remote.shm import region as shm
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ... import triton_models
from ...server.conftest import wait_until
from . import sharing
from .conftest import Open, registered_by_us, serve, url

pytestmark = pytest.mark.triton
WARM_UP = 200
REQUESTS = 2000
MAX_IN_FLIGHT = 2
SLOTS_BEYOND_IN_FLIGHT = 4  # RemoteBackend's pool: max_in_flight + 4 slots at most
#: Open/close cycles after the first (whose threads and channels are the baseline), each closed with this many
#: requests in flight on a model that takes ``SLOW_S`` a request.
CYCLES, IN_FLIGHT_AT_CLOSE, SLOW_S = 2, 4, 0.2


@pytest.fixture(scope="module")
def server(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    repo = tmp_path_factory.mktemp("leaks") / "repo"
    triton_models.identity(repo, "ident", dims=(-1, -1))
    triton_models.slow(repo, "slow", delay_s=SLOW_S)
    yield from serve(repo, tmp_path_factory.mktemp("server_tmp"))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _region_names() -> set[str]:
    """This process's regions in ``/dev/shm``."""
    return {path.name for path in shm.SHM_DIR.glob(f"{shm.PREFIX}{os.getpid()}_*")}


#: Kernel names (15 characters at most) of the threads of gRPC's own process-wide pools.
GRPC_POOLS = ("event_engine", "grpc_global_tim")


def _snapshot(foreign: frozenset[str] = frozenset()) -> dict[str, int]:
    """Open files other than regions (a mapping keeps its own fd), threads, and this process's regions but the
    ``foreign`` ones: those an earlier test of this worker left to be retired, which may go at any moment.

    ``threads`` leaves out gRPC's process-wide pools (threads named ``event_engine``, ``grpc_global_timer``):
    gRPC sizes them by its own backlog, whoever's the work, and reclaims a thread when it likes; a channel or
    connection left open shows as an fd, and a thread of ours as a thread here and a Python thread."""
    gc.collect()
    names = _region_names()
    return {
        "other fds": len(os.listdir("/proc/self/fd")) - len(names),
        "threads": sum(not name.startswith(GRPC_POOLS) for name in _thread_names()),
        "python threads": threading.active_count(),
        "regions": len(names - foreign),
    }


def _thread_names() -> list[str]:
    """The kernel's names of this process's threads, for the failure message: which one is new."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return sorted(names)


def _settled_against(before: dict[str, int], foreign: frozenset[str], timeout_s: float = 30.0) -> dict[str, int]:
    """A snapshot once no count is above ``before``'s, else the last one after ``timeout_s``.

    A thread of ours on its way out, or an fd being closed, is given the time to go (gRPC's own pools are not
    counted at all, see ``_snapshot``). A leaked thread, fd or region stays, and the test fails; when nothing
    grew, the first snapshot is the one returned."""
    latest: dict[str, int] = {}

    def settled() -> bool:
        latest.clear()
        latest.update(_snapshot(foreign))
        return all(latest[key] <= before[key] for key in before if key != "regions")

    wait_until(settled, timeout_s, interval_s=0.2)
    return latest


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_two_thousand_requests_leak_nothing(server: LocalTritonServer, open_backend: Open, scheme: str) -> None:
    foreign = frozenset(_region_names())
    backend = open_backend(f"{url(server, scheme)}?shared_memory=system&max_in_flight={MAX_IN_FLIGHT}", "ident")
    x = np.random.default_rng(0).standard_normal((2, 4096)).astype(np.float32)  # 32 KB: cheap, but not tiny

    def run(count: int) -> None:
        for start in range(0, count, 2):  # two in flight at a time, as a sliding window does
            futures = [backend.submit({"INPUT__0": x + i}) for i in range(start, start + 2)]
            for i, future in zip(range(start, start + 2), futures, strict=True):
                np.testing.assert_array_equal(future.result(timeout=60)["OUTPUT__0"], x + i)

    run(WARM_UP)
    before, rss_before = _snapshot(foreign), _rss_bytes()
    run(REQUESTS)
    after, rss_after = _settled_against(before, foreign), _rss_bytes()
    print(f"{scheme}: RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB over {REQUESTS} requests; {after}")
    regions_after, regions_before = after.pop("regions"), before.pop("regions")
    # Nothing grew; a count may fall when a thread of an earlier test ends between the two snapshots.
    assert all(after[key] <= before[key] for key in before), (before, after, _thread_names())
    # The pool may still grow to its bound (requests in flight + results not yet dropped), never past it.
    assert regions_before <= regions_after <= MAX_IN_FLIGHT + SLOTS_BEYOND_IN_FLIGHT
    assert rss_after <= rss_before * 1.05, (rss_before, rss_after)


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_open_close_cycles_with_requests_in_flight_leave_threads_fds_and_regions_flat(
    server: LocalTritonServer, scheme: str
) -> None:
    """A long-running host opens a backend, sends requests and closes it before they are answered, again and again:
    every cycle's regions are unlinked at its close (those the server still holds handed to the janitor, which
    unregisters them once it lets go), its threads and channels end; nothing grows from cycle to cycle."""
    foreign = frozenset(_region_names())
    spec = f"{url(server, scheme)}?shared_memory=system&max_in_flight={IN_FLIGHT_AT_CLOSE}"
    x = np.ones(256, np.float32)

    def cycle() -> None:
        backend = create_backend(spec, "slow").open()
        futures = [backend.submit({"INPUT__0": x + i}) for i in range(IN_FLIGHT_AT_CLOSE)]
        # Every request has its slot registered, so it is on its way to the server (one at a time runs there).
        assert wait_until(lambda: len(registered_by_us(server)) >= IN_FLIGHT_AT_CLOSE, 30.0)
        assert not all(f.done() for f in futures)
        backend.close(timeout_s=0)
        for i, future in enumerate(futures):  # answered before the close, or failed by it: never lost silently
            if future.exception(timeout=60) is None:
                np.testing.assert_array_equal(future.result()["OUTPUT__0"], x + i)
        assert not _region_names() - foreign  # unlinked at the close, whatever the server still runs

    cycle()
    before = _snapshot(foreign)
    for _ in range(CYCLES):
        cycle()
    after = _settled_against(before, foreign)
    print(f"{scheme}: {CYCLES} cycles after the first; before {before}, after {after}")
    assert all(after[key] <= before[key] for key in before if key != "regions"), (before, after, _thread_names())
    assert after["regions"] == 0
    # The janitor unregisters what the server held once it has run the abandoned requests (SLOW_S each).
    assert wait_until(lambda: not registered_by_us(server), 30.0), registered_by_us(server)


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_two_models_on_one_server_share_one_connection_and_close_apart(server: LocalTritonServer, scheme: str) -> None:
    """Two models of one process on one server (issue 37): one connection (HTTP: one pool), one probing thread;
    closing one with requests in flight leaves the other answering; closing both leaves threads, fds and regions as
    they were before."""
    port = server.grpc_port if scheme == "grpc" else server.http_port
    spec = f"{url(server, scheme)}?max_in_flight={MAX_IN_FLIGHT}"
    # The first run starts what the process keeps (the janitor's thread, the deadline thread): the baseline is after.
    sharing.two_models_share_and_close_apart(spec, "ident", "slow", [port], scheme, lambda: True, fast_shape=(1, 8))
    foreign = frozenset(_region_names())
    before = _snapshot(foreign)

    def flat() -> bool:
        after = _settled_against(before, foreign)
        assert all(after[key] <= before[key] for key in before if key != "regions"), (before, after, _thread_names())
        return after["regions"] == 0

    sharing.two_models_share_and_close_apart(spec, "ident", "slow", [port], scheme, flat, fast_shape=(1, 8))
    assert wait_until(lambda: not registered_by_us(server), 30.0), registered_by_us(server)
