"""Time every path in turn, round after round, with one progress bar; the statistics read from the times.

Each round runs every path once (``repeats`` calls each, one for the paths too slow to repeat), in an
order rotated from round to round, after a warm-up call per path. A slow spell on a shared machine then
hits every path of a round alike, which is why ratios are taken per round and their median reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

Call = Callable[[Any], Any]
#: label -> per round, the milliseconds of each call in that round
Times = dict[str, list[list[float]]]


@dataclass
class Plan:
    """What one workload runs: its paths, and how often each is called."""

    calls: Mapping[str, Call]
    rounds: int
    repeats: int = 1
    once_per_round: frozenset[str] = field(default_factory=frozenset)
    no_warmup: frozenset[str] = field(default_factory=frozenset)

    def calls_per_round(self) -> int:
        return sum(1 if label in self.once_per_round else self.repeats for label in self.calls)

    def total(self) -> int:
        """Calls to time, warm-up included (the progress bar's length)."""
        return len(set(self.calls) - self.no_warmup) + self.rounds * self.calls_per_round()


def interleaved(plan: Plan, data: Any, bar: tqdm[Any] | None = None, what: str = "") -> Times:
    """Warm the paths up once (``no_warmup`` aside), then ``plan.rounds`` rounds of every path (order rotated)."""
    labels = list(plan.calls)
    for label in [label for label in labels if label not in plan.no_warmup]:
        _describe(bar, f"{what} warm-up: {label}")
        plan.calls[label](data)
        _advance(bar)
    times: Times = {label: [] for label in labels}
    for round_index in range(plan.rounds):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            _describe(bar, f"{what} round {round_index + 1}/{plan.rounds}: {label}")
            calls = []
            for _ in range(1 if label in plan.once_per_round else plan.repeats):
                start = time.perf_counter()
                plan.calls[label](data)
                calls.append((time.perf_counter() - start) * 1000)
                _advance(bar)
            times[label].append(calls)
    return times


def median(times: Times, label: str) -> float:
    """The median call of ``label`` over every round (ms)."""
    return statistics.median(t for calls in times[label] for t in calls)


def spread(times: Times, label: str) -> tuple[float, float]:
    """The fastest and slowest call of ``label`` (ms)."""
    flat = [t for calls in times[label] for t in calls]
    return min(flat), max(flat)


def ratio(times: Times, label: str, base: str) -> float:
    """Median over rounds of (``label``'s median / ``base``'s median) in the same round."""
    rounds = zip(times[label], times[base], strict=True)
    return statistics.median(statistics.median(a) / statistics.median(b) for a, b in rounds)


def _describe(bar: tqdm[Any] | None, text: str) -> None:
    if bar is not None:
        bar.set_description_str(text[:60].ljust(60))


def _advance(bar: tqdm[Any] | None) -> None:
    if bar is not None:
        bar.update(1)
