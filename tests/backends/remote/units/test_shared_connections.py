"""The process-wide share of an HTTP server's connection pool (``client/shared.py``): who shares, who never does,
the last release, a forked child. No server: a transport connects at its first call, and none is made here."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from monai_triton_ops.client.credentials import Credentials, Secret
from monai_triton_ops.client.endpoints import Endpoint
from monai_triton_ops.client.transports import connect
from monai_triton_ops.client.transports.base import Transport, TransportSettings
from monai_triton_ops.client.transports.http import POOLS
from monai_triton_ops.client.workers import Workers

WAIT_S = 30.0


@pytest.fixture
def caller() -> Iterator[Workers]:
    """A backend's request threads (two), as the contract makes them."""
    workers = Workers("units-caller", 2, hosts_clients=False)
    yield workers
    workers.stop(join_timeout_s=WAIT_S)


def _with_header(value: str) -> TransportSettings:
    return TransportSettings(credentials=Credentials(headers=(("x-key", Secret(value, "env:KEY")),)))


def _pool_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("http-127.0.0.1:9"))


def test_models_spoken_to_the_same_way_share_one_pool_and_the_last_close_stops_it(caller: Workers) -> None:
    endpoint = Endpoint.parse("http://127.0.0.1:9")
    first, second = (connect(endpoint, TransportSettings(), caller) for _ in range(2))
    assert len(POOLS) == 1
    (key,) = POOLS._entries
    assert POOLS.users(key) == 2
    assert POOLS._entries[key][0].count == 4
    first.close()
    first.close()  # idempotent: one release only
    assert POOLS.users(key) == 1
    second.close()
    assert len(POOLS) == 0
    assert _pool_threads() == 0


def test_other_headers_tls_or_address_never_share(caller: Workers) -> None:
    """Headers from the same reference with other values (settings compare a secret by its source), TLS or not, and
    another port: a pool each."""
    made: list[Transport] = [
        connect(Endpoint.parse("http://127.0.0.1:9"), _with_header("one"), caller),
        connect(Endpoint.parse("http://127.0.0.1:9"), _with_header("two"), caller),
        connect(Endpoint.parse("https://127.0.0.1:9"), _with_header("one"), caller),
        connect(Endpoint.parse("http://127.0.0.1:10"), _with_header("one"), caller),
        connect(Endpoint.parse("http://127.0.0.1:9"), _with_header("one"), caller),  # the first one's again
    ]
    try:
        assert _with_header("one") == _with_header("two")  # why the key holds the values too
        assert len(POOLS) == 4
    finally:
        for transport in made:
            transport.close()
    assert len(POOLS) == 0


def test_a_forked_child_holds_none_of_the_parents_pools(caller: Workers) -> None:
    transport = connect(Endpoint.parse("http://127.0.0.1:9"), TransportSettings(), caller)
    try:
        pid = os.fork()
        if pid == 0:  # the child: nothing of the parent's is held, and a close of the copy releases nothing
            code = 0 if len(POOLS) == 0 else 1
            transport.close()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert len(POOLS) == 1  # the parent's pool is still the parent's
    finally:
        transport.close()
    assert len(POOLS) == 0
