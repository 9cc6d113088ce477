"""This process's CPU per ``infer()`` of the in-process ``triton`` backend, over many calls of one identity model.

``bench_remote.py``'s CPU table takes 20 calls a round beside other paths; on a busy machine that is too few to
tell two versions of the request path apart. This runs one path only, for ``--calls`` calls after a warm-up,
and prints the CPU time (every thread: the backend's Python and Triton's own core) per call. Run it from two
checkouts, alternating, to compare them:

    .venv/bin/python benchmarks/bench_inprocess_cpu.py [--calls 4000] [--size 64]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench_remote.py: no spinning OpenMP threads

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monai_triton_ops import create_backend  # noqa: E402
from tests import triton_models  # noqa: E402

WARM_UP = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--size", type=int, default=64, help="the input is 1x1xN^3 float32")
    args = parser.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="bench-inprocess-")) / "repo"
    triton_models.identity(repo, "identity")
    x = np.random.default_rng(0).standard_normal((1, 1, args.size, args.size, args.size)).astype(np.float32)
    with create_backend("triton", "identity", model_repository=repo, timeout_s=600) as backend:
        name = backend.signature.inputs[0].name
        for _ in range(WARM_UP):
            backend.infer({name: x})
        started = time.process_time()
        for _ in range(args.calls):
            backend.infer({name: x})
        cpu_us = (time.process_time() - started) * 1e6 / args.calls
    print(f"{ROOT.name}: {cpu_us:.0f} us of CPU per call ({args.calls} calls, 1x1x{args.size}^3, load average "
          f"{os.getloadavg()[0]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
