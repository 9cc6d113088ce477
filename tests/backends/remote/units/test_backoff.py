"""``Backoff``: the wait before a new round of attempts after a transient error (``UNAVAILABLE``).

Exponential from ``base_s``, capped at ``cap_s``, jittered to between half and all of it, never past the
request's deadline, and ``None`` (give up) once the retries are spent. The jitter's extremes are pinned by
replacing ``random.random`` with its two ends; everything else uses the real generator.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from monai_triton_ops.backends.remote import backend as backend_module
from monai_triton_ops.backends.remote.backend import Backoff

JUST_BELOW_ONE = 1.0 - 2**-53  # random.random() never returns 1.0


def jitter(monkeypatch: pytest.MonkeyPatch, value: float) -> None:
    """The backend's ``random.random()`` returns ``value`` (its module name only: the global generator stays)."""
    monkeypatch.setattr(backend_module, "random", SimpleNamespace(random=lambda: value))


def nominal(backoff: Backoff, attempt: int) -> float:
    return float(min(backoff.cap_s, backoff.base_s * 2 ** (attempt - 1)))


def test_each_round_waits_twice_as_long_as_the_one_before_until_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    backoff = Backoff(retries=8, base_s=0.05, cap_s=1.0)
    jitter(monkeypatch, JUST_BELOW_ONE)  # the top of the jitter
    top = [backoff.delay_s(n, None) for n in range(1, 9)]
    assert top == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    jitter(monkeypatch, 0.0)  # the bottom of the jitter
    bottom = [backoff.delay_s(n, None) for n in range(1, 9)]
    assert bottom == pytest.approx([0.025, 0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5])


def test_the_jitter_spreads_the_wait_between_half_and_all_of_it() -> None:
    """Clients that failed together do not come back together: the waits differ, all within the bounds."""
    backoff = Backoff(retries=3, base_s=0.2, cap_s=1.0)
    for attempt in (1, 2, 3):
        delays = [backoff.delay_s(attempt, None) for _ in range(200)]
        assert all(d is not None and nominal(backoff, attempt) / 2 <= d <= nominal(backoff, attempt) for d in delays)
        assert len(set(delays)) > 100


def test_no_wait_is_given_once_the_retries_are_spent() -> None:
    backoff = Backoff(retries=2, base_s=0.01, cap_s=1.0)
    assert backoff.delay_s(1, None) is not None
    assert backoff.delay_s(2, None) is not None
    assert backoff.delay_s(3, None) is None
    assert backoff.delay_s(10, None) is None
    assert Backoff(retries=0, base_s=0.01, cap_s=1.0).delay_s(1, None) is None


def test_a_wait_that_would_reach_the_deadline_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    backoff = Backoff(retries=5, base_s=1.0, cap_s=8.0)
    jitter(monkeypatch, 0.0)  # the shortest wait: half of 1 s
    assert backoff.delay_s(1, time.monotonic() + 0.4) is None  # even the shortest wait would pass the deadline
    assert backoff.delay_s(1, time.monotonic() - 1.0) is None  # the deadline has passed
    far = time.monotonic() + 3600.0
    assert backoff.delay_s(1, far) == pytest.approx(0.5)
    assert backoff.delay_s(4, far) == pytest.approx(4.0)
    near = time.monotonic() + 3.0
    assert backoff.delay_s(1, near) == pytest.approx(0.5)
    assert backoff.delay_s(4, near) is None  # 4 s would pass a deadline 3 s away


def test_the_delay_ends_before_the_deadline_whatever_the_jitter() -> None:
    backoff = Backoff(retries=10, base_s=0.05, cap_s=2.0)
    for attempt in range(1, 11):
        for _ in range(50):
            asked = time.monotonic()
            deadline = asked + 1.0
            delay = backoff.delay_s(attempt, deadline)
            assert delay is None or asked + delay < deadline
