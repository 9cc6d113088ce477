"""The HTTP transport: one ``tritonclient.http`` client per worker thread, made, used and closed on that thread.

The HTTP client runs on gevent and is not thread-safe ("None of the methods are thread safe"): used
from two threads, or closed on another thread, it fails with greenlet errors, hangs, or leaks its
sockets and the thread's gevent hub. So every call runs on a worker of the backend's pool
(``workers.py``) with that worker's own client: inference is already there, and a control call from
any other thread (open, close, statistics) is handed to a worker and waited for. A worker ending
closes its client and destroys its hub. The client's own ``network_timeout`` is fixed per client, so
each call runs under a ``gevent.Timeout`` of its own deadline; after a timeout or a socket error the
connection may be half-read, and the worker replaces its client.

A tensor in the request body is copied once on its way out (tritonclient joins the JSON header and the
tensors into one body; :class:`_ArrayInput` hands it the caller's array, where tritonclient's own input class
copies it first with ``tobytes``), and a response is read in ``RECV_BLOCK_BYTES`` blocks (geventhttpclient
reads 4 KB at a time by default: 2,000 reads and parser calls for an 8 MB output, the larger part of the
client's CPU for such a request).

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
from contextlib import contextmanager
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
#: How much of a response one socket read asks for (geventhttpclient's default is 4 KB).
RECV_BLOCK_BYTES = 256 << 10
#: The type of a JSON body (sent in a new dict per request: tritonclient adds its own headers to the one it is given).
_JSON = "application/json"
#: Whether this thread made an HTTP client, and so has a gevent hub to destroy as it ends.
_HUB = threading.local()


class _Deadline(Exception):
    """Raised inside a worker by ``gevent.Timeout`` when a call's deadline passes."""


def _destroy_hub() -> None:
    """A worker's gevent hub (its loop's file descriptors) goes with the worker, when it made one."""
    if getattr(_HUB, "made", False):
        _HUB.made = False
        gevent.get_hub().destroy(destroy_loop=True)


class _ArrayInput(httpclient.InferInput):  # type: ignore[misc]  # tritonclient is untyped
    """An input whose binary body data is the caller's array itself (a flat byte view of it), not a copy.

    tritonclient's ``set_data_from_numpy`` copies the array (``tobytes``) and the request's body is then
    joined from that copy: two copies of every tensor. Here the join is the only one. The array is the
    exchange's (``codec.to_numpy``: C-contiguous, its dtype and shape already checked against the model's
    signature); JSON tensors and BYTES go through tritonclient's own method.
    """

    def set_data_from_numpy(self, input_tensor: np.ndarray, binary_data: bool = True) -> _ArrayInput:
        if not binary_data or self.datatype() == "BYTES" or input_tensor.dtype.kind == "O":
            super().set_data_from_numpy(input_tensor, binary_data=binary_data)
            return self
        data = np.ascontiguousarray(input_tensor).reshape(-1).view(np.uint8).data  # a memoryview, format B
        self._data = None
        self._raw_data = data
        self._parameters["binary_data_size"] = data.nbytes
        return self


class _HttpClasses:
    """The classes an HTTP request is built from (``RequestBuilder``)."""

    InferInput = _ArrayInput
    InferRequestedOutput = httpclient.InferRequestedOutput


class HttpTransport(Transport):
    protocol = "http"
    #: What requests are built from: tritonclient's HTTP classes, the input one sending the caller's array.
    request_classes = _HttpClasses

    def __init__(self, endpoint: Endpoint, settings: TransportSettings, workers: Workers) -> None:
        self.url = endpoint.url
        self.credentials = settings.credentials
        self._requests = RequestBuilder(self.request_classes, binary=_BINARY)
        self._binary = True
        self._address = endpoint.address
        self._headers = settings.credentials.headers_for(self.protocol)
        self._ssl = endpoint.tls
        self._context_factory = http_context_factory(settings.credentials) if endpoint.tls else None
        self._plugin = settings.credentials.plugin(self.protocol)
        self._workers = workers
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
        stub = getattr(client, "_client_stub", None)  # its geventhttpclient HTTPClient (tritonclient keeps it private)
        if stub is not None and hasattr(stub, "block_size"):
            stub.block_size = RECV_BLOCK_BYTES
        _HUB.made = True
        return client, client.close

    def _run(self, fn: Callable[[Client], T], timeout_s: float) -> T:
        """``fn(client)`` with this worker's client, under the deadline (on a worker thread)."""
        if timeout_s <= 0:
            raise CallError(Status.DEADLINE, "the deadline passed before the call could start")
        client = self._workers.local(self, self._new_client)
        with self._mapped(), gevent.Timeout(timeout_s, _Deadline):
            return fn(client)

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

    def _control(self, fn: Callable[[Client], T], timeout_s: float) -> T:
        return self._workers.call(lambda: self._run(fn, timeout_s), timeout_s=timeout_s)

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
        )
        return _HttpResult(result)

    # -- control calls ----------------------------------------------------------------------------
    def use_binary_tensors(self, binary: bool) -> None:
        self._requests = RequestBuilder(self.request_classes, binary={"binary_data": binary})
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
        """Nothing to do here: each worker closes its own client as it ends (``Workers.stop``)."""


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
