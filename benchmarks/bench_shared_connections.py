"""Five models of one process on one 2-server fleet: what opening them costs, and what the process holds, per tree.

Two local ``tritonserver`` processes serve five passthrough models (the same five on both). For each source tree
given with ``--tree`` (``PYTHONPATH`` first: an older checkout is the "before"), round by round, a fresh client
process opens the five models on ``grpc://A,B`` (and ``http://A,B``), sends each 20 one-at-a-time requests with
``infer()``, 20 with ``submit()``, then 5 at once per model, and reports: the wall time of the five opens, the time
per request of each path (32 KB in, 32 KB out), the TCP connections it holds to each server, its
open files and threads above what it had before the five opens (after one model opened, used and closed: imports
and what a process keeps, alike for every tree), and its probing threads. Prints the medians.

    .venv/bin/python benchmarks/bench_shared_connections.py --tree /tmp/before --tree . [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = [f"m{i}" for i in range(5)]
ROOT = Path(__file__).resolve().parents[1]


def client(spec: str, ports: list[int]) -> dict[str, float]:
    """In the client process: open the five models, send, count; one JSON line out."""
    import threading
    import time
    from concurrent.futures import wait

    import numpy as np

    from monai_triton_ops import create_backend
    from tests.backends.remote.sharing import connections_to

    x = np.arange(4096, dtype=np.float32)
    with create_backend(spec, MODELS[0]) as warm:  # imports, and what the process keeps, before the counts and times
        warm.submit({"INPUT__0": x}).result(timeout=60)
    fds0, threads0 = len(os.listdir("/proc/self/fd")), threading.active_count()
    start = time.perf_counter()
    backends = [create_backend(spec, model).open() for model in MODELS]
    opened_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(20):
        for backend in backends:
            np.testing.assert_array_equal(backend.infer({"INPUT__0": x})["OUTPUT__0"], x)
    infer_ms = (time.perf_counter() - start) * 1000 / (20 * len(backends))
    start = time.perf_counter()
    for _ in range(20):
        for backend in backends:
            np.testing.assert_array_equal(backend.submit({"INPUT__0": x}).result(timeout=60)["OUTPUT__0"], x)
    submit_ms = (time.perf_counter() - start) * 1000 / (20 * len(backends))
    wait([b.submit({"INPUT__0": x + i}) for b in backends for i in range(5)], timeout=60)
    found = {
        "open_s": opened_s,
        "infer_ms": infer_ms,
        "submit_ms": submit_ms,
        "connections_per_server": max(connections_to(port) for port in ports),
        "fds_added": len(os.listdir("/proc/self/fd")) - fds0,
        "threads_added": threading.active_count() - threads0,
        "probing_threads": sum(1 for t in threading.enumerate() if t.name.startswith("probe-")),
    }
    for backend in backends:
        backend.close()
    return found


def run_client(tree: Path, spec: str, ports: list[int]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--client", spec, "--ports", *map(str, ports)]
    done = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=True, timeout=300)
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, action="append", help="source tree (default: this checkout)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--schemes", nargs="+", default=["grpc", "http"])
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--ports", type=int, nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        print(json.dumps(client(args.client, args.ports)))
        return
    sys.path.insert(0, str(ROOT))
    from monai_triton_ops.server import LocalTritonServer
    from tests import triton_models

    trees = [t.resolve() for t in args.tree or [ROOT]]
    repo = Path(tempfile.mkdtemp(prefix="bench_shared_")) / "repo"
    for model in MODELS:
        triton_models.passthrough(repo, model)
    with LocalTritonServer(repo, startup_timeout_s=180) as a, LocalTritonServer(repo, startup_timeout_s=180) as b:
        found: dict[tuple[str, Path], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for scheme in args.schemes:
                hosts = [(a.grpc_port, b.grpc_port), (a.http_port, b.http_port)][scheme == "http"]
                spec = f"{scheme}://" + ",".join(f"127.0.0.1:{port}" for port in hosts)
                for tree in trees:
                    found.setdefault((scheme, tree), []).append(run_client(tree, spec, list(hosts)))
    print(f"{args.rounds} interleaved rounds, load {os.getloadavg()[0]:.2f}; 5 models on a 2-server fleet\n")
    print(
        "| scheme | tree | open 5 (ms) | infer() ms | submit() ms | connections / server | fds added | threads added "
        "| probing threads |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (scheme, tree), rows in found.items():
        med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        print(
            f"| {scheme} | {tree} | {med['open_s'] * 1000:.0f} | {med['infer_ms']:.2f} | {med['submit_ms']:.2f} | "
            f"{med['connections_per_server']:.0f} | "
            f"{med['fds_added']:.0f} | {med['threads_added']:.0f} | {med['probing_threads']:.0f} |"
        )


if __name__ == "__main__":
    main()
