"""Failover soak: thousands of requests over two real servers, one SIGKILLed and restarted every few hundred.

Two local ``tritonserver`` processes serve a passthrough model (Python backend, DLPack; ``--delay-ms`` per
request, so a kill often lands while a request is on the server). One client thread sends requests one after
another through one backend over both servers and checks every answer; a killer thread, every
``--kill-every`` requests (with a random offset), waits a random moment, SIGKILLs one server's whole process
group (alternately the first and the second) and starts a new one on the same ports. Printed per scheme:

    sent, answered, failed over (answered after its server failed), lost (raised or wrong: must be 0),
    kills, latency of a plain request and of one that failed over (median, max), the added latency of a
    failover (its median minus the plain median)

    .venv/bin/python benchmarks/soak_failover.py [--requests 2400] [--kill-every 400] [--schemes grpc http]
        [--delay-ms 2] [--seed 0]

Exit status 1 when a request was lost.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import logging
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monai_triton_ops import create_backend  # noqa: E402
from monai_triton_ops.errors import ServerError  # noqa: E402
from monai_triton_ops.server import LocalTritonServer  # noqa: E402
from tests import triton_models  # noqa: E402

MODEL = "soak"


class Replica:
    """A local server that can be SIGKILLed and started again on the same ports."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.server = LocalTritonServer(repo, startup_timeout_s=180.0).start()
        self.ports = (self.server.http_port, self.server.grpc_port, self.server.metrics_port)

    def kill_and_restart(self) -> float:
        """SIGKILL, then a new server on the same ports (a start that fails is tried again); seconds it was down."""
        down_at = time.monotonic()
        pid = self.server.pid
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)
        self.server.stop()
        http, grpc, metrics = self.ports
        for attempt in range(1, 4):
            server = LocalTritonServer(
                self.repo, http_port=http, grpc_port=grpc, metrics_port=metrics, startup_timeout_s=180.0
            )
            try:
                self.server = server.start()
                break
            except ServerError as exc:  # the server's own failure to start, not the client's: say so, try again
                print(f"restart {attempt} failed: {str(exc).splitlines()[0]}", flush=True)
        return time.monotonic() - down_at

    def url(self, scheme: str) -> str:
        return self.server.grpc_address if scheme == "grpc" else self.server.http_address


@dataclass
class Soak:
    sent: int = 0
    answered: int = 0
    failed_over: int = 0
    lost: list[str] = field(default_factory=list)
    kills: int = 0
    down_s: list[float] = field(default_factory=list)
    plain_ms: list[float] = field(default_factory=list)
    failover_ms: list[float] = field(default_factory=list)


class Killer:
    """On each trigger: a random moment, then SIGKILL one server (alternately) and bring it back.

    One thread for the whole script: a server is tied to the thread that started it (it dies with it).
    """

    def __init__(self, replicas: list[Replica], rng: random.Random) -> None:
        self.replicas, self.rng = replicas, rng
        self.trigger, self.stop, self.idle = threading.Event(), threading.Event(), threading.Event()
        self.soak = Soak()
        self.kills = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.idle.set()
            if not self.trigger.wait(timeout=0.1):
                continue
            self.idle.clear()
            self.trigger.clear()
            time.sleep(self.rng.uniform(0.0, 0.05))
            victim = self.replicas[self.kills % len(self.replicas)]
            self.kills += 1
            self.soak.kills += 1
            self.soak.down_s.append(victim.kill_and_restart())


def run(scheme: str, replicas: list[Replica], killer: Killer, args: argparse.Namespace) -> Soak:
    rng = random.Random(args.seed)  # noqa: S311 - when to kill, not cryptography
    soak = killer.soak = Soak()
    hosts = ",".join(r.url(scheme) for r in replicas)
    spec = f"{scheme}://{hosts}?timeout_s=60&probe_backoff_s=0.1&max_probe_backoff_s=1"
    backend = create_backend(spec, MODEL).open()
    next_kill = args.kill_every // 2 + rng.randrange(args.kill_every // 4 + 1)
    try:
        for i in range(args.requests):
            if i == next_kill:
                killer.trigger.set()
                next_kill += args.kill_every + rng.randrange(-(args.kill_every // 4), args.kill_every // 4 + 1)
            send(backend, i, soak)
    finally:
        deadline = time.monotonic() + 600
        while (killer.trigger.is_set() or not killer.idle.is_set()) and time.monotonic() < deadline:
            time.sleep(0.1)  # the last restart ends before the next scheme starts
        backend.close()
    return soak


def send(backend: Any, i: int, soak: Soak) -> None:
    """One request, checked; counted as plain, failed over or lost."""
    x = np.arange(256, dtype=np.float32) + i
    before = backend.events["failed_over"]
    started = time.perf_counter()
    soak.sent += 1
    try:
        out = backend.infer({"INPUT__0": x})["OUTPUT__0"]
    except Exception as exc:  # a lost request: counted and shown, the soak goes on
        soak.lost.append(f"{i}: {type(exc).__name__}: {exc}")
        return
    elapsed_ms = (time.perf_counter() - started) * 1000
    if not np.array_equal(out, x):
        soak.lost.append(f"{i}: wrong answer")
        return
    soak.answered += 1
    if backend.events["failed_over"] > before:
        soak.failed_over += 1
        soak.failover_ms.append(elapsed_ms)
    else:
        soak.plain_ms.append(elapsed_ms)


def report(scheme: str, soak: Soak) -> None:
    plain = statistics.median(soak.plain_ms) if soak.plain_ms else float("nan")
    fo_median = statistics.median(soak.failover_ms) if soak.failover_ms else float("nan")
    fo_max = max(soak.failover_ms) if soak.failover_ms else float("nan")
    print(
        f"| {scheme} | {soak.sent} | {soak.answered} | {soak.failed_over} | {len(soak.lost)} | {soak.kills} "
        f"| {plain:.2f} | {fo_median:.2f} / {fo_max:.2f} | {fo_median - plain:.2f} |"
    )
    for line in soak.lost[:10]:
        print(f"  lost {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2400)
    parser.add_argument("--kill-every", type=int, default=400)
    parser.add_argument("--schemes", nargs="+", default=["grpc", "http"], choices=["grpc", "http"])
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("monai_triton_ops.server").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="soak_") as folder:
        repo = Path(folder) / "repo"
        triton_models.passthrough(repo, MODEL, delay_s=args.delay_ms / 1000)
        replicas = [Replica(repo), Replica(repo)]
        killer = Killer(replicas, random.Random(args.seed + 1))  # noqa: S311
        results = {}
        try:
            for scheme in args.schemes:
                results[scheme] = run(scheme, replicas, killer, args)
        finally:
            for replica in replicas:
                replica.server.stop()
            killer.stop.set()
            killer.thread.join(timeout=60)
    print(f"\n{args.requests} requests per scheme, one in flight, a server killed about every {args.kill_every}")
    print(
        "| scheme | sent | answered | failed over | lost | kills | plain ms (median) | failed over ms "
        "(median / max) | added ms (median) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scheme, soak in results.items():
        report(scheme, soak)
    downs = [d for soak in results.values() for d in soak.down_s]
    if downs:
        print(f"\neach killed server was back after {min(downs):.1f}-{max(downs):.1f} s (restart and model load)")
    return 1 if any(soak.lost for soak in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
