"""Bounded exponential backoff inside a deadline, for transient errors only.

A retry is worth it when the server or the path to it may recover in a moment (Triton answers
UNAVAILABLE while a model loads, when a queue is full, while it shuts down; a connection is refused
while it restarts). It is never worth it once the deadline would pass before the next attempt ends,
and never for an error the model itself reported: a client timeout does not stop the server's work,
so a blind retry only doubles the load.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from ...errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """``retries`` more attempts after the first, waiting ``base_s * 2**n`` (capped, with jitter) before each."""

    retries: int = 3
    base_s: float = 0.05
    cap_s: float = 1.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if not (self.base_s >= 0 and self.cap_s >= self.base_s):
            raise ConfigError(f"backoff needs 0 <= base_s <= cap_s, got {self.base_s}, {self.cap_s}")

    def delay_s(self, attempt: int, deadline: float | None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` >= 1 done), or ``None``: give up.

        Gives up when the retries are spent or when waiting would leave no time before ``deadline``
        (a ``time.monotonic()`` value).
        """
        if attempt > self.retries:
            return None
        delay = float(min(self.cap_s, self.base_s * 2 ** (attempt - 1)))
        delay *= 0.5 + random.random() / 2  # noqa: S311 - jitter, not cryptography
        if deadline is not None and time.monotonic() + delay >= deadline:
            return None
        return delay
