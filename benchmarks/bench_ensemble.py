"""An ensemble in parallel against its members one after another, side by side in one run; and its memory.

    .venv/bin/python benchmarks/bench_ensemble.py [--members 5] [--size 96] [--rounds 3] [--out DIR]

Five members of the sample model (``model_repository/brain_tissue_seg`` copied as ``member0..4``, each with
``INTRA_OP_THREAD_COUNT=1``: one core per request, so that the machine's cores are the room the ensemble can
use) on a synthetic ``SIZE^3`` volume with the model's own settings (96^3 windows, overlap 0.25). Two places:

- ``fleet``: two local tritonservers over that repository, each member a ``grpc://P1,P2`` fleet backend;
- ``triton``: the in-process server, each member loaded into it.

On each, ``ensemble`` is ``EnsemblePredictor`` over the five (every window sent to every member together,
the mean summed as results arrive) and ``sequential`` is each member run alone, one after another, its
result added to a mean by hand. Every path keeps its backends open; one warm-up run each; then every round
runs the four paths once, in an order rotated from round to round. The ensemble must equal the hand mean.

Memory (``--rss``): two fresh processes against the fleet, one running one member alone and one the
ensemble, each reporting its peak RSS and the bytes it wrote (``/proc/self/io``): the ensemble's peak should
be at most the single model's plus two output volumes, and it writes no probabilities to disk.
"""

from __future__ import annotations

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

from monai_triton_ops import create_backend, run_inference  # noqa: E402
from monai_triton_ops.backends.base import BaseBackend  # noqa: E402
from monai_triton_ops.pipeline import EnsemblePredictor, InferenceSettings  # noqa: E402

SAMPLE = ROOT / "model_repository" / "brain_tissue_seg"
ONE_THREAD = 'parameters {\n  key: "INTRA_OP_THREAD_COUNT"\n  value {\n    string_value: "1"\n  }\n}\n'


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


def timings(args: argparse.Namespace, paths: dict[str, Callable[[], torch.Tensor]]) -> dict[str, list[float]]:
    results: dict[str, torch.Tensor] = {name: run() for name, run in paths.items()}  # warm-up, and the check
    for place in ("fleet", "triton"):
        diff = float((results[f"{place} ensemble"] - results[f"{place} sequential"]).abs().max())
        print(f"{place}: ensemble vs sequential mean, max abs diff {diff:.2e}", flush=True)
        if diff > 1e-5:
            raise SystemExit(f"{place}: the ensemble is not the mean of its members (max abs diff {diff})")
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            started = time.perf_counter()
            paths[name]()
            seconds[name].append(time.perf_counter() - started)
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in seconds.items()), flush=True)
    return seconds


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
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rss-worker", choices=("single", "ensemble"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--names", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_worker:
        rss_worker(args.rss_worker, args.spec, args.names.split(","), args.size)
        return
    from monai_triton_ops.server import LocalTritonServer

    with tempfile.TemporaryDirectory(prefix="bench_ensemble_") as work, ExitStack() as stack:
        repo = Path(work) / "repo"
        names = make_repository(repo, args.members)
        servers = [stack.enter_context(LocalTritonServer(repo, startup_timeout_s=600.0)) for _ in range(2)]
        fleet_spec = "grpc://" + ",".join(s.grpc_address for s in servers)
        fleet = [stack.enter_context(create_backend(fleet_spec, n).open()) for n in names]
        inproc = [stack.enter_context(create_backend("triton", n, model_repository=repo).open()) for n in names]
        image = volume(args.size)
        paths = {
            "fleet ensemble": lambda: ensemble(image, fleet),
            "fleet sequential": lambda: sequential(image, fleet),
            "triton ensemble": lambda: ensemble(image, inproc),
            "triton sequential": lambda: sequential(image, inproc),
        }
        seconds = timings(args, paths)
        rss = memory(fleet_spec, names, args.size)
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "median_s": medians, "rounds_s": seconds, "rss": rss}
    for place in ("fleet", "triton"):
        ratio = medians[f"{place} ensemble"] / medians[f"{place} sequential"]
        print(f"{place}: ensemble {medians[f'{place} ensemble']:.2f} s, sequential "
              f"{medians[f'{place} sequential']:.2f} s, ratio {ratio:.2f}")  # fmt: skip
        report[f"{place}_ratio"] = ratio
    single, both = rss["single"], rss["ensemble"]
    print(f"peak RSS: single model {single['peak_rss_mb']:.0f} MB, ensemble {both['peak_rss_mb']:.0f} MB "
          f"(+{both['peak_rss_mb'] - single['peak_rss_mb']:.0f} MB; one output volume {single['output_mb']:.1f} MB); "
          f"written to disk: {single['written_bytes']} / {both['written_bytes']} bytes")  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_ensemble.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
