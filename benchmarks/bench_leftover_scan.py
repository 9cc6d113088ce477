"""Time what every server start does first: clear what dead launchers left (``server.environment``).

Side by side, round by round: unlinking stale shared-memory regions alone (all a start did before stop 24), and
ending stale Python-backend stubs (a scan of ``/proc``) then unlinking the regions (what a start does now).
Prints the median per call in ms, the ratio, and how many processes ``/proc`` listed.

    .venv/bin/python benchmarks/bench_leftover_scan.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from monai_triton_ops.server import environment

PATHS: dict[str, Callable[[], object]] = {
    "regions only (before)": environment.remove_stale_shm_regions,
    "stubs, then regions (now)": environment.remove_leftovers_of_dead_launchers,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    times: dict[str, list[float]] = {label: [] for label in PATHS}
    for _ in range(args.rounds):
        for label, clear in PATHS.items():
            start = time.perf_counter()
            clear()
            times[label].append((time.perf_counter() - start) * 1000)
    processes = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
    first = statistics.median(next(iter(times.values())))
    print(f"{args.rounds} interleaved rounds, {processes} processes in /proc, load {os.getloadavg()[0]:.2f}\n")
    print("| path | median ms | ratio |\n|---|---:|---:|")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"| {label} | {median:.3f} | {median / first:.1f} |")


if __name__ == "__main__":
    main()
