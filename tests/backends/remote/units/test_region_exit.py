"""A region file never outlives a Python exit (``shm/owner.py``): the exit sweep (``RegionOwner.sweep``, run by
``atexit``) and a worker thread that creates a region at that moment exclude each other.

The sweep is called directly here; ``_exiting`` is put back afterwards so that this worker makes regions again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from monai_triton_ops.backends.remote.shm import region
from monai_triton_ops.backends.remote.shm.owner import RegionRefusedError, owner

WAIT_S = 30.0  # a bound on waits for another thread, never reached when the code is right


@pytest.fixture
def sweep(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The sweep may run in this test; afterwards the process creates regions again, and none is left."""
    monkeypatch.setattr(owner, "_exiting", False)
    before = set(owner.names())
    yield
    owner.sweep()
    assert set(owner.names()) <= before


@pytest.mark.usefixtures("sweep")
def test_after_the_exit_sweep_no_region_is_created_and_no_file_is_left() -> None:
    kept = owner.create(4096)
    assert (region.SHM_DIR / kept.name).exists()
    owner.sweep()
    assert not (region.SHM_DIR / kept.name).exists()
    files = own_files()
    with pytest.raises(RegionRefusedError, match="exiting"):
        owner.create(4096)
    assert own_files() <= files


def own_files() -> set[str]:
    """This process's region files: other test workers create and remove theirs in ``/dev/shm`` meanwhile."""
    return {path.name for path in region.SHM_DIR.glob(f"{region.PREFIX}{os.getpid()}_*")}


@pytest.mark.usefixtures("sweep")
def test_regions_created_by_threads_while_the_sweep_runs_are_all_unlinked() -> None:
    """Eight threads create regions in a loop (never closing them), as workers still running requests at exit do;
    the sweep runs meanwhile. Each region was either closed by it or refused: no file of theirs is left."""
    created: list[region.SystemRegion] = []
    refused = threading.Event()
    some_made = threading.Event()
    started = threading.Barrier(9)

    def create() -> None:
        started.wait(WAIT_S)
        while True:
            try:
                made = owner.create(4096)
            except RegionRefusedError:
                refused.set()
                return
            created.append(made)
            if len(created) >= 16:
                some_made.set()  # the sweep starts while the threads go on creating

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    started.wait(WAIT_S)
    assert some_made.wait(WAIT_S)
    owner.sweep()
    for thread in threads:
        thread.join(WAIT_S)
    assert refused.is_set()
    left = [r.name for r in created if (region.SHM_DIR / r.name).exists()]
    assert not left, f"{len(left)} of {len(created)} region files left after the sweep: {left[:5]}"
