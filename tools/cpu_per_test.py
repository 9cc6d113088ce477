"""Where the test suite's CPU goes: a pytest plugin that records each test's wall time and CPU, and a summary.

On a 2-core machine the suite is CPU-bound (three workers), so its wall time follows its CPU, most of which is spent
in the processes the tests start (apps, servers, the CLI), not in the workers. The duration pytest reports is wall
time, inflated by whatever ran beside the test; this records, per test (setup, call and teardown together):

- ``wall``: seconds, as ``--durations`` counts them;
- ``self``: CPU seconds of the pytest process (or xdist worker) itself, every thread;
- ``children``: CPU seconds of the processes it started and reaped meanwhile (``RUSAGE_CHILDREN``: with their own
  reaped children). A process that outlives the test (a session's server) is counted where it is reaped.

Record (one JSON file per worker in ``DIR``), then summarise by file::

    CPU_PER_TEST_DIR=DIR PYTHONPATH=tools .venv/bin/python -m pytest -n 3 -p cpu_per_test
    .venv/bin/python tools/cpu_per_test.py DIR [--tests N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: Where the records go when ``CPU_PER_TEST_DIR`` is not set.
DEFAULT_DIR = Path("output") / "cpu-per-test"

_records: dict[str, dict[str, float]] = {}


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of one test, measured together."""
    started, own, children = time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    _records[item.nodeid] = {
        "wall": time.monotonic() - started,
        "self": _cpu(resource.RUSAGE_SELF) - own,
        "children": _cpu(resource.RUSAGE_CHILDREN) - children,
    }


def pytest_sessionfinish(session: pytest.Session) -> None:
    """One file per process: ``main.json`` without xdist, ``gw0.json``... with it (the controller records nothing)."""
    if not _records:
        return
    folder = Path(os.environ.get("CPU_PER_TEST_DIR", DEFAULT_DIR))
    folder.mkdir(parents=True, exist_ok=True)
    name = getattr(session.config, "workerinput", {}).get("workerid", "main")  # xdist gives its workers one
    (folder / f"{name}.json").write_text(json.dumps(_records, indent=0))


def load(folder: Path) -> dict[str, dict[str, float]]:
    """Every test recorded in ``folder``, from all its workers' files."""
    records: dict[str, dict[str, float]] = {}
    for path in sorted(folder.glob("*.json")):
        records.update(json.loads(path.read_text()))
    return records


def by_file(records: dict[str, dict[str, float]]) -> list[tuple[str, dict[str, Any]]]:
    """Totals per test file, most CPU first."""
    totals: dict[str, dict[str, Any]] = defaultdict(lambda: {"tests": 0, "wall": 0.0, "self": 0.0, "children": 0.0})
    for nodeid, record in records.items():
        total = totals[nodeid.split("::", 1)[0]]
        total["tests"] += 1
        for key in ("wall", "self", "children"):
            total[key] += record[key]
    return sorted(totals.items(), key=lambda item: -(item[1]["self"] + item[1]["children"]))


def report(records: dict[str, dict[str, float]], tests: int) -> str:
    """The table by file, then the ``tests`` tests with the most CPU."""
    cpu = sum(r["self"] + r["children"] for r in records.values())
    lines = [f"{len(records)} tests: {cpu:.0f} s of CPU ({sum(r['children'] for r in records.values()):.0f} s in "
             f"processes they started), {sum(r['wall'] for r in records.values()):.0f} s of wall time"]  # fmt: skip
    lines.append(f"{'cpu s':>8} {'share':>6} {'self':>7} {'children':>9} {'wall s':>8} {'tests':>6}  file")
    for name, total in by_file(records):
        spent = total["self"] + total["children"]
        lines.append(f"{spent:8.1f} {spent / cpu:6.1%} {total['self']:7.1f} {total['children']:9.1f} "
                     f"{total['wall']:8.1f} {total['tests']:6d}  {name}")  # fmt: skip
    if tests:
        lines.append(f"\nthe {tests} tests with the most CPU:")
        ranked = sorted(records.items(), key=lambda item: -(item[1]["self"] + item[1]["children"]))
        for nodeid, record in ranked[:tests]:
            lines.append(f"{record['self'] + record['children']:8.1f} {record['wall']:8.1f}  {nodeid}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=DEFAULT_DIR)
    parser.add_argument("--tests", type=int, default=20, help="list this many tests with the most CPU (default 20)")
    args = parser.parse_args(argv)
    records = load(args.folder)
    if not records:
        parser.error(f"no records in {args.folder}: run pytest with -p cpu_per_test first")
    print(report(records, args.tests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
