"""What a path of ``bench_ensemble.py`` used: CPU seconds per process group, the machine's other load, requests in
flight over time, and requests per server.

On a machine shared with other work, a ratio of wall times says little unless one also knows how many cores the
path had and used. ``Usage.take`` reads, from ``/proc``, the CPU time (user + system, every thread) of

- ``client``: this process (the sliding window, the codec; for ``triton`` in-process also Triton's own core),
- ``stubs``: this process's children but the servers: the in-process server's Python-backend stubs (one a model),
- ``server0``, ``server1``...: each local tritonserver with its own stubs,

and the whole machine's busy time (``/proc/stat``), so that ``others`` (busy, less all the above) is the load of
processes that are not ours. ``InFlight`` samples the members' requests in flight every ``period_s`` (a thread),
``served`` reads each server's execution count of every member (Triton's statistics).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.proc_table import TICK, processes
from monai_triton_ops.backends.base import BaseBackend


def _machine_busy_s() -> tuple[float, float]:
    """``(busy, all)`` CPU seconds of the whole machine since boot, every core summed."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / TICK, sum(values) / TICK


@dataclass
class Usage:
    """CPU seconds per group at one moment; ``b - a`` is what was used between."""

    groups: dict[str, float]
    busy_s: float
    total_s: float
    at: float

    @classmethod
    def take(cls, servers: Sequence[int]) -> Usage:
        """Now, for this process, its stubs, and each server (a pid) with its children."""
        found, me = processes(), os.getpid()
        groups = {"client": found.get(me, (0, 0.0))[1]}
        groups["stubs"] = sum(cpu for pid, (parent, cpu) in found.items() if parent == me and pid not in servers)
        for index, pid in enumerate(servers):
            own = found.get(pid, (0, 0.0))[1]
            groups[f"server{index}"] = own + sum(cpu for parent, cpu in found.values() if parent == pid)
        busy, total = _machine_busy_s()
        return cls(groups, busy, total, time.perf_counter())

    def since(self, start: Usage) -> dict[str, float]:
        """CPU seconds per group between ``start`` and this, with ``others`` and ``wall``."""
        used = {name: seconds - start.groups.get(name, 0.0) for name, seconds in self.groups.items()}
        ours = sum(used.values())
        used["others"] = max(0.0, (self.busy_s - start.busy_s) - ours)
        used["wall"] = self.at - start.at
        return used


@dataclass
class InFlight:
    """A thread that sums the backends' ``in_flight`` every ``period_s`` until ``stop()``."""

    backends: Sequence[BaseBackend]
    period_s: float = 0.005  # each sample costs the client it measures a little CPU
    samples: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="in-flight sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append(sum(backend.in_flight for backend in self.backends))

    def stop(self) -> dict[str, float]:
        """Mean and most requests in flight, and the share of samples with none (the client's own time)."""
        self._stop.set()
        self._thread.join()
        samples = self.samples or [0]
        return {"mean": statistics.fmean(samples), "max": max(samples), "idle": samples.count(0) / len(samples)}


def served(backends: Iterable[BaseBackend]) -> dict[str, int]:
    """Executions per server, every member's summed (remote backends' Triton statistics; {} for others)."""
    counts: dict[str, int] = {}
    for backend in backends:
        reader = getattr(backend, "statistics", None)
        if reader is None or backend.kind != "remote":
            continue
        for entry in reader().get("model_stats", []):
            server = str(entry.get("server", "?"))
            counts[server] = counts.get(server, 0) + int(
                entry.get("inference_stats", {}).get("success", {}).get("count", 0)
            )
    return counts


def pin(pid: int, cores: set[int]) -> int:
    """Every thread of ``pid`` and of its children on ``cores`` (a server and its stubs); returns threads pinned."""
    pinned = 0
    family = [pid, *(child for child, (parent, _) in processes().items() if parent == pid)]
    for member in family:
        for task in os.listdir(f"/proc/{member}/task"):
            try:
                os.sched_setaffinity(int(task), cores)
                pinned += 1
            except OSError:  # ended meanwhile
                continue
    return pinned


def sessions(servers: Sequence[int]) -> str:
    """How the kernel shares the CPU among our processes: with autogroup on, per session (the client is one, each
    tritonserver, started in a session of its own, another), not per thread; so on a loaded machine more threads
    in one session do not get it more CPU."""
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not enabled.exists() or enabled.read_text().strip() != "1":
        return "kernel autogroup scheduling off: CPU shared per thread"
    groups = {"client": os.getpid(), **{f"server{i}": pid for i, pid in enumerate(servers)}}
    named = ", ".join(f"{name} {Path(f'/proc/{pid}/autogroup').read_text().split()[0]}" for name, pid in groups.items())
    return f"kernel autogroup scheduling on: CPU shared per session ({named})"


def wait_for_quiet(cores: float, limit_s: float, period_s: float = 1.0) -> float:
    """Wait (at most ``limit_s``) until the machine, this process idle, was busy under ``cores`` for ``period_s``;
    returns the cores it was last seen busy: a round started then is less likely to share the machine."""
    deadline = time.monotonic() + limit_s
    while True:
        busy = _machine_busy_s()[0]
        time.sleep(period_s)
        busy_after = _machine_busy_s()[0]
        seen = (busy_after - busy) / period_s
        if seen < cores or time.monotonic() >= deadline:
            return seen
