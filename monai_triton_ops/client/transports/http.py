"""The HTTP transport: one connection pool per server in the process, a pair of HTTP clients per pool thread, made,
used and closed on that thread.

The clients run on gevent and are not thread-safe ("None of the methods are thread safe"): used from two
threads, or closed on another thread, they fail with greenlet errors, hang, or leak their sockets and the
thread's gevent hub. So every call runs on a thread of the server's pool (``workers.py``) with that thread's
own clients, handed there from whichever thread makes it (a backend's worker, a caller's ``infer()``, open,
close, statistics) and waited for; a thread that ``hosts_clients`` (a prober, the janitor) runs it itself, with
clients of its own. The pool is the process's for that server, address, TLS material and headers
(``client/shared.py``): every model there shares it, each transport is one user's view (its calls, to end at its
close), and the last user's close stops it. It starts a thread only when a call would wait (``Workers(lazy=True)``),
up to the sum of its users' ``max_in_flight``: as many connections as calls were ever out at once. A pool thread
ending closes its clients and destroys its hub. A client's socket
timeouts are fixed per client, so each call runs under a ``gevent.Timeout`` of its own deadline; after a
timeout or a socket error the connection may be half-read, and the worker replaces its clients.

Closing cannot wait for inference calls still out (a request's deadline is 2 minutes by default), and no other
thread may touch a worker's client; so ``end_calls()`` ends them the way their ``gevent.Timeout`` would: each
worker's gevent loop is asked (``loop.run_callback_threadsafe``, the one call gevent allows from another thread)
to raise into the call it runs, which then fails ``CANCELLED`` at once and the worker replaces its clients.

Inference goes through geventhttpclient's ``HTTPClient`` (what tritonclient's HTTP client uses underneath), its
request body written and its response read by ``http_wire.py``: a tensor is copied once into the body where
tritonclient copies it twice, and a response is read in ``RECV_BLOCK_BYTES`` blocks (geventhttpclient reads
4 KB at a time by default: 2,000 reads and parser calls for an 8 MB output, the larger part of the client's CPU
for such a request; tritonclient leaves it at that). Control calls go through tritonclient's HTTP client.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import gevent
import tritonclient.http as httpclient
from geventhttpclient import URL, HTTPClient
from geventhttpclient.response import HTTPConnectionClosed
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.utils import InferenceServerException

from ..credentials import redact, scrub
from ..endpoints import Endpoint
from ..shared import Shared
from ..status import CallError, Status, from_http_status, from_os_error
from ..tls import http_context_factory
from ..workers import JOIN_TIMEOUT_S, Made, Workers
from .base import (
    Heads,
    Transport,
    TransportSettings,
    WireInput,
    WireOutput,
    WireResult,
    refuse_unregister_all,
)
from .http_wire import HEADER_LENGTH, JSON_TYPE, HttpResult, decoded, infer_path, request_body

logger = logging.getLogger(__name__)

T = TypeVar("T")
Client = Any  # tritonclient.http.InferenceServerClient (untyped)
#: The clients' own socket timeouts; every call runs under a shorter ``gevent.Timeout`` of its deadline.
_SOCKET_TIMEOUT_S = 3600.0
#: How much of a response one socket read asks for (geventhttpclient's default is 4 KB).
RECV_BLOCK_BYTES = 256 << 10
#: Whether this thread made an HTTP client, and so has a gevent hub to destroy as it ends.
_HUB = threading.local()


class _Deadline(Exception):
    """Raised inside a worker by ``gevent.Timeout`` when a call's deadline passes."""


class _Ended(BaseException):
    """Raised inside a worker's inference call by ``end_calls()`` (the backend is closing); a ``BaseException``, as
    ``gevent.Timeout`` is, so that no library's ``except Exception`` on the way takes it for its own error."""


@dataclass(frozen=True, eq=False)
class _Call:
    """An inference call in progress on a worker: its thread's gevent hub and the greenlet waiting in it."""

    hub: Any
    greenlet: Any


