"""A child process for the tests of a backend's end with requests in flight (``test_inprocess_exit.py``,
``remote/test_exit.py``): its stdout read line by line on a thread, its stderr into a file, and the length of its
exit phase (from the program's last line, which prints the monotonic clock, to the end of the process)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Child:
    """``python -c code arg``, run from the repository root; it prints ``pid <pid>`` first."""

    def __init__(self, arg: str | Path, code: str, stderr: Path) -> None:
        self._stderr = stderr
        with stderr.open("w") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, str(arg)], cwd=ROOT, stdout=subprocess.PIPE, stderr=sink, text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stdout: list[str] = []
        self.pid = int(self.expect("pid ").split()[1])

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, start: str) -> str:
        """The next line of stdout, which must start with ``start``."""
        try:
            line = self.lines.get(timeout=120)
        except queue.Empty:
            line = ""
        self.stdout.append(line)
        assert line.startswith(start), f"{line!r} instead of {start!r}: {self.stderr()[-3000:]}"
        return line

    def finish(self) -> float:
        """Wait for the end of the process; returns the monotonic time it was seen ended."""
        self.process.wait(timeout=120)
        ended = time.monotonic()
        self._reader.join(timeout=30)
        while not self.lines.empty():
            self.stdout.append(self.lines.get())
        return ended

    def stderr(self) -> str:
        return self._stderr.read_text(errors="replace")


def exit_phase(child: Child, ended: float) -> float:
    """Seconds from the child's ``last line <monotonic>`` to ``ended``."""
    last = [line for line in child.stdout if line.startswith("last line ")]
    assert last, child.stdout
    return ended - float(last[0].split()[2])
