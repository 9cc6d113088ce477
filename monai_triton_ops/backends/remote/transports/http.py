"""The HTTP transport: one ``tritonclient.http`` client per worker thread, made, used and closed on that thread.

The HTTP client runs on gevent and is not thread-safe ("None of the methods are thread safe"): used
from two threads, or closed on another thread, it fails with greenlet errors, hangs, or leaks its
sockets and the thread's gevent hub. So every call runs on a worker of the backend's pool
(``workers.py``) with that worker's own client: inference is already there, and a control call from
any other thread (open, close, statistics) is handed to a worker and waited for. A worker ending
closes its client and destroys its hub. The client's own ``network_timeout`` is fixed per client, so
each call runs under a ``gevent.Timeout`` of its own deadline; after a timeout or a socket error the
connection may be half-read, and the worker replaces its client.

Closing cannot wait for inference calls still out (a request's deadline is 2 minutes by default), and no other
thread may touch a worker's client; so ``end_calls()`` ends them the way their ``gevent.Timeout`` would: each
worker's gevent loop is asked (``loop.run_callback_threadsafe``, the one call gevent allows from another thread)
to raise into the call it runs, which then fails ``CANCELLED`` at once and the worker replaces its client.

A request body is binary (a JSON header, then the tensors' bytes, its length in ``Inference-Header-Content-Length``)
when the server takes binary tensors and some input travels in the body; otherwise it is plain JSON and says so
(``Content-Type: application/json``): a FastAPI server (KServe's, since FastAPI 0.132) reads a body without that
type as bytes, and then refuses it for want of the binary header.
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
import numpy as np
import tritonclient.http as httpclient
from geventhttpclient import URL, HTTPClient
from geventhttpclient.response import HTTPConnectionClosed
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.utils import InferenceServerException

from ...status import CallError, Status, from_http_status, from_os_error
from ...workers import Made, Workers
from ..endpoints import Endpoint
from .base import (
    RequestBuilder,
    Transport,
    TransportSettings,
    WireInput,
    WireOutput,
    WireResult,
    refuse_unregister_all,
)
from .codec import conform
from .credentials import redact, scrub
from .tls import http_context_factory

logger = logging.getLogger(__name__)

T = TypeVar("T")
Client = Any  # tritonclient.http.InferenceServerClient (untyped)
#: The client's own socket timeouts; every call runs under a shorter ``gevent.Timeout`` of its deadline.
_SOCKET_TIMEOUT_S = 3600.0
_BINARY = {"binary_data": True}
#: The type of a JSON body (sent in a new dict per request: tritonclient adds its own headers to the one it is given).
_JSON = "application/json"
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


class HttpTransport(Transport):
    protocol = "http"

    def __init__(self, endpoint: Endpoint, settings: TransportSettings, workers: Workers) -> None:
        self.url = endpoint.url
        self.credentials = settings.credentials
        self._requests = RequestBuilder(httpclient, binary=_BINARY)
        self._binary = True
        self._address = endpoint.address
        self._headers = settings.credentials.headers_for(self.protocol)
        self._ssl = endpoint.tls
        self._context_factory = http_context_factory(settings.credentials) if endpoint.tls else None
        self._plugin = settings.credentials.plugin(self.protocol)
        self._workers = workers
        self._calls: dict[int, _Call] = {}  # each worker's inference call in progress, by thread
        self._calls_lock = threading.Lock()
        self._ended = False  # end_calls() was called: no inference call starts any more
        workers.at_thread_exit(_destroy_hub)

    def _new_client(self) -> Made[Client]:
        client = httpclient.InferenceServerClient(
            self._address,
            ssl=self._ssl,
            ssl_context_factory=self._context_factory,
            connection_timeout=_SOCKET_TIMEOUT_S,
            network_timeout=_SOCKET_TIMEOUT_S,
        )
        if self._plugin is not None:
            client.register_plugin(self._plugin)  # headers on every call (credentials.py)
        _HUB.made = True
        return client, client.close

    def _run(self, fn: Callable[[Client], T], timeout_s: float, *, inference: bool = False) -> T:
        """``fn(client)`` with this worker's client, under the deadline (on a worker thread); an ``inference``
        call also ends when ``end_calls()`` is called."""
        if timeout_s <= 0:
            raise CallError(Status.DEADLINE, "the deadline passed before the call could start")
        client = self._workers.local(self, self._new_client)
        with self._mapped(), self._endable() if inference else nullcontext(), gevent.Timeout(timeout_s, _Deadline):
            return fn(client)

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
        """Every exception of a call on this worker's client as a ``CallError``: the one place this transport
        translates, most specific first. ``InferenceServerException`` carries the HTTP status
        (``status.from_http_status``); a socket error its errno class (``status.from_os_error``); our deadline,
        or a connection closed mid-response (the server killed or restarted), leaves the connection half-read,
        so the worker's client is replaced. The foreign exception, secrets taken out, is the cause."""
        try:
            yield
        except CallError:
            raise
        except _Deadline as exc:
            self._workers.discard(self)
            raise CallError(Status.DEADLINE, "no answer before the deadline") from exc
        except _Ended as exc:
            self._workers.discard(self)
            raise CallError(Status.CANCELLED, "the backend closed with this call still out") from exc
        except InferenceServerException as exc:
            clean = scrub(exc)
            raise from_http_status(exc.status(), str(clean.message() or clean)) from clean
        except HTTPConnectionClosed as exc:
            self._workers.discard(self)
            clean = scrub(exc)
            raise CallError(
                Status.UNAVAILABLE, f"the connection closed before the whole response came: {clean}"
            ) from clean
        except OSError as exc:
            self._workers.discard(self)
            clean = scrub(exc)
            raise from_os_error(clean) from clean
        except Exception as exc:
            clean = scrub(exc)
            raise CallError(Status.INTERNAL, f"{type(exc).__name__}: {clean}") from clean

    def _control(self, fn: Callable[[Client], T], timeout_s: float, *, inference: bool = False) -> T:
        return self._workers.call(lambda: self._run(fn, timeout_s, inference=inference), timeout_s=timeout_s)

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
        tensors, requested = self._requests.build(inputs, outputs)
        json_body = not (self._binary and any(spec.data is not None for spec in inputs))
        result = self._control(
            lambda c: c.infer(
                model,
                tensors,
                model_version=version,
                outputs=requested,
                parameters=parameters,
                headers={"Content-Type": _JSON} if json_body else None,
            ),
            timeout_s,
            inference=True,
        )
        return _HttpResult(result)

    # -- control calls ----------------------------------------------------------------------------
    def use_binary_tensors(self, binary: bool) -> None:
        self._requests = RequestBuilder(httpclient, binary={"binary_data": binary})
        self._binary = binary

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
        return [dict(m) for m in self._control(lambda _: self._repository_index(), timeout_s)]

    def _repository_index(self) -> Any:
        """``POST v2/repository/index`` with ``{}`` as its body (Triton's repository extension): tritonclient's
        ``get_model_repository_index`` sends none, which Triton takes and MLServer refuses (422, "Field
        required"), so this one call is made with geventhttpclient's own client, on this worker's thread."""
        scheme = "https" if self._ssl else "http"
        client = HTTPClient.from_url(
            URL(f"{scheme}://{self._address}"),
            connection_timeout=_SOCKET_TIMEOUT_S,
            network_timeout=_SOCKET_TIMEOUT_S,
            ssl_context_factory=self._context_factory,
        )
        try:
            response = client.post("/v2/repository/index", body="{}", headers={**self._headers, "Content-Type": _JSON})
            body = response.read()
        finally:
            client.close()
        if response.status_code != 200:
            raise from_http_status(response.status_code, _error_text(body))
        return json.loads(body)

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
        """Inference calls still out end at once (``end_calls``); each worker closes its own client as it ends
        (``Workers.stop``)."""
        self.end_calls()


def _error_text(body: bytes) -> str:
    """The ``error`` of an Open Inference Protocol error body (``{"error": "..."}``), else the body as text;
    secrets taken out (a proxy may echo what it was sent)."""
    text = body.decode("utf-8", "replace")
    try:
        error = json.loads(text).get("error") if text else None
    except (ValueError, AttributeError):
        error = None
    return redact(str(error) if error else (text or "the server sent an empty response"))


class _HttpResult(WireResult):
    def __init__(self, result: httpclient.InferResult) -> None:
        self._result = result

    def _output(self, name: str) -> dict[str, Any]:
        output = self._result.get_output(name)
        if output is None:
            raise CallError(Status.INTERNAL, f"the response has no output {name!r}")
        return dict(output)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._output(name)["shape"])

    def datatype(self, name: str) -> str:
        return str(self._output(name)["datatype"])

    def array(self, name: str) -> np.ndarray:
        array = self._result.as_numpy(name)
        if array is None:
            raise CallError(Status.INTERNAL, f"the response carries no data for output {name!r}")
        return conform(np.asarray(array), self.datatype(name))
