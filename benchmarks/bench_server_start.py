"""Time a ``LocalTritonServer`` start on four Python-backend models, as Triton loads them before and after
``server/load_settings.py``.

Side by side, round by round, one start of each path per round (each start until every model is ready, then a
stop): Triton's defaults (four models at once, auto-complete on: one extra stub per model); one at a time;
auto-complete off (what a start does now); both. The repository is the volume-mode test's: the sample
model and an untrained one, each with its ``_volume`` model (all four stubs import torch, two import MONAI). Prints
the median wall seconds and CPU seconds (the server and its stubs, reaped) per start and the ratios to the first path.

    .venv/bin/python benchmarks/bench_server_start.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from monai.data import save_net_with_metadata
from monai.networks.nets import UNet

from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.volume import wrap_network
from monai_triton_ops.server import LocalTritonServer, options

ROOT = Path(__file__).resolve().parents[1]
#: Each path: how many models load at once, and whether Triton auto-completes the configs.
PATHS: dict[str, tuple[int, bool]] = {
    "Triton's defaults (4 at once, auto-complete)": (4, True),
    "one at a time, auto-complete": (1, True),
    "4 at once, no auto-complete (now)": (4, False),
    "one at a time, no auto-complete": (1, False),
}


def make_repository(folder: Path) -> Path:
    """The sample model and an untrained UNet, each wrapped with its ``_volume`` model."""
    repo = folder / "repo"
    shutil.copytree(ROOT / "model_repository" / "brain_tissue_seg", repo / "brain_tissue_seg")
    torch.manual_seed(1)
    network = UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(8, 16, 32), strides=(2, 2), num_res_units=1)
    meta = {
        "network_data_format": {
            "inputs": {"image": {"num_channels": 1, "spatial_shape": ["16*n"] * 3, "dtype": "float32"}},
            "outputs": {"pred": {"num_channels": 2, "spatial_shape": ["16*n"] * 3, "dtype": "float32"}},
        }
    }
    save_net_with_metadata(torch.jit.script(network.eval()), str(folder / "untrained"), meta_values=meta)
    build_repository(folder / "untrained.ts", repo, "untrained_seg")
    for name in ("brain_tissue_seg", "untrained_seg"):
        wrap_network(repo, name)
    return repo


def start_once(repo: Path, threads: int, auto_complete: bool) -> tuple[float, float]:
    """Wall and CPU seconds (children reaped: the server and its stubs) of one start until ready."""
    options.needs_auto_complete = lambda _repository: auto_complete  # the launcher's choice, made for this path
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with LocalTritonServer(repo, startup_timeout_s=300.0, model_load_thread_count=threads):
        wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        repo = make_repository(Path(scratch))
        walls: dict[str, list[float]] = {label: [] for label in PATHS}
        cpus: dict[str, list[float]] = {label: [] for label in PATHS}
        for _ in range(args.rounds):
            for label, (threads, auto_complete) in PATHS.items():
                wall, cpu = start_once(repo, threads, auto_complete)
                walls[label].append(wall)
                cpus[label].append(cpu)
    first = next(iter(PATHS))
    base_wall, base_cpu = statistics.median(walls[first]), statistics.median(cpus[first])
    cores = len(os.sched_getaffinity(0))
    print(f"{args.rounds} interleaved rounds, {cores} cores, load {os.getloadavg()[0]:.2f}\n")
    print("| path | median wall s | ratio | median CPU s | ratio |\n|---|---:|---:|---:|---:|")
    for label in PATHS:
        wall, cpu = statistics.median(walls[label]), statistics.median(cpus[label])
        print(f"| {label} | {wall:.1f} | {wall / base_wall:.2f} | {cpu:.1f} | {cpu / base_cpu:.2f} |")


if __name__ == "__main__":
    main()
