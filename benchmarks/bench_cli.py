"""Time how long ``monai-triton`` takes to answer ``--help`` and ``--version``, per source tree, side by side.

Each command is a fresh process (what a user waits for), run round by round across the trees given
with ``--tree`` (``PYTHONPATH`` first), so a busy machine slows every tree alike. Prints the median
and the ratio to a bare ``python -c pass`` started the same way.

    .venv/bin/python benchmarks/bench_cli.py [--repeats 10] [--tree /path/to/old/checkout --tree .]

A tree is any folder holding ``monai_triton_ops/``, e.g. an older commit exported with
``git archive COMMIT monai_triton_ops | tar -x -C /tmp/before``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS: dict[str, list[str]] = {
    "python -c pass (floor)": ["-c", "pass"],
    "monai-triton --help": ["-m", "monai_triton_ops.cli", "--help"],
    "monai-triton --version": ["-m", "monai_triton_ops.cli", "--version"],
    "import monai_triton_ops": ["-c", "import monai_triton_ops"],
}


def once(tree: Path, args: list[str]) -> float:
    """Wall seconds of one run; an older tree without an option still pays its imports before it refuses."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, cwd=tree, capture_output=True, check=False, timeout=300)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="rounds (default: %(default)s)")
    parser.add_argument("--tree", type=Path, action="append", help="source tree to time (default: this checkout)")
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    times: dict[tuple[Path, str], list[float]] = {(t, c): [] for t in trees for c in COMMANDS}
    for tree in trees:  # warm the file cache, out of the figures
        for command in COMMANDS.values():
            once(tree, command)
    for _ in range(args.repeats):
        for tree in trees:
            for name, command in COMMANDS.items():
                times[(tree, name)].append(once(tree, command))
    print(f"{'tree':<28}{'command':<26}{'median ms':>10}{'x floor':>9}")
    for tree in trees:
        floor = statistics.median(times[(tree, "python -c pass (floor)")])
        for name in COMMANDS:
            median = statistics.median(times[(tree, name)])
            print(f"{str(tree)[-27:]:<28}{name:<26}{median * 1000:>10.0f}{median / floor:>9.1f}")


if __name__ == "__main__":
    main()
