"""``benchmarks/soak.py``, short: a few open/close cycles with requests in flight at every close leave the process as
the first cycle left it, and every study comes back right (the long run's figures are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import warm_python

ROOT = Path(__file__).resolve().parents[1]


def test_open_close_cycles_with_requests_in_flight_leave_nothing_behind_on_torch(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--backends", "torch", "--studies", "3"]
    command += ["--cycle", "1", "--size", "16", "--roi", "16", "--in-flight", "2", "--json", str(out)]
    result = warm_python.run(command, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (torch,) = json.loads(out.read_text())
    assert (torch["backend"], torch["studies"], len(torch["censuses"])) == ("torch", 3, 3)
    assert (torch["lost"], torch["wrong"], torch["unfinished"], torch["leaks"]) == ([], 0, 0, [])
    assert "torch  3 studies" in result.stdout
    assert ": flat" in result.stdout
