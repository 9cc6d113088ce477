"""The gRPC transport: one ``tritonclient.grpc`` client (thread-safe), shared by worker threads that each run one
blocking inference at a time, so ``max_in_flight`` requests are out at once.

Why blocking calls on workers and not the client's async API: the async API completes each call on
gRPC's own polling thread, one more thread hand-off per request, which measured 0.5-0.7 ms per
request here (1x1x64^3 identity: auto shared memory 1.45x hand-written tritonclient code with the
async API, 1.1x with workers). A blocking call cannot be withdrawn once sent (a request not yet
started is dropped at once); it ends at its deadline, and closing the transport closes the channel,
which ends every call still out. Withdrawing calls early bought nothing anyway: Triton 2.51 does not
stop a model that is running, and its gRPC cancellation path is the one with known crashes.

Every call carries ``client_timeout`` (gRPC's own deadline). The client's default channel arguments
are kept: they raise gRPC's 4 MB message limits to 2 GB, and passing ``channel_args`` would replace
them; keepalive goes through ``KeepAliveOptions`` instead, which leaves the limits alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, triton_to_np_dtype

from .translate import CallError, Status, from_grpc_status
from .transport import Callback, Cancel, Transport, WireInput, WireOutput, WireResult, Workers, deliver

logger = logging.getLogger(__name__)

#: Planned request bodies above this are refused before serialisation: protobuf caps a message at 2 GB,
#: and above ~1.3 GB a second large request has aborted clients (libprotobuf FATAL).
MAX_MESSAGE_BYTES = 1 << 30


def _error(exc: InferenceServerException) -> CallError:
    return from_grpc_status(exc.status(), exc.message() or str(exc))


class GrpcTransport(Transport):
    protocol = "grpc"

    def __init__(
        self,
        address: str,
        *,
        url: str,
        ssl: bool = False,
        root_certificates: str | None = None,
        compression: str | None = None,
        keepalive_s: float | None = None,
        workers: int = 2,
    ) -> None:
        self.url = url
        self._compression = compression
        keepalive = None
        if keepalive_s is not None:
            keepalive = grpcclient.KeepAliveOptions(
                keepalive_time_ms=int(keepalive_s * 1000), keepalive_permit_without_calls=True
            )
        self._client = grpcclient.InferenceServerClient(
            url=address, ssl=ssl, root_certificates=root_certificates, keepalive_options=keepalive
        )
        self._workers: Workers[_Infer] = Workers("triton-grpc", workers, self._work)

    @staticmethod
    def _work(workers: Workers[_Infer]) -> None:
        for job in workers.jobs():
            job.run(closed=workers.closed)

    # -- control calls ----------------------------------------------------------------------------
    def is_model_ready(self, model: str, version: str, *, timeout_s: float) -> bool:
        try:
            return bool(self._client.is_model_ready(model, version, client_timeout=timeout_s))
        except InferenceServerException as exc:
            raise _error(exc) from exc

    def model_metadata(self, model: str, version: str, *, timeout_s: float) -> dict[str, Any]:
        try:
            meta = self._client.get_model_metadata(model, version, as_json=True, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from exc
        return dict(meta)

    def model_config(self, model: str, version: str, *, timeout_s: float) -> pb.ModelConfig:
        try:
            response = self._client.get_model_config(model, version, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from exc
        config = pb.ModelConfig()
        config.CopyFrom(response.config)
        return config

    def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        try:
            index = self._client.get_model_repository_index(as_json=True, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from exc
        return [dict(m) for m in index.get("models", [])]

    def statistics(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        try:
            response = self._client.get_inference_statistics(model, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from exc
        stats: dict[str, Any] = json_format.MessageToDict(response, preserving_proto_field_name=True)
        return stats

    def register_system_shm(self, name: str, key: str, byte_size: int, *, timeout_s: float) -> None:
        try:
            self._client.register_system_shared_memory(name, key, byte_size, offset=0, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from exc

    def unregister_system_shm(self, name: str, *, timeout_s: float) -> None:
        if not name:  # an empty name unregisters every client's regions
            raise ValueError("refusing to unregister all shared memory regions")
        try:
            self._client.unregister_system_shared_memory(name, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from exc

    def system_shm_names(self, *, timeout_s: float) -> list[str]:
        try:
            status = self._client.get_system_shared_memory_status(as_json=True, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise _error(exc) from exc
        return sorted(status.get("regions", {}))

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
        body = sum(int(i.data.nbytes) for i in inputs if i.data is not None)
        if body > MAX_MESSAGE_BYTES:
            raise CallError(
                Status.TOO_LARGE,
                f"the request body would hold {body} bytes, over the {MAX_MESSAGE_BYTES} bytes this client sends "
                "over gRPC",
            )
        tensors = [_infer_input(i) for i in inputs]
        requested = [_requested_output(o) for o in outputs]

        def call(client_timeout: float) -> Any:
            return self._client.infer(
                model,
                tensors,
                model_version=version,
                outputs=requested,
                client_timeout=client_timeout,
                compression_algorithm=self._compression,
            )

        job = _Infer(call, time.monotonic() + timeout_s, callback)
        self._workers.put(job)
        return job

    def close(self) -> None:
        """Close the channel (calls still out end at once, ``CANCELLED``), then stop the workers."""
        self._workers.stop(join_timeout_s=_JOIN_TIMEOUT_S, first=self._client.close)


#: How long ``close()`` waits for a worker to notice its call ended.
_JOIN_TIMEOUT_S = 5.0


class _Infer(Cancel):
    """One inference for a worker: sent with what is left of its deadline; its outcome to ``callback`` once."""

    def __init__(self, call: Callable[[float], Any], deadline: float, callback: Callback) -> None:
        self._call = call
        self._deadline = deadline
        self._callback = callback
        self._cancelled = False

    def cancel(self) -> None:
        """A request not sent yet is never sent; one already out ends at its deadline (see the module docstring)."""
        self._cancelled = True

    def run(self, *, closed: bool) -> None:
        remaining = self._deadline - time.monotonic()
        result: WireResult | None = None
        error: CallError | None = None
        if self._cancelled or closed:
            error = CallError(Status.CANCELLED, "cancelled before it was sent" if self._cancelled else "closed")
        elif remaining <= 0:
            error = CallError(Status.DEADLINE, "the deadline passed before the request could be sent")
        else:
            try:
                result = _GrpcResult(self._call(remaining).get_response())
            except InferenceServerException as exc:
                error = _error(exc)
            except Exception as exc:  # every failure reaches the caller as a CallError, never this thread
                error = CallError(Status.INTERNAL, f"{type(exc).__name__}: {exc}")
        deliver(self._callback, result, error)


class _GrpcResult(WireResult):
    def __init__(self, response: Any) -> None:
        self._response = response
        self._index = {output.name: i for i, output in enumerate(response.outputs)}

    def _output(self, name: str) -> Any:
        if name not in self._index:
            raise CallError(Status.INTERNAL, f"the response has no output {name!r}; it has {sorted(self._index)}")
        return self._response.outputs[self._index[name]]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._output(name).shape)

    def datatype(self, name: str) -> str:
        return str(self._output(name).datatype)

    def array(self, name: str) -> np.ndarray:
        output = self._output(name)
        index = self._index[name]
        raw = self._response.raw_output_contents
        data = raw[index] if index < len(raw) else b""
        if output.datatype == "BYTES":
            values = deserialize_bytes_tensor(data) if data else np.empty(0, dtype=np.object_)
            return np.asarray(values).reshape(self.shape(name))
        return np.frombuffer(data, dtype=triton_to_np_dtype(output.datatype)).reshape(self.shape(name))


def _infer_input(spec: WireInput) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(spec.name, list(spec.shape), spec.datatype)
    if spec.shm is not None:
        tensor.set_shared_memory(spec.shm.region, spec.shm.byte_size, spec.shm.offset)
    elif spec.data is not None:
        tensor.set_data_from_numpy(spec.data)
    return tensor


def _requested_output(spec: WireOutput) -> grpcclient.InferRequestedOutput:
    output = grpcclient.InferRequestedOutput(spec.name)
    if spec.shm is not None:
        output.set_shared_memory(spec.shm.region, spec.shm.byte_size, spec.shm.offset)
    return output
