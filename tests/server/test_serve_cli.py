"""``monai-triton serve``: the real server in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from monai_triton_ops.server import TritonInstall

from .conftest import MISSING_LIBPYTHON, assert_server_gone, kill_group, write_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

STARTUP_S = 120.0


class Serve:
    """``python -m monai_triton_ops.cli serve ...`` with its stdout read line by line on a thread."""

    def __init__(self, args: list[str], tmp: Path) -> None:
        self.tmp = tmp
        self.process = subprocess.Popen(
            [sys.executable, "-m", "monai_triton_ops.cli", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
        self.stdout: queue.Queue[str | None] = queue.Queue()
        self.stderr: queue.Queue[str | None] = queue.Queue()
        for stream, lines in ((self.process.stdout, self.stdout), (self.process.stderr, self.stderr)):
            threading.Thread(target=self._read, args=(stream, lines), daemon=True).start()
        self.server_pid: int | None = None

    @staticmethod
    def _read(stream: IO[str] | None, lines: queue.Queue[str | None]) -> None:
        assert stream is not None
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def wait_for(self, pattern: str, *, stderr: bool = False, timeout_s: float = STARTUP_S) -> re.Match[str]:
        """The first line of stdout (or stderr) matching ``pattern``; a ``pid N`` in any line is remembered."""
        lines = self.stderr if stderr else self.stdout
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"serve exited with {self.process.wait()} before printing {pattern!r}")
            if pid := re.search(r"\(pid (\d+)\)", line):
                self.server_pid = int(pid.group(1))
            if match := re.search(pattern, line):
                return match
        pytest.fail(f"serve printed no {pattern!r} line within {timeout_s} s")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.server_pid is not None:
            kill_group(self.server_pid)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def serve(triton_install: TritonInstall, tmp_path: Path) -> Iterator[type[Serve]]:
    started: list[Serve] = []
    tmp = tmp_path / "tmp"
    tmp.mkdir()

    class Tracked(Serve):
        def __init__(self, args: list[str]) -> None:
            super().__init__(args, tmp)
            started.append(self)

    yield Tracked  # type: ignore[misc]
    for run in started:
        run.close()
    assert not list(tmp.iterdir()), f"temporary folders left: {list(tmp.iterdir())}"


def http_ready(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url + "/v2/health/ready", timeout=10) as response:
        return int(response.status)


@pytest.mark.parametrize(
    ("stop_signal", "repo_fixture"),
    [(signal.SIGINT, "demo_repo"), (signal.SIGTERM, "empty_repo")],
    ids=["SIGINT", "SIGTERM"],
)
def test_serve_until_signal(
    serve: type[Serve], request: pytest.FixtureRequest, stop_signal: signal.Signals, repo_fixture: str
) -> None:
    repo = request.getfixturevalue(repo_fixture)
    run = serve([str(repo)])
    if repo_fixture == "empty_repo":
        run.wait_for(r"^warning: model repository '.*' holds no models; serving nothing$", stderr=True)
    run.wait_for(r"^serving .* \(pid \d+\); Ctrl-C to stop$")
    http_url = run.wait_for(r"^HTTP +(http://127\.0\.0\.1:\d+)$").group(1)
    run.wait_for(r"^gRPC +grpc://127\.0\.0\.1:\d+$")
    if repo_fixture == "demo_repo":  # what it serves, listed once it is ready
        run.wait_for(r"^model +add_one version 1 READY$")
        run.wait_for(r"^model +identity version 1 READY$")
    assert run.server_pid is not None
    assert http_ready(http_url) == 200
    run.process.send_signal(stop_signal)
    assert run.process.wait(timeout=60) == 0
    assert_server_gone(run.server_pid)
    assert not list(repo.rglob("__pycache__")), "serving wrote into the user's repository"


def test_ctrl_c_while_starting(serve: type[Serve], tmp_path: Path) -> None:
    """Interrupted before ready: the start is abandoned, the server stopped, exit status 130."""
    repo = write_model(tmp_path / "repo", "slow_to_load", initialize="import time\ntime.sleep(120)")
    run = serve([str(repo)])
    run.wait_for(r"tritonserver launched \(pid \d+\)", stderr=True)
    run.process.send_signal(signal.SIGINT)
    assert run.process.wait(timeout=60) == 130
    assert run.server_pid is not None
    assert_server_gone(run.server_pid)


def test_serve_port_in_use(serve: type[Serve], demo_repo: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        run = serve([str(demo_repo), "--grpc-port", str(port)])
        run.wait_for(f"^error: grpc_port {port} on 127.0.0.1 is already in use", stderr=True, timeout_s=60)
        assert run.process.wait(timeout=60) == 2


def test_serve_a_repository_whose_stub_cannot_start_exits_3_with_one_line(
    serve: type[Serve], broken_stub_home: Path, tmp_path: Path
) -> None:
    """No libpython for the stub: one error line naming the library and the fix, exit 3, long before the deadline."""
    repo = write_model(tmp_path / "repo", "add_one", expression="x + 1")
    run = serve([str(repo), "--server-path", str(broken_stub_home), "--startup-timeout", "30"])
    line = run.wait_for(r"^error: ", stderr=True, timeout_s=60).string
    assert line.startswith("error: models ['add_one'] cannot load: the Python backend stub cannot start: ")
    assert f"error while loading shared libraries: {MISSING_LIBPYTHON.decode()}: cannot open" in line
    assert "; install the Python" in line
    assert run.process.wait(timeout=60) == 3
