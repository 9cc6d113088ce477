"""The HTTP transport: one ``tritonclient.http`` client per worker thread, created, used and closed there.

The HTTP client runs on gevent and is not thread-safe ("None of the methods are thread safe"): used
from two threads, or closed by the garbage collector on another thread, it fails with greenlet errors
or hangs. So each worker thread owns one client for its whole life and every call, control calls
included, is a job queued to the workers. The client's own ``network_timeout`` is fixed per client,
so each call runs under a ``gevent.Timeout`` of the job's own deadline; after a timeout the
connection may be half-read, and the worker replaces its client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import gevent
import numpy as np
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.utils import InferenceServerException

from .translate import CallError, Status, from_http_status, from_os_error
from .transport import Callback, Cancel, Transport, WireInput, WireOutput, WireResult, Workers, deliver

logger = logging.getLogger(__name__)

T = TypeVar("T")
Client = Any  # tritonclient.http.InferenceServerClient (untyped)
#: The client's own socket timeouts; every call runs under a shorter ``gevent.Timeout`` of its deadline.
_SOCKET_TIMEOUT_S = 3600.0
#: Extra wait for a control call's job to be picked up by a worker busy with an inference.
_QUEUE_GRACE_S = 1.0


class _Deadline(Exception):
    """Raised inside a worker by ``gevent.Timeout`` when a call's deadline passes."""


def _translate(exc: BaseException) -> CallError:
    if isinstance(exc, CallError):
        return exc
    if isinstance(exc, _Deadline):
        return CallError(Status.DEADLINE, "no answer before the deadline")
    if isinstance(exc, InferenceServerException):
        return from_http_status(exc.status(), exc.message() or str(exc))
    if isinstance(exc, OSError):
        return from_os_error(exc)
    return CallError(Status.INTERNAL, f"{type(exc).__name__}: {exc}")


