"""An ensemble in parallel against its members one after another, side by side in one run; what each path used;
and its memory.

    .venv/bin/python benchmarks/bench_ensemble.py [--members 5] [--size 96] [--rounds 3] [--pin] [--out DIR]

Five members of the sample model (``model_repository/brain_tissue_seg`` copied as ``member0..4``, each with
``INTRA_OP_THREAD_COUNT=1``: one core per request, so that the machine's cores are the room the ensemble can
use) on a synthetic ``SIZE^3`` volume with the model's own settings (96^3 windows, overlap 0.25). Two places:

- ``fleet``: two local tritonservers over that repository, each member a ``grpc://P1,P2`` fleet backend;
  ``--pin`` puts each server (its stubs too) on a core of its own: two servers, two cores, as two machines;
- ``triton``: the in-process server, each member loaded into it.

On each, ``ensemble`` is ``EnsemblePredictor`` over the five (every window sent to every member together,
the mean summed as results arrive) and ``sequential`` is each member run alone, one after another, its
result added to a mean by hand. Every path keeps its backends open; one warm-up run each; then every round
runs the four paths once, in an order rotated from round to round. The ensemble must equal the hand mean.

What explains a figure is printed per path (``ensemble_usage.py``): CPU seconds of the client, the in-process
server's stubs and each server; ``cores``, ours over the wall time; ``others``, the cores other processes took
meanwhile (the machine is shared); requests in flight (mean, most); executions per server. The model declares
``max_batch_size: 0``, so a member alone has one request out at a time (a window batch is one request) and uses
one core: the sequential baseline leaves the second core free, the room the ensemble can use. Per-round ratios
are also given over the ``quiet`` rounds only: those whose two paths ran while others took under ``--quiet``
cores; ``--wait-quiet S`` waits up to S seconds before each round for the machine to be that quiet.

Memory (``--rss``): two fresh processes against the fleet, one running one member alone and one the
ensemble, each reporting its peak RSS and the bytes it wrote (``/proc/self/io``): the ensemble's peak should
be at most the single model's plus two output volumes, and it writes no probabilities to disk.
"""

from __future__ import annotations

import os

# The client's torch threads (blending) share the servers' cores: left spinning after their work (OpenMP's
# default), they take the cores the members need. LocalTritonServer sets the same for its servers.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.ensemble_usage import InFlight, Usage, pin, served, sessions, wait_for_quiet  # noqa: E402
from monai_triton_ops import create_backend, run_inference  # noqa: E402
from monai_triton_ops.backends.base import BaseBackend  # noqa: E402
from monai_triton_ops.pipeline import EnsemblePredictor, InferenceSettings  # noqa: E402

SAMPLE = ROOT / "model_repository" / "brain_tissue_seg"
ONE_THREAD = 'parameters {\n  key: "INTRA_OP_THREAD_COUNT"\n  value {\n    string_value: "1"\n  }\n}\n'
PLACES = ("fleet", "triton")


def make_repository(folder: Path, members: int) -> list[str]:
    """``member0..N-1``: copies of the sample model, one torch thread per request."""
    names = [f"member{i}" for i in range(members)]
    for name in names:
        shutil.copytree(SAMPLE, folder / name)
        config = folder / name / "config.pbtxt"
        text = config.read_text().replace('name: "brain_tissue_seg"', f'name: "{name}"', 1)
        config.write_text(text + ONE_THREAD)
    return names


def volume(size: int) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(0).standard_normal((1, size, size, size)).astype(np.float32))


def settings_of(backend: BaseBackend) -> InferenceSettings:
    return InferenceSettings.from_metadata(backend.signature.metadata)


def ensemble(image: torch.Tensor, backends: Sequence[BaseBackend]) -> torch.Tensor:
    predictor = EnsemblePredictor(backends)
    return run_inference(image, backends[0], settings_of(backends[0]), predictor=predictor)


def sequential(image: torch.Tensor, backends: Sequence[BaseBackend]) -> torch.Tensor:
    total = run_inference(image, backends[0], settings_of(backends[0])).clone()
    for backend in backends[1:]:
        total.add_(run_inference(image, backend, settings_of(backend)))
    return total / len(backends)


