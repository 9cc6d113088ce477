"""``benchmarks/run.py``: the one benchmark command runs, interleaves, and writes its tables and plots.

Timings are never asserted (they are the benchmark's output, not a property of the code); what is checked is
that every path is timed the same number of times in a rotated order, and that the tables and PNGs come out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.suite import report  # noqa: E402
from benchmarks.suite.timing import Plan, interleaved, median, ratio  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


class Counter:
    """A progress bar that counts (the real one is tqdm's; only its update count matters here)."""

    def __init__(self) -> None:
        self.updates = 0

    def update(self, n: int) -> None:
        self.updates += n

    def set_description_str(self, text: str) -> None:
        pass


def test_every_path_runs_once_per_round_in_a_rotated_order() -> None:
    order: list[str] = []
    calls = {label: (lambda data, label=label: order.append(label)) for label in ("a", "b", "c")}
    plan = Plan(calls=calls, rounds=3, repeats=2, once_per_round=frozenset({"c"}), no_warmup=frozenset({"c"}))
    bar = Counter()
    times = interleaved(plan, None, bar)  # type: ignore[arg-type]
    assert order[:2] == ["a", "b"]  # warm-up, "c" has none
    rounds = order[2:]
    assert rounds == ["a", "a", "b", "b", "c", "b", "b", "c", "a", "a", "c", "a", "a", "b", "b"]
    assert bar.updates == plan.total() == len(order)
    assert [len(r) for r in times["a"]] == [2, 2, 2]
    assert [len(r) for r in times["c"]] == [1, 1, 1]


def test_tables_and_plots_from_times(tmp_path: Path) -> None:
    w1 = [(8, {"x": [[1.0, 3.0], [2.0]], "y": [[2.0], [8.0]]}), (16, {"x": [[4.0]], "y": [[8.0]]})]
    assert median(w1[0][1], "x") == 2.0
    assert ratio(w1[0][1], "y", "x") == pytest.approx((1.0 + 4.0) / 2)  # per round: 2/2, 8/2
    text = report.w1_tables(w1, [("y", "x"), ("y", "absent")])
    assert "| x | 2.00 | 4.00 |" in text
    assert "| y | x | 2.50 | 2.00 |" in text
    assert "absent" not in text
    w2 = {"torch backend": [[7000.0], [9000.0]], "other": [[14000.0], [18000.0]]}
    assert "| other | 16.00 | 14.00 | 2.00 |" in report.w2_table(w2, "torch backend")
    for path in (report.plot_w1(w1, tmp_path / "w1.png"), report.plot_w2(w2, tmp_path / "w2.png")):
        assert path.read_bytes().startswith(PNG)


@pytest.mark.slow
def test_the_command_times_the_chosen_paths_and_writes_its_outputs(tmp_path: Path) -> None:
    """The in-process paths only (no server to start): the run as a user starts it, with its own arguments."""
    command = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--sizes", "8", "16", "--rounds", "2",
               "--repeats", "2", "--w2-rounds", "0", "--only", "TorchScript", "torch backend", "--plots",
               str(tmp_path), "--json", str(tmp_path / "times.json")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| path | 1x1x8^3 | 1x1x16^3 |" in result.stdout
    assert "| torch backend | TorchScript, called directly |" in result.stdout
    assert "%|" in result.stderr  # the progress bar
    assert "Current stack size" not in result.stderr
    png = (tmp_path / "bench_w1.png").read_bytes()
    assert png.startswith(PNG)
    assert 10_000 < len(png) < 300_000
    assert not (tmp_path / "bench_w2.png").exists()
    times = json.loads((tmp_path / "times.json").read_text())
    assert sorted(times["w1"]) == ["16", "8"]
    assert sorted(times["w1"]["8"]) == ["TorchScript, called directly", "torch backend"]
    assert [len(calls) for calls in times["w1"]["8"]["torch backend"]] == [2, 2]
