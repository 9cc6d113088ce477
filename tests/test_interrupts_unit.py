"""The parts of ``interrupts.py`` that need no signal: what a cleanup removes and runs (the signals: tests/apps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops import interrupts


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interrupts, "_outputs", {})
    monkeypatch.setattr(interrupts, "_cleanups", {})


def test_only_what_the_run_created_is_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "kept").mkdir(parents=True)
    (out / "kept" / "old.nii.gz").write_text("from an earlier run")
    (out / "empty_before").mkdir()
    interrupts.track_output(out)
    (out / "kept" / "old.nii.gz").write_text("overwritten atomically: complete, stays")
    (out / ".tmp-abc.nii.gz").write_text("half written")
    (out / "stl" / "deep").mkdir(parents=True)
    (out / "stl" / "deep" / "mesh.stl").write_text("new")
    interrupts._remove_new_outputs()
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["empty_before", "kept", "kept/old.nii.gz"]


def test_cleanups_run_newest_first_and_one_failing_does_not_stop_the_others(tmp_path: Path) -> None:
    ran: list[str] = []

    def failing() -> None:
        ran.append("failing")
        raise RuntimeError("cannot close")

    interrupts.register(lambda: ran.append("first"))
    key = interrupts.register(lambda: ran.append("unregistered"))
    interrupts.register(failing)
    interrupts.unregister(key)
    interrupts._clean_up()
    assert ran == ["failing", "first"]


def test_install_is_refused_off_the_main_thread() -> None:
    import threading

    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(interrupts.install_signal_handlers()))
    thread.start()
    thread.join()
    assert results == [False]
    assert not interrupts.stopping()
