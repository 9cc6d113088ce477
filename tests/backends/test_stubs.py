"""Which dead stub a model load blames (``backends.stubs.watch_load``), with real child processes.

A process whose executable is named like the Python backend's stub is, to ``/proc``, a stub of this process:
these tests start a copy of ``sleep`` under that name, so its death is real, and hand ``watch_load`` a load
that behaves as Triton's does (blocks, then returns or raises Triton's own error).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from monai_triton_ops import bindings as b
from monai_triton_ops.backends.inprocess import stubs

from ..server.conftest import wait_until


@pytest.fixture
def start_stub(tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start a child whose executable name is the stub's (a copy of ``sleep``); all are ended afterwards."""
    program = tmp_path / stubs.STUB_NAME
    shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        child = subprocess.Popen([str(program), "60"])
        started.append(child)
        assert wait_until(lambda: child.pid in {c.pid for c in stubs.stub_children()}, 5)
        return child

    yield start
    for child in started:
        child.kill()
        child.wait(5)


def _kill_into_a_zombie(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``child`` and leave it unreaped (a zombie), as Triton leaves a stub until it reaps it."""
    os.kill(child.pid, signal.SIGKILL)
    assert wait_until(lambda: any(c.pid == child.pid and c.zombie for c in stubs.stub_children()), 5)


def _refused_after(seconds: float, before: Callable[[], None] = lambda: None) -> Callable[[], None]:
    def load() -> None:
        before()
        time.sleep(seconds)  # several of watch_load's polls see the zombie first
        raise b.InvalidArgumentError("load failed for model 'm': Internal: RuntimeError: no weights")

    return load


def test_a_stub_of_another_model_exiting_during_a_load_is_not_blamed_for_its_failure(start_stub: Callable) -> None:
    """A model unloaded just before exits while the next model loads: the failed load gives Triton's own
    error, not "its stub died" (seen once under parallel tests: an ``initfail`` load blamed such a stub)."""
    other = start_stub()
    with pytest.raises(b.InvalidArgumentError, match="RuntimeError: no weights"):
        stubs.watch_load(_refused_after(0.5, lambda: _kill_into_a_zombie(other)), "m", lambda: "", lambda: None)


def test_a_stub_started_by_the_load_that_dies_is_blamed_with_what_it_said(start_stub: Callable) -> None:
    """The model's own stub (started during the load) exiting is named, with the stub's last words."""

    def start_then_die() -> None:
        _kill_into_a_zombie(start_stub())

    with pytest.raises(b.UnavailableError, match=r"model 'm': its Python backend stub \(pid \d+\) was killed by "
                       r"signal 9 \(SIGKILL\) while the model loaded: out of memory"):  # fmt: skip
        stubs.watch_load(_refused_after(0.5, start_then_die), "m", lambda: "out of memory", lambda: None)


def test_a_load_that_never_ends_after_its_stub_died_ends_within_the_grace(
    start_stub: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton waits forever for a stub that died before its first message: the load ends on its own and the
    model is reported stuck."""
    monkeypatch.setattr(stubs, "DEATH_GRACE_S", 0.5)  # 10 s in production; the logic is the same
    stuck: list[bool] = []

    def start_then_die_then_block() -> None:
        _kill_into_a_zombie(start_stub())
        time.sleep(30)

    with pytest.raises(b.UnavailableError, match="Triton never ended the load"):
        stubs.watch_load(start_then_die_then_block, "m", lambda: "", lambda: stuck.append(True))
    assert stuck == [True]
