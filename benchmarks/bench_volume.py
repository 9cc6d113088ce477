"""Whole-volume mode against window mode, side by side in one run: bytes and wall time, on loopback and on 1 Gbit/s.

    sudo .venv/bin/python benchmarks/bench_volume.py [--cases sample 512x512x300] [--rounds 3] [--out DIR]

Cases: ``sample``, the sample app's data flow on the full MNI T1 (its transforms, its model, its settings:
96^3 windows at overlap 0.25); ``512x512x300``, a synthetic float32 volume of 315 MB through a 2-class
pointwise network with random weights, 96^3 windows at overlap 0.6 (issue 18's example; the network costs
next to nothing, so transfer is what is measured).

Links: the host's loopback (paths with system shared memory and with tensors in the gRPC body), and a network
namespace made for the run whose loopback is shaped to 1 Gbit/s with ``tbf`` (``volume/link.py``), where
tensors always cross the link in the gRPC body, as from another host. Per case, one worker process per link
(``volume/worker.py``, inside the namespace for the shaped link) starts its own local server with the network
and its ``_volume`` model and keeps every path's backend open; each round runs every path of both links once,
in an order rotated from round to round, after one warm-up run per path.

Bytes are the tensors the client sent and received (counted by the client), checked against Triton's
statistics (the requests the server counted for the model the client called) and, on the shaped link,
against what the namespace's loopback carried (the payload plus gRPC, HTTP/2 and TCP framing). Every path of
a case must give the same labels. The floor of issue 18: on the shaped link volume mode moves at least 10x
fewer bytes than window mode and takes less time.
"""

from __future__ import annotations

import argparse
import json
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.volume.link import ShapedLink  # noqa: E402
from benchmarks.volume.worker import CASES, LINK_PATHS  # noqa: E402

MB = 1e6
BASE = {"loopback": "window, shm", "1 Gbit/s": "window, gRPC body"}
READY_TIMEOUT_S = 1200.0
RUN_TIMEOUT_S = 1800.0


class Worker:
    """One link's worker process: a local server and the client paths, asked over a pipe, one answer per line."""

    def __init__(self, case: str, link: str, work: Path, shaped: ShapedLink) -> None:
        argv = [sys.executable, "-m", "benchmarks.volume.worker", "--case", case, "--link", link, "--work", str(work)]
        work.mkdir(parents=True, exist_ok=True)
        self.log = (work / "worker.log").open("w")
        self.link = link
        self.process = subprocess.Popen(
            shaped.wrap(argv) if link != "loopback" else argv,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.ready = self._read(READY_TIMEOUT_S)

    def ask(self, command: dict[str, Any], timeout_s: float = RUN_TIMEOUT_S) -> dict[str, Any]:
        stdin = self.process.stdin
        assert stdin is not None  # noqa: S101 - made with a pipe
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()
        return self._read(timeout_s)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None  # noqa: S101 - made with a pipe
        readable, _, _ = select.select([stdout], [], [], timeout_s)
        if not readable:
            raise RuntimeError(f"the {self.link} worker gave no answer within {timeout_s:g} s: see {self.log.name}")
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.link} worker ended (exit code {self.process.wait()}): see {self.log.name}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> dict[str, Any]:
        try:
            return self.ask({"do": "quit"}, timeout_s=120.0) if self.process.poll() is None else {}
        except (RuntimeError, OSError, ValueError):
            return {}
        finally:
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
            self.log.close()


def bench_case(case: str, rounds: int, out: Path, shaped: ShapedLink) -> dict[str, Any]:
    workers: dict[str, Worker] = {}
    try:
        for link in LINK_PATHS:
            workers[link] = Worker(case, link, out / case / link.replace(" ", "").replace("/", ""), shaped)
        probes = {link: worker.ask({"do": "probe"})["mbit_s"] for link, worker in workers.items()}
        order = [(link, path) for link in LINK_PATHS for path in LINK_PATHS[link]]
        for link, path in order:  # warm-up: first requests, output sizes learned, slots made
            print(f"{case}: warm-up {link}: {path}", file=sys.stderr, flush=True)
            workers[link].ask({"do": "run", "path": path})
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in order}
        for index in range(rounds):
            shift = index % len(order)
            for link, path in order[shift:] + order[:shift]:
                print(f"{case}: round {index + 1}/{rounds}: {link}: {path}", file=sys.stderr, flush=True)
                runs[(link, path)].append(workers[link].ask({"do": "run", "path": path}))
    finally:
        closing = {link: worker.close() for link, worker in workers.items()}
    peaks = [c.get("stub_peak_mb") for c in closing.values() if c.get("stub_peak_mb")]
    return {"case": case, "probes": probes, "runs": runs, "stub_peak_mb": max(peaks) if peaks else None}


