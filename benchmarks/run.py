"""One benchmark command: W1 (transport) and W2 (the sample app) across every backend and the App SDK's client.

    .venv/bin/python benchmarks/run.py                       # every path, default sizes and rounds
    .venv/bin/python benchmarks/run.py --rounds 9 --w2-rounds 3 --plots docs/img
    .venv/bin/python benchmarks/run.py --skip "App SDK" --sizes 32 64 --w2-rounds 0   # a quick look
    make bench                                               # the figures of docs/benchmarks.md

It starts two local tritonservers (an identity model; the committed sample repository), opens every path of
``suite/paths.py``, times them interleaved round by round with one progress bar (stderr), prints the Markdown
tables (stdout) and writes two plots: ``bench_w1.png`` (latency against tensor size per path, log scale) and
``bench_w2.png`` (seconds per volume per backend). ``--json`` keeps every timed call for later plots.
"""

from __future__ import annotations

import os

# Client and server share this host's cores: OpenMP threads left spinning after their work (the default policy)
# take the cores the other side needs. LocalTritonServer sets the same for its servers.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import shutil
import sys
import tempfile
import warnings
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "apps" / "brain_tissue_seg")]

from monai_triton_ops import console  # noqa: E402

if __name__ == "__main__":
    console.prepare_process(restart=True)  # Holoscan's stack (its warning otherwise), before anything imports it

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks.suite import paths, report  # noqa: E402
from benchmarks.suite.timing import Plan, Times, interleaved  # noqa: E402

# The App SDK's client builds tensors from read-only buffers (torch warns once per process): its code, not the run's.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 96, 128, 160], help="W1: N of 1x1xN^3")
    parser.add_argument("--rounds", type=int, default=5, help="W1 rounds (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="W1 calls per path per round (slow paths: 1)")
    parser.add_argument("--w2-rounds", type=int, default=2, help="W2 rounds; 0 skips W2 (default: %(default)s)")
    parser.add_argument("--skip", nargs="+", default=[], metavar="TEXT", help="leave out paths whose label has TEXT")
    parser.add_argument("--only", nargs="+", default=[], metavar="TEXT", help="run only paths whose label has TEXT")
    parser.add_argument("--plots", type=Path, default=ROOT / "output" / "bench", help="folder for the PNGs")
    parser.add_argument("--json", type=Path, help="also write every timed call to this file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--from-json", type=Path, metavar="FILE", help="no run: tables and plots from a --json file")
    return parser.parse_args(argv)


def chosen(entries: dict[str, paths.Make], args: argparse.Namespace) -> dict[str, paths.Make]:
    keep = {k: v for k, v in entries.items() if not any(text in k for text in args.skip)}
    return {k: v for k, v in keep.items() if not args.only or any(text in k for text in args.only)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        print(summary([(int(size), times) for size, times in saved["w1"].items()], saved["w2"], args))
        return 0
    w1_entries, w2_entries = chosen(paths.W1_PATHS, args), chosen(paths.W2_PATHS, args)
    if not args.w2_rounds:
        w2_entries = {}
    work = Path(tempfile.mkdtemp(prefix="monai-triton-bench-"))
    try:
        return _run_in(work, w1_entries, w2_entries, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_in(
    work: Path, w1_entries: dict[str, paths.Make], w2_entries: dict[str, paths.Make], args: argparse.Namespace
) -> int:
    identity_repo, torch_repo = paths.write_identity_repositories(work)
    with ExitStack() as stack:  # servers start when a path first needs one, and stop here
        bench = paths.Bench(
            stack=stack, identity_repo=identity_repo, torch_repo=torch_repo, max_bytes=4 * max(args.sizes) ** 3
        )
        try:
            w1, w2 = run(bench, w1_entries, w2_entries, args)
        finally:
            for close in bench.closers:
                close()
    print(summary(w1, w2, args))
    if args.json is not None:
        dump = {"w1": {str(size): times for size, times in w1}, "w2": w2}
        args.json.write_text(json.dumps(dump, indent=1))
    return 0


def run(
    bench: paths.Bench, w1_entries: dict[str, paths.Make], w2_entries: dict[str, paths.Make], args: argparse.Namespace
) -> tuple[list[tuple[int, Times]], Times]:
    """Open the paths, then time W1 size by size and W2, all under one progress bar."""
    slow = frozenset({paths.APP_SDK})  # seconds to minutes per call: once per round, no warm-up call
    w1_calls = paths.open_paths(w1_entries, bench)
    w1_plan = Plan(calls=w1_calls, rounds=args.rounds, repeats=args.repeats, once_per_round=slow, no_warmup=slow)
    w2_plan = Plan(calls=paths.open_paths(w2_entries, bench), rounds=args.w2_rounds, no_warmup=slow)
    total = (w1_plan.total() * len(args.sizes) if w1_plan.calls else 0) + (w2_plan.total() if w2_plan.calls else 0)
    with tqdm(total=total, disable=args.no_progress, unit="call", file=sys.stderr, dynamic_ncols=True) as bar:
        w1 = []
        for size in args.sizes if w1_plan.calls else []:
            x = np.random.default_rng(0).standard_normal((1, 1, size, size, size)).astype(np.float32)
            w1.append((size, interleaved(w1_plan, x, bar, f"W1 {size}^3")))
        w2 = interleaved(w2_plan, paths.mni_image(), bar, "W2") if w2_plan.calls else {}
    return w1, w2


def summary(w1: list[tuple[int, Times]], w2: Times, args: argparse.Namespace) -> str:
    """The tables, the plots' paths and what the run was (load average: the machine may be shared)."""
    load = os.getloadavg()[0]
    parts = [f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load:.2f} at the end\n"]
    if w1:
        parts.append(
            f"W1: median ms per request, {args.rounds} interleaved rounds of {args.repeats} calls per path "
            f"after one warm-up ({paths.APP_SDK}: one call per round, no warm-up)\n"
        )
        parts.append(report.w1_tables(w1, paths.W1_RATIOS))
        parts.append(f"plot: {report.plot_w1(w1, args.plots / 'bench_w1.png')}\n")
    if w2:
        parts.append(f"W2: the sample app's sliding window on the full MNI T1, {args.w2_rounds} interleaved rounds\n")
        parts.append(report.w2_table(w2, paths.W2_BASE))
        parts.append(f"plot: {report.plot_w2(w2, args.plots / 'bench_w2.png')}\n")
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
