"""Servers a fleet test can kill and bring back on the same ports: real ``tritonserver`` processes, nothing mocked.

:class:`Replica` wraps the local launcher: ``kill()`` SIGKILLs the server's whole process group (the
server and its Python-backend stubs, as a pod or a node dies), ``restart()`` starts a new server on the
same ports and repository, as a restarted pod behind the same address. :class:`HandServer` is
``tritonserver`` started from its own command line (no launcher), on any loopback address, for the
tests where the client must not know or choose when its server dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from monai_triton_ops.server import LocalTritonServer, find_tritonserver
from monai_triton_ops.server.environment import (
    assemble_backend_dir,
    remove_shm_regions,
    server_environment,
    shm_prefix,
)

from ...bindings.harness import stub_pids, wait_until
from ...server.conftest import stop_and_check


class Replica:
    """One server of a test fleet, restartable on the same ports."""

    def __init__(self, repo: Path, folder: Path, **options: object) -> None:
        self.repo, self.folder, self.options = repo, folder, options
        self.server = self._start(LocalTritonServer(repo, startup_timeout_s=180.0, **options))  # type: ignore[arg-type]
        self.ports = (self.server.http_port, self.server.grpc_port, self.server.metrics_port)

    def _start(self, server: LocalTritonServer) -> LocalTritonServer:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tempfile, "tempdir", str(self.folder))
            server.start()
        return server

    def url(self, scheme: str) -> str:
        return self.server.grpc_url if scheme == "grpc" else self.server.http_url

    @property
    def running(self) -> bool:
        return self.server.is_alive()

    def kill(self) -> None:
        """SIGKILL the server and its stubs, then clean up after it (its folder, its stubs' shared memory)."""
        pid = self.server.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        stop_and_check(self.server)

    def restart(self) -> None:
        """A new server on the same ports (a restarted pod behind the same address)."""
        if self.running:
            return
        http, grpc, metrics = self.ports
        server = LocalTritonServer(
            self.repo, http_port=http, grpc_port=grpc, metrics_port=metrics, startup_timeout_s=180.0, **self.options
        )  # type: ignore[arg-type]
        self.server = self._start(server)

    def stop(self) -> None:
        stop_and_check(self.server)

    def kill_stub(self, model: str) -> None:
        """SIGKILL the Python-backend stub of ``model`` (as the OOM killer would): the server keeps it READY."""
        pid = self.server.pid
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                command = (proc / "cmdline").read_bytes().split(b"\0")
                group = os.getpgid(int(proc.name))
            except OSError:
                continue
            if group == pid and b"stub" in command[0] and any(f"/{model}/".encode() in part for part in command):
                os.kill(int(proc.name), signal.SIGKILL)
                return
        raise AssertionError(f"no stub of model {model!r} in the process group of server {pid}")

    def _stats(self, model: str) -> list[dict[str, Any]]:
        client = grpcclient.InferenceServerClient(self.server.grpc_address)
        try:
            stats = client.get_inference_statistics(model, as_json=True, client_timeout=10)
        finally:
            client.close()
        return list(stats.get("model_stats", []))

    def inferences(self, model: str) -> int:
        """The model's successful inferences on this server, asked directly (not through the backend under test)."""
        return sum(int(entry.get("inference_count", 0)) for entry in self._stats(model))

    def requests(self, model: str) -> int:
        """Requests of the model this server handled, answered or failed."""
        total = 0
        for entry in self._stats(model):
            stats = entry.get("inference_stats", {})
            total += int(stats.get("success", {}).get("count", 0)) + int(stats.get("fail", {}).get("count", 0))
        return total


class HandServer:
    """``tritonserver`` from its own command line on ``address`` (any loopback address), killed with SIGKILL."""

    def __init__(self, repo: Path, address: str, ports: tuple[int, int, int], folder: Path) -> None:
        install = find_tritonserver()
        folder.mkdir(parents=True, exist_ok=True)
        backends = assemble_backend_dir(install, Path(tempfile.mkdtemp(dir=folder)))
        http, grpc, metrics = ports
        self.address, self.http, self.grpc = address, http, grpc
        self.shm_prefix = shm_prefix()
        self.argv = [
            str(install.server_path),
            f"--model-repository={repo}",
            f"--backend-directory={backends}",
            f"--http-address={address}",
            f"--http-port={http}",
            f"--grpc-address={address}",
            f"--grpc-port={grpc}",
            f"--metrics-address={address}",
            f"--metrics-port={metrics}",
            "--strict-readiness=true",
            "--exit-timeout-secs=5",
            # its stubs' regions get a name of their own: a SIGKILLed server cannot unlink them, kill() does
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        self.env = server_environment(install)
        self.log = folder / f"tritonserver-{address}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout_s: float = 120.0) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver on {self.address} exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                url = f"http://{self.address}:{self.http}/v2/health/ready"
                if urllib.request.urlopen(url, timeout=1).status == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"tritonserver on {self.address} not ready within {timeout_s} s")

    def kill(self) -> None:
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        self.process = None
        wait_until(lambda: not stub_pids(self.shm_prefix), timeout_s=10)  # a SIGKILLed server's stubs notice
        remove_shm_regions(self.shm_prefix)