class TimedPath:
    """One timed path: how to run it, its backends (for requests in flight and per server) and the servers."""

    def __init__(self, run: Callable[[], torch.Tensor], backends: Sequence[BaseBackend], servers: list[int]) -> None:
        self.run, self.backends, self.servers = run, backends, servers

    def measure(self) -> dict[str, Any]:
        """One run: wall and CPU seconds per group, others' load, requests in flight, executions per server."""
        before = served(self.backends)
        sampler = InFlight(self.backends)
        start = Usage.take(self.servers)
        self.run()
        used = Usage.take(self.servers).since(start)
        flight = sampler.stop()
        after = served(self.backends)
        per_server = {server: count - before.get(server, 0) for server, count in after.items()}
        return {**used, "in_flight": flight, "per_server": per_server}


def timings(args: argparse.Namespace, paths: dict[str, TimedPath]) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, torch.Tensor] = {name: path.run() for name, path in paths.items()}  # warm-up, and the check
    for place in PLACES:
        diff = float((results[f"{place} ensemble"] - results[f"{place} sequential"]).abs().max())
        print(f"{place}: ensemble vs sequential mean, max abs diff {diff:.2e}", flush=True)
        if diff > 1e-5:
            raise SystemExit(f"{place}: the ensemble is not the mean of its members (max abs diff {diff})")
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
    names = list(paths)
    for round_ in range(args.rounds):
        if args.wait_quiet:
            busy = wait_for_quiet(args.quiet, args.wait_quiet)
            print(f"round {round_ + 1}: starts with the machine busy {busy:.2f} cores", flush=True)
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            found[name].append(paths[name].measure())
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {r[-1]['wall']:.2f} s" for n, r in found.items()), flush=True)
    return found


def explain(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of one path's rounds: wall, CPU per group, cores (ours, others'), in flight, per server."""
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0] if isinstance(runs[0][key], float)}
    ours = sum(v for k, v in median.items() if k not in ("wall", "others"))
    line = {**median, "cpu": ours, "cores": ours / median["wall"], "others_cores": median["others"] / median["wall"]}
    line["in_flight_mean"] = statistics.median(r["in_flight"]["mean"] for r in runs)
    line["in_flight_max"] = max(r["in_flight"]["max"] for r in runs)
    line["per_server"] = runs[-1]["per_server"]
    groups = " ".join(f"{k} {v:.2f}" for k, v in median.items() if k not in ("wall", "others") and v >= 0.005)
    print(f"  {name}: {median['wall']:.2f} s; CPU {ours:.2f} s ({groups}); cores {line['cores']:.2f}, others "
          f"{line['others_cores']:.2f}; in flight {line['in_flight_mean']:.1f} mean, {line['in_flight_max']} most; "
          f"per server {line['per_server'] or '-'}", flush=True)  # fmt: skip
    return line


def ratios(place: str, found: dict[str, list[dict[str, Any]]], quiet: float) -> dict[str, Any]:
    """Per-round ensemble/sequential ratios of a place: median of all rounds and of the quiet ones."""
    pairs = list(zip(found[f"{place} ensemble"], found[f"{place} sequential"], strict=True))
    each = [e["wall"] / s["wall"] for e, s in pairs]
    calm = [e["wall"] / s["wall"] for e, s in pairs if max(e["others"] / e["wall"], s["others"] / s["wall"]) < quiet]
    out = {"rounds": each, "median": statistics.median(each), "quiet_rounds": calm}
    out["quiet_median"] = statistics.median(calm) if calm else None
    quiet_text = f"{out['quiet_median']:.2f} over {len(calm)}" if calm else "none"
    print(f"{place}: per-round ratio median {out['median']:.2f} (range {min(each):.2f}-{max(each):.2f}); "
          f"quiet rounds (others < {quiet} cores): {quiet_text}", flush=True)  # fmt: skip
    return out


def rss_worker(mode: str, spec: str, names: list[str], size: int) -> None:
    """One fresh process: one member alone or the ensemble, once; prints peak RSS (MB) and bytes written."""
    image = volume(size)
    backends = [create_backend(spec, name).open() for name in (names[:1] if mode == "single" else names)]
    written = _written()
    started = time.perf_counter()
    result = (
        ensemble(image, backends) if mode == "ensemble" else run_inference(image, backends[0], settings_of(backends[0]))
    )
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"mode": mode, "peak_rss_mb": peak_mb, "written_bytes": _written() - written,
           "output_mb": result.numel() * 4 / 1e6, "seconds": seconds}  # fmt: skip
    for backend in backends:
        backend.close()
    print(json.dumps(out), flush=True)


def _written() -> int:
    """Bytes this process has caused to be written to storage (``write_bytes``; sockets and pipes not counted)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["write_bytes"])