class _Job:
    """One call for a worker: ``fn(client)`` under the deadline, its outcome to ``done(result, error)``."""

    def __init__(
        self, fn: Callable[[Client], Any], deadline: float, done: Callable[[Any, CallError | None], None]
    ) -> None:
        self.fn = fn
        self.deadline = deadline
        self.done = done

    def run(self, client: Client) -> bool:
        """Run; returns whether the client must be replaced (a call cut short may leave the socket mid-message)."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            deliver(self.done, None, CallError(Status.DEADLINE, "the deadline passed before the call could start"))
            return False
        broken = False
        try:
            with gevent.Timeout(remaining, _Deadline):
                result = self.fn(client)
        except Exception as exc:  # every failure reaches the caller as a CallError, never this thread
            broken = isinstance(exc, _Deadline | OSError)
            deliver(self.done, None, _translate(exc))
        else:
            deliver(self.done, result, None)
        return broken


class HttpTransport(Transport):
    protocol = "http"

    def __init__(self, address: str, *, url: str, workers: int, ssl: bool = False) -> None:
        self.url = url
        self._address = address
        self._ssl = ssl
        self._local = threading.local()  # a worker's own client, for calls made from its callbacks
        self._workers: Workers[_Job] = Workers("triton-http", workers, self._work)

    def _client(self) -> Client:
        return httpclient.InferenceServerClient(
            self._address,
            ssl=self._ssl,
            connection_timeout=_SOCKET_TIMEOUT_S,
            network_timeout=_SOCKET_TIMEOUT_S,
        )

    def _work(self, workers: Workers[_Job]) -> None:
        client = self._local.client = self._client()
        try:
            for job in workers.jobs():
                if job.run(client):
                    client.close()
                    client = self._local.client = self._client()
        finally:
            client.close()

    def _submit(
        self, fn: Callable[[Client], Any], timeout_s: float, done: Callable[[Any, CallError | None], None]
    ) -> None:
        self._workers.put(_Job(fn, time.monotonic() + timeout_s, done))

    def _call(self, fn: Callable[[Client], T], timeout_s: float) -> T:
        future: Future[T] = Future()

        def done(result: Any, error: CallError | None) -> None:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        own = getattr(self._local, "client", None)
        if own is not None:  # called from a worker's callback: queuing would wait for this very thread
            _Job(fn, time.monotonic() + timeout_s, done).run(own)
            return future.result()
        self._submit(fn, timeout_s, done)
        try:
            return future.result(timeout=timeout_s + _QUEUE_GRACE_S)
        except TimeoutError:
            raise CallError(Status.DEADLINE, f"no worker answered within {timeout_s:.3g} s") from None

    # -- control calls ----------------------------------------------------------------------------
    def is_model_ready(self, model: str, version: str, *, timeout_s: float) -> bool:
        return bool(self._call(lambda c: c.is_model_ready(model, version), timeout_s))

    def model_metadata(self, model: str, version: str, *, timeout_s: float) -> dict[str, Any]:
        return dict(self._call(lambda c: c.get_model_metadata(model, version), timeout_s))

    def model_config(self, model: str, version: str, *, timeout_s: float) -> pb.ModelConfig:
        raw = self._call(lambda c: c.get_model_config(model, version), timeout_s)
        return json_format.ParseDict(raw, pb.ModelConfig(), ignore_unknown_fields=True)

    def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        return [dict(m) for m in self._call(lambda c: c.get_model_repository_index(), timeout_s)]

    def statistics(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        return dict(self._call(lambda c: c.get_inference_statistics(model), timeout_s))

    def register_system_shm(self, name: str, key: str, byte_size: int, *, timeout_s: float) -> None:
        self._call(lambda c: c.register_system_shared_memory(name, key, byte_size, offset=0), timeout_s)

    def unregister_system_shm(self, name: str, *, timeout_s: float) -> None:
        if not name:  # an empty name unregisters every client's regions
            raise ValueError("refusing to unregister all shared memory regions")
        self._call(lambda c: c.unregister_system_shared_memory(name), timeout_s)

    def system_shm_names(self, *, timeout_s: float) -> list[str]:
        regions = self._call(lambda c: c.get_system_shared_memory_status(), timeout_s)
        return sorted(str(r["name"]) for r in regions)

    # -- inference --------------------------------------------------------------------------------
    def infer_async(
        self,
        model: str,
        version: str,
        inputs: Sequence[WireInput],
        outputs: Sequence[WireOutput],
        *,
        timeout_s: float,
        callback: Callback,
    ) -> Cancel:
        def call(client: Client) -> WireResult:
            result = client.infer(
                model,
                [_infer_input(i) for i in inputs],
                model_version=version,
                outputs=[_requested_output(o) for o in outputs],
            )
            return _HttpResult(result)

        self._submit(call, timeout_s, callback)
        return _NoCancel()

    def close(self) -> None:
        """Stop the workers after the jobs queued so far; each closes its own client."""
        self._workers.stop(join_timeout_s=_QUEUE_GRACE_S * 5)


class _NoCancel(Cancel):
    """An HTTP call cannot be withdrawn; its worker stops waiting at the job's deadline."""

    def cancel(self) -> None:
        pass


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
        return np.asarray(array)


def _infer_input(spec: WireInput) -> httpclient.InferInput:
    tensor = httpclient.InferInput(spec.name, list(spec.shape), spec.datatype)
    if spec.shm is not None:
        tensor.set_shared_memory(spec.shm.region, spec.shm.byte_size, spec.shm.offset)
    elif spec.data is not None:
        tensor.set_data_from_numpy(spec.data, binary_data=True)
    return tensor


def _requested_output(spec: WireOutput) -> httpclient.InferRequestedOutput:
    output = httpclient.InferRequestedOutput(spec.name, binary_data=spec.shm is None)
    if spec.shm is not None:
        output.set_shared_memory(spec.shm.region, spec.shm.byte_size, spec.shm.offset)
    return output
