"""Fixtures for the remote backend: one real local tritonserver per test module, backends closed after each test.

Each module writes its own repository with the shared model kit (``tests/triton_models.py``) and
starts one server through :func:`serve`. After every test, no region of this process is left in
``/dev/shm`` and none is registered on the server.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from monai_triton_ops import create_backend
from monai_triton_ops.backends.base import BaseBackend
from monai_triton_ops.backends.remote.shm import region as shm
from monai_triton_ops.server import LocalTritonServer

from ...server.conftest import settled, stop_and_check
from ...server.conftest import triton_install as triton_install

Open = Callable[..., BaseBackend]
#: (scheme, shared_memory) pairs every transport test runs over.
MODES = [("grpc", "none"), ("grpc", "system"), ("http", "none"), ("http", "system")]
MODE_IDS = [f"{scheme}-{memory}" for scheme, memory in MODES]


def serve(repo: Path, folder: Path, **options: Any) -> Iterator[LocalTritonServer]:
    """Start a server on ``repo`` (its temp files under ``folder``) and stop and check it afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(folder))
        server = LocalTritonServer(repo, startup_timeout_s=180.0, **options)
        try:
            server.start()
            yield server
        finally:
            stop_and_check(server)


def url(server: LocalTritonServer, scheme: str) -> str:
    return server.grpc_url if scheme == "grpc" else server.http_url


def own_regions() -> list[str]:
    """Regions this process created that are still in /dev/shm."""
    return sorted(p.name for p in shm.SHM_DIR.glob(f"{shm.PREFIX}{os.getpid()}_*"))


def registered_by_us(server: LocalTritonServer, pid: int | None = None) -> list[str]:
    """Regions of process ``pid`` (default this one) that the server still has registered."""
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        regions = client.get_system_shared_memory_status(as_json=True, client_timeout=10).get("regions", {})
    finally:
        client.close()
    return sorted(n for n in regions if n.startswith(f"{shm.PREFIX}{pid or os.getpid()}_"))


def executions(backend: BaseBackend) -> int:
    """The model's execution count on the server, once it has settled (statistics lag the responses)."""

    def read() -> int:
        return int(backend.statistics()["model_stats"][0].get("execution_count", 0))  # type: ignore[attr-defined]

    return settled(read)


@pytest.fixture
def open_backend() -> Iterator[Open]:
    """``open_backend(spec, model, **options)``: an open backend, closed after the test, leaving no region."""
    opened: list[BaseBackend] = []

    def make(spec: str, model: str, **options: Any) -> BaseBackend:
        backend = create_backend(spec, model, **options)
        opened.append(backend)
        return backend.open()

    yield make
    for backend in opened:
        backend.close(timeout_s=30)
    assert not own_regions(), f"shared memory left: {own_regions()}"
