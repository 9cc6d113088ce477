"""The machine's process table from ``/proc``: who is whose parent, and the CPU time each has used.

Shared by the benchmarks that count what a run's own processes hold or use (``soak.py``: its children's
shared-memory files; ``ensemble_usage.py``: CPU seconds per server and its stubs).
"""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def processes() -> dict[int, tuple[int, float]]:
    """``pid -> (parent pid, CPU seconds)`` of every process we can read."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        found[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children...)."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in processes().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