def table(result: dict[str, Any]) -> str:
    runs = result["runs"]
    lines = [
        f"**{result['case']}**: a plain TCP stream measured "
        + ", ".join(f"{mbit:,.0f} Mbit/s on {link}" for link, mbit in result["probes"].items()),
        "",
        "| link | path | sent MB | received MB | x fewer bytes | on the link MB | requests: client / Triton "
        "(called) / network | median s | fastest s | x window s (per round) |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for (link, path), done in runs.items():
        first, base = done[0], runs[(link, BASE[link])][0]
        moved = first["sent"] + first["received"]
        fewer = (base["sent"] + base["received"]) / moved
        wire = f"{first['link'] / MB:,.1f} ({first['link'] / moved:.3f}x)" if first["link"] is not None else "-"
        called = first["triton"]["volume" if path.startswith("volume") else "network"]
        check = "" if called == first["requests"] else " MISMATCH"
        requests = f"{first['requests']} / {called} / {first['triton']['network']}{check}"
        walls = [r["wall_s"] for r in done]
        per_round = [r["wall_s"] / b["wall_s"] for r, b in zip(done, runs[(link, BASE[link])], strict=True)]
        lines.append(
            f"| {link} | {path} | {first['sent'] / MB:,.1f} | {first['received'] / MB:,.1f} | {fewer:.1f} | {wire} | "
            f"{requests} | {statistics.median(walls):.2f} | {min(walls):.2f} | {statistics.median(per_round):.2f} |"
        )
    if result["stub_peak_mb"]:
        lines += ["", f"Peak resident memory of the volume model's process: {result['stub_peak_mb']:,.0f} MB."]
    return "\n".join(lines) + "\n"


def checks(result: dict[str, Any]) -> list[str]:
    """The labels agree across every path; the floor on the shaped link; Triton's counts match the client's."""
    runs = result["runs"]
    found = []
    digests = {r["labels"] for done in runs.values() for r in done}
    found.append(f"labels identical on every path and round: {'yes' if len(digests) == 1 else f'NO {digests}'}")
    window, volume = runs[("1 Gbit/s", "window, gRPC body")], runs[("1 Gbit/s", "volume, gRPC body")]
    fewer = (window[0]["sent"] + window[0]["received"]) / (volume[0]["sent"] + volume[0]["received"])
    faster = statistics.median(r["wall_s"] for r in window) / statistics.median(r["wall_s"] for r in volume)
    met = fewer >= 10 and faster > 1
    found.append(f"floor on 1 Gbit/s: {fewer:.1f}x fewer bytes, {faster:.2f}x faster: {'met' if met else 'NOT met'}")
    mismatched = [
        f"{link}: {path}"
        for (link, path), done in runs.items()
        for r in done
        if r["requests"] != r["triton"]["volume" if path.startswith("volume") else "network"]
    ]
    found.append(f"client requests = Triton's count: {'yes' if not mismatched else f'NO {mismatched}'}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["sample", "512x512x300"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "output" / "bench_volume")
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M")
    results = []
    with ShapedLink() as shaped:
        print(f"shaped link: namespace {shaped.name}: {shaped.describe()}", file=sys.stderr, flush=True)
        for case in args.cases:
            results.append(bench_case(case, args.rounds, args.out, shaped))
    args.out.mkdir(parents=True, exist_ok=True)
    saved = [{**r, "runs": {f"{k[0]} | {k[1]}": v for k, v in r["runs"].items()}} for r in results]
    (args.out / "results.json").write_text(json.dumps(saved, indent=1))
    print(f"bench_volume {started}, rounds {args.rounds}\n")
    for result in results:
        print(table(result))
        print("\n".join(f"- {line}" for line in checks(result)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