def _destroy_hub() -> None:
    """A worker's gevent hub (its loop's file descriptors) goes with the worker, when it made one."""
    if getattr(_HUB, "made", False):
        _HUB.made = False
        gevent.get_hub().destroy(destroy_loop=True)


class _Clients:
    """One worker's clients of one server: geventhttpclient's for inference and the repository index, and
    tritonclient's for the other control calls. Neither connects before its first call."""

    def __init__(self, infer: HTTPClient, control: Client) -> None:
        self.infer = infer
        self.control = control

    def close(self) -> None:
        try:
            self.control.close()
        finally:
            self.infer.close()


def _heads(binary: bool) -> Heads[tuple[bytes, dict[str, str]]]:
    """Request bodies of shared memory requests (JSON only, no tensor in them), kept."""
    return Heads(
        lambda _model, _version, inputs, outputs, parameters: request_body(inputs, outputs, parameters, binary=binary)
    )


class HttpTransport(Transport):
    protocol = "http"
    #: Any thread may call: every call runs on the server's connection pool, under its deadline, and ``end_calls``
    #: ends this user's calls there; so a backend's ``infer()`` runs on its caller's thread, one hand-off, not two.
    any_thread = True

    def __init__(self, endpoint: Endpoint, settings: TransportSettings, workers: Workers) -> None:
        self.url = endpoint.url
        self.credentials = settings.credentials
        self._heads = _heads(True)  # until the server is known to take no binary tensors
        self._address = endpoint.address
        self._headers = settings.credentials.headers_for(self.protocol)
        self._ssl = endpoint.tls
        self._context_factory = http_context_factory(settings.credentials) if endpoint.tls else None
        self._plugin = settings.credentials.plugin(self.protocol)
        # The server's one connection pool, shared by every model of this process spoken to the same way; it gains
        # as many threads as the caller's pool has (``workers``: a backend's max_in_flight) while the caller holds it.
        # (The headers' values too: settings compare a secret by where it came from, and a control client keeps the
        # headers it was made with.)
        self._key = ("http", endpoint.address, endpoint.tls, settings, tuple(sorted(self._headers.items())))
        name = f"http-{endpoint.address}"
        self._workers = POOLS.acquire(
            self._key, lambda: Workers(name, workers.count, lazy=True), lambda pool: pool.grow(workers.count)
        )
        self._released = False
        self._calls: dict[int, _Call] = {}  # each worker's inference call in progress for this user, by thread
        self._calls_lock = threading.Lock()
        self._ended = False  # end_calls() was called: no inference call starts any more
        workers.at_thread_exit(_destroy_hub)

    def _new_clients(self) -> Made[_Clients]:
        scheme = "https" if self._ssl else "http"
        infer = HTTPClient.from_url(
            URL(f"{scheme}://{self._address}"),
            block_size=RECV_BLOCK_BYTES,
            connection_timeout=_SOCKET_TIMEOUT_S,
            network_timeout=_SOCKET_TIMEOUT_S,
            ssl_context_factory=self._context_factory,
        )
        try:
            control = httpclient.InferenceServerClient(
                self._address,
                ssl=self._ssl,
                ssl_context_factory=self._context_factory,
                connection_timeout=_SOCKET_TIMEOUT_S,
                network_timeout=_SOCKET_TIMEOUT_S,
            )
        except BaseException:
            infer.close()
            raise
        if self._plugin is not None:
            control.register_plugin(self._plugin)  # headers on every control call (credentials.py)
        _HUB.made = True
        clients = _Clients(infer, control)
        return clients, clients.close

    def _run(self, fn: Callable[[_Clients], T], timeout_s: float, *, inference: bool = False) -> T:
        """``fn(clients)`` with this worker's clients, under the deadline (on a worker thread); an ``inference``
        call also ends when ``end_calls()`` is called."""
        if timeout_s <= 0:
            raise CallError(Status.DEADLINE, "the deadline passed before the call could start")
        clients = self._workers.local(self._key, self._new_clients)
        with self._mapped(), self._endable() if inference else nullcontext(), gevent.Timeout(timeout_s, _Deadline):
            return fn(clients)

    @contextmanager
    def _endable(self) -> Iterator[None]:
        """The calling worker's inference call, listed for ``end_calls()`` while it runs."""
        me = threading.get_ident()
        with self._calls_lock:
            if self._ended:
                raise CallError(Status.CANCELLED, "the backend is closing")
            self._calls[me] = _Call(gevent.get_hub(), gevent.getcurrent())
        try:
            yield
        finally:
            with self._calls_lock:  # before this thread can end and destroy its hub: end_calls() may still post to it
                del self._calls[me]

    def end_calls(self) -> None:
        """Every inference call in progress fails ``CANCELLED`` at once, and no new one starts (see the module
        docstring); control calls still run. From any thread."""
        with self._calls_lock:  # held: no listed call can end, and its hub go, while it is posted to
            self._ended = True
            for me, call in self._calls.items():
                call.hub.loop.run_callback_threadsafe(self._end_call, me, call)

    def _end_call(self, me: int, call: _Call) -> None:
        """On the worker's own gevent loop: raise into its call, if that call still runs (not a later one)."""
        if self._calls.get(me) is call:
            call.greenlet.throw(_Ended)

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        """Every exception of a call on this worker's clients as a ``CallError``: the one place this transport
        translates, most specific first. ``InferenceServerException`` (tritonclient's) carries the HTTP status
        (``status.from_http_status``; an inference call maps its own); a socket error its errno class
        (``status.from_os_error``); our deadline, or a connection closed mid-response (the server killed or
        restarted), leaves the connection half-read, so the worker's clients are replaced. The foreign exception,
        secrets taken out, is the cause."""
        try:
            yield
        except CallError:
            raise
        except _Deadline as exc:
            self._workers.discard(self._key)
            raise CallError(Status.DEADLINE, "no answer before the deadline") from exc
        except _Ended as exc:
            self._workers.discard(self._key)
            raise CallError(Status.CANCELLED, "the backend closed with this call still out") from exc
        except InferenceServerException as exc:
            clean = scrub(exc)
            raise from_http_status(exc.status(), str(clean.message() or clean)) from clean
        except HTTPConnectionClosed as exc:
            self._workers.discard(self._key)
            clean = scrub(exc)
            raise CallError(
                Status.UNAVAILABLE, f"the connection closed before the whole response came: {clean}"
            ) from clean
        except OSError as exc:
            self._workers.discard(self._key)
            clean = scrub(exc)
            raise from_os_error(clean) from clean
        except Exception as exc:
            clean = scrub(exc)
            raise CallError(Status.INTERNAL, f"{type(exc).__name__}: {clean}") from clean

    def _on_worker(self, fn: Callable[[_Clients], T], timeout_s: float, *, inference: bool = False) -> T:
        return self._workers.call(lambda: self._run(fn, timeout_s, inference=inference), timeout_s=timeout_s)

    def _control(self, fn: Callable[[Client], T], timeout_s: float) -> T:
        """``fn`` with this worker's tritonclient client."""
        return self._on_worker(lambda clients: fn(clients.control), timeout_s)

    def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[WireInput],
        outputs: Sequence[WireOutput],
        *,
        timeout_s: float,
        parameters: Mapping[str, str | int | bool] | None = None,
    ) -> WireResult:
        body, described = self._heads.get(model, version, inputs, outputs, parameters)
        headers = {**self._headers, **described}
        path = infer_path(model, version)
        return self._on_worker(lambda clients: _infer(clients.infer, path, body, headers), timeout_s, inference=True)

    # -- control calls ----------------------------------------------------------------------------
    def use_binary_tensors(self, binary: bool) -> None:
        self._heads = _heads(binary)

    def is_model_ready(self, model: str, version: str, *, timeout_s: float) -> bool:
        return bool(self._control(lambda c: c.is_model_ready(model, version), timeout_s))

    def server_metadata(self, *, timeout_s: float) -> dict[str, Any]:
        return dict(self._control(lambda c: c.get_server_metadata(), timeout_s))

    def model_metadata(self, model: str, version: str, *, timeout_s: float) -> dict[str, Any]:
        return dict(self._control(lambda c: c.get_model_metadata(model, version), timeout_s))

    def model_config(self, model: str, version: str, *, timeout_s: float) -> pb.ModelConfig:
        raw = self._control(lambda c: c.get_model_config(model, version), timeout_s)
        return json_format.ParseDict(raw, pb.ModelConfig(), ignore_unknown_fields=True)

    def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        return [dict(m) for m in self._on_worker(lambda clients: self._repository_index(clients.infer), timeout_s)]

    def _repository_index(self, client: HTTPClient) -> Any:
        """``POST v2/repository/index`` with ``{}`` as its body (Triton's repository extension): tritonclient's
        ``get_model_repository_index`` sends none, which Triton takes and MLServer refuses (422, "Field
        required"), so this one control call goes through the worker's geventhttpclient client."""
        data, _ = _post(client, "/v2/repository/index", b"{}", {**self._headers, "Content-Type": JSON_TYPE})
        return json.loads(data)

    def statistics(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        return dict(self._control(lambda c: c.get_inference_statistics(model), timeout_s))

    def register_system_shm(self, name: str, key: str, byte_size: int, *, timeout_s: float) -> None:
        self._control(lambda c: c.register_system_shared_memory(name, key, byte_size, offset=0), timeout_s)

    def unregister_system_shm(self, name: str, *, timeout_s: float) -> None:
        refuse_unregister_all(name)
        self._control(lambda c: c.unregister_system_shared_memory(name), timeout_s)

    def system_shm_names(self, *, timeout_s: float) -> list[str]:
        regions = self._control(lambda c: c.get_system_shared_memory_status(), timeout_s)
        return sorted(str(r["name"]) for r in regions)

    def close(self) -> None:
        """This user's inference calls still out end at once (``end_calls``); the last user of the server's
        connection pool stops it, and each of its workers closes its own clients as it ends (``Workers.stop``).
        Idempotent."""
        self.end_calls()
        with self._calls_lock:
            released, self._released = self._released, True
        if not released:
            POOLS.release(self._key)


def _stop_pool(pool: Workers) -> None:
    pool.stop(join_timeout_s=JOIN_TIMEOUT_S)


#: Every HTTP server's connection pool in this process: the threads that own its clients (``client/shared.py``).
POOLS: Shared[Workers] = Shared("HTTP connection pool", _stop_pool)


def _post(client: HTTPClient, path: str, body: bytes, headers: Mapping[str, str]) -> tuple[Any, Any]:
    """POST ``body``; the whole response body (its content encoding undone) and the response (a 200; any other
    status is raised as a ``CallError``)."""
    response = client.post(path, body=body, headers=headers)
    data = response.read()
    if response.status_code != 200:
        raise from_http_status(response.status_code, _error_text(bytes(data)))
    return decoded(data, _header(response, "Content-Encoding")), response


def _infer(client: HTTPClient, path: str, body: bytes, headers: Mapping[str, str]) -> HttpResult:
    data, response = _post(client, path, body, headers)
    length = _header(response, HEADER_LENGTH)
    return HttpResult(data, None if length is None else int(length))


def _header(response: Any, name: str) -> str | None:
    """A response header's value (geventhttpclient gives a list for one sent twice: refused)."""
    value = response.get(name)
    if isinstance(value, list):
        raise CallError(Status.INTERNAL, f"the response carries header {name} {len(value)} times")
    return value if value is None else str(value)


def _error_text(body: bytes) -> str:
    """The ``error`` of an Open Inference Protocol error body (``{"error": "..."}``), else the body as text;
    secrets taken out (a proxy may echo what it was sent)."""
    text = body.decode("utf-8", "replace")
    try:
        error = json.loads(text).get("error") if text else None
    except (ValueError, AttributeError):
        error = None
    return redact(str(error) if error else (text or "the server sent an empty response"))
