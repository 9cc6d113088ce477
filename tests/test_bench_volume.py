"""``benchmarks/bench_volume.py`` without its minutes: the shaped link is made and removed, the tables and checks.

Timings are never asserted; what is checked is that the namespace the benchmark shapes exists only while it
runs (with ``tbf`` on its loopback), and that the table and the checks read a run's results right: the bytes
ratio, Triton's counts against the client's, the floor.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_volume import checks, table  # noqa: E402
from benchmarks.volume.link import IP, ShapedLink  # noqa: E402


def _namespaces() -> str:
    return subprocess.run([IP, "netns", "list"], capture_output=True, text=True, timeout=30, check=False).stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root")
def test_the_shaped_link_exists_only_inside_the_with_block() -> None:
    with ShapedLink() as link:
        assert link.name in _namespaces()
        assert "tbf" in link.describe()
        assert "rate 1Gbit" in link.describe()
        inside = subprocess.run(
            link.wrap([IP, "-o", "addr", "show", "lo"]), capture_output=True, text=True, timeout=30, check=True
        )
        assert "127.0.0.1/8" in inside.stdout
    assert link.name not in _namespaces()


def _run(path: str, sent: int, received: int, wall: float, requests: int, called: int, wire: int | None) -> dict:
    volume = path.startswith("volume")
    return {
        "path": path,
        "wall_s": wall,
        "sent": sent,
        "received": received,
        "requests": requests,
        "triton": {"volume": called if volume else 0, "network": 14 if volume else called},
        "link": wire,
        "labels": "same",
        "classes": [0, 1, 2],
    }


def _result(volume_wall: float, volume_called: int = 1) -> dict[str, Any]:
    window = {"sent": 95_600_000, "received": 286_700_000, "requests": 14, "called": 14}
    runs = {
        ("loopback", "window, shm"): [_run("window, shm", **window, wall=5.0, wire=None)],
        ("loopback", "volume, shm"): [_run("volume, shm", 34_700_000, 8_700_000, 6.0, 1, 1, None)],
        ("1 Gbit/s", "window, gRPC body"): [_run("window, gRPC body", **window, wall=9.0, wire=382_900_000)],
        ("1 Gbit/s", "volume, gRPC body"): [
            _run("volume, gRPC body", 34_700_000, 8_700_000, volume_wall, 1, volume_called, 43_440_000)
        ],
    }
    return {"case": "sample", "probes": {"loopback": 10_000.0, "1 Gbit/s": 950.0}, "runs": runs, "stub_peak_mb": 1100}


def test_the_table_gives_the_bytes_ratio_the_link_and_triton_counts() -> None:
    text = table(_result(volume_wall=4.5))
    assert (
        "| 1 Gbit/s | volume, gRPC body | 34.7 | 8.7 | 8.8 | 43.4 (1.001x) | 1 / 1 / 14 | 4.50 | 4.50 | 0.50 |" in text
    )
    assert "| loopback | window, shm | 95.6 | 286.7 | 1.0 | - | 14 / 14 / 14 |" in text
    assert "950 Mbit/s on 1 Gbit/s" in text
    assert "1,100 MB" in text


def test_the_checks_say_whether_the_floor_is_met_and_the_counts_agree() -> None:
    assert checks(_result(volume_wall=4.5)) == [
        "labels identical on every path and round: yes",
        "floor on 1 Gbit/s: 8.8x fewer bytes, 2.00x faster: NOT met",
        "client requests = Triton's count: yes",
    ]
    found = checks(_result(volume_wall=12.0, volume_called=2))
    assert found[1] == "floor on 1 Gbit/s: 8.8x fewer bytes, 0.75x faster: NOT met"
    assert found[2] == "client requests = Triton's count: NO ['1 Gbit/s: volume, gRPC body']"
