"""The remote backend's entries in the contract suite: gRPC and HTTP, each with and without shared memory.

All four share one real local tritonserver per test module (started on first use, stopped by
:func:`stop_servers` at the module's end), so joining the contract costs one server start, not four.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from monai_triton_ops import create_backend
from monai_triton_ops.backends.base import BaseBackend
from monai_triton_ops.errors import ServerNotFoundError
from monai_triton_ops.server import LocalTritonServer, find_tritonserver

from ...server.conftest import stop_and_check

Factory = Callable[..., BaseBackend]
_servers: dict[Path, tuple[LocalTritonServer, Path]] = {}


def _server(repo: Path) -> LocalTritonServer:
    if repo not in _servers:
        try:
            find_tritonserver()
        except ServerNotFoundError as exc:
            pytest.skip(f"no tritonserver: {exc}")
        folder = Path(tempfile.mkdtemp(prefix="contract-server-"))
        server = LocalTritonServer(repo, startup_timeout_s=300.0, stop_timeout_s=10.0)
        _servers[repo] = (server, folder)
        server.start()
    return _servers[repo][0]


def stop_servers() -> None:
    """Stop (and check) every server the entries started."""
    while _servers:
        _, (server, folder) = _servers.popitem()
        stop_and_check(server)
        folder.rmdir()


def _entry(scheme: str, memory: str) -> Callable[[Path], AbstractContextManager[Factory]]:
    @contextmanager
    def entry(repo: Path) -> Iterator[Factory]:
        server = _server(repo)
        base = server.grpc_url if scheme == "grpc" else server.http_url

        def make(name: str, **options: Any) -> BaseBackend:
            return create_backend(f"{base}?shared_memory={memory}", name, **options)

        yield make

    return entry


REMOTE: dict[str, Callable[[Path], AbstractContextManager[Factory]]] = {
    f"{scheme}-{memory}": _entry(scheme, memory) for scheme in ("grpc", "http") for memory in ("none", "system")
}