def memory(spec: str, names: list[str], size: int) -> dict[str, Any]:
    found = {}
    for mode in ("single", "ensemble"):
        argv = [sys.executable, __file__, "--rss-worker", mode, "--spec", spec, "--names", ",".join(names)]
        done = subprocess.run([*argv, "--size", str(size)], capture_output=True, text=True, timeout=600, check=True)
        found[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pin", action="store_true", help="each fleet server (with its stubs) on a core of its own")
    parser.add_argument("--own-turns", action="store_true", help="each member's fleet its own round robin (as before)")
    parser.add_argument("--quiet", type=float, default=0.3, help="a round is quiet when others take fewer cores")
    parser.add_argument("--wait-quiet", type=float, default=0.0, help="wait up to this many s for a quiet round")
    parser.add_argument("--no-rss", action="store_true", help="skip the memory processes")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rss-worker", choices=("single", "ensemble"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--names", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_worker:
        rss_worker(args.rss_worker, args.spec, args.names.split(","), args.size)
        return
    if args.own_turns:
        import itertools

        from monai_triton_ops.backends.remote import fleet

        fleet.shared_turn = lambda origins: itertools.count()  # type: ignore[assignment]
    found, rss = measure_all(args)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": found, "rss": rss}
    for place in PLACES:
        print(f"{place}:")
        lines = {mode: explain(mode, found[f"{place} {mode}"]) for mode in ("ensemble", "sequential")}
        ratio = lines["ensemble"]["wall"] / lines["sequential"]["wall"]
        print(f"{place}: ensemble {lines['ensemble']['wall']:.2f} s, sequential {lines['sequential']['wall']:.2f} s, "
              f"ratio of medians {ratio:.2f}")  # fmt: skip
        report[place] = {"ratio": ratio, **lines, **ratios(place, found, args.quiet)}
    if rss:
        single, both = rss["single"], rss["ensemble"]
        print(f"peak RSS: single model {single['peak_rss_mb']:.0f} MB, ensemble {both['peak_rss_mb']:.0f} MB "
              f"(+{both['peak_rss_mb'] - single['peak_rss_mb']:.0f} MB; one output volume {single['output_mb']:.1f} "
              f"MB); written to disk: {single['written_bytes']} / {both['written_bytes']} bytes")  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_ensemble.json").write_text(json.dumps(report, indent=2))


def measure_all(args: argparse.Namespace) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Start the servers (pinned with ``--pin``), open every member on both places, time the four paths."""
    from monai_triton_ops.server import LocalTritonServer

    with tempfile.TemporaryDirectory(prefix="bench_ensemble_") as work, ExitStack() as stack:
        repo = Path(work) / "repo"
        names = make_repository(repo, args.members)
        servers = [stack.enter_context(LocalTritonServer(repo, startup_timeout_s=600.0)) for _ in range(2)]
        pids = [server.pid or 0 for server in servers]
        if args.pin:
            cores = sorted(os.sched_getaffinity(0))
            for index, pid in enumerate(pids):
                core = cores[index % len(cores)]
                print(f"server{index} (pid {pid}): {pin(pid, {core})} threads on core {core}", flush=True)
        print(sessions(pids), flush=True)
        fleet_spec = "grpc://" + ",".join(s.grpc_address for s in servers)
        fleet = [stack.enter_context(create_backend(fleet_spec, n).open()) for n in names]
        inproc = [stack.enter_context(create_backend("triton", n, model_repository=repo).open()) for n in names]
        image = volume(args.size)
        paths = {
            "fleet ensemble": TimedPath(lambda: ensemble(image, fleet), fleet, pids),
            "fleet sequential": TimedPath(lambda: sequential(image, fleet), fleet, pids),
            "triton ensemble": TimedPath(lambda: ensemble(image, inproc), inproc, pids),
            "triton sequential": TimedPath(lambda: sequential(image, inproc), inproc, pids),
        }
        found = timings(args, paths)
        rss = {} if args.no_rss else memory(fleet_spec, names, args.size)
    return found, rss


if __name__ == "__main__":
    main()
