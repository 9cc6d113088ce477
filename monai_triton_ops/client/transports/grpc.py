"""The gRPC transport: one gRPC channel of our own (thread-safe), shared by every thread, blocking calls only.

Why blocking calls and not an async API: an async call completes on gRPC's own polling thread, one more
thread hand-off per request, which measured 0.5-0.7 ms per request here. A blocking call cannot be
withdrawn once sent; it ends at its deadline, and ``close()`` closes the channel, which ends every call
still out (``CANCELLED``). Withdrawing calls early bought nothing anyway: Triton 2.51 does not stop a model
that is running, and its gRPC cancellation path is the one with known crashes.

The channel is made with ``grpc``'s public API and every call goes through it, so that closing it ends
them all and every failure is one ``grpc.RpcError``: an inference request is written by ``grpc_wire.py``
(the message tritonclient's client would send, its tensors not passed through protobuf's serializer) and sent
with ``channel.unary_unary``; control calls go through the service's generated stub
(``tritonclient.grpc.service_pb2_grpc``) on the same channel. tritonclient's client is not used: it keeps its
channel to itself, and a second channel would be a second connection to close.

Every call carries ``timeout`` (gRPC's own deadline). Channel arguments (:func:`channel_args`)
are tritonclient's own defaults written out again, since passing ``channel_args`` replaces them and
gRPC would fall back to its 4 MB receive limit (tritonclient's ``InferenceServerClient``: "if this argument
is provided, it is expected the channel arguments are correct and complete"): the 2 GB limits and keepalive,
plus two of ours. The channel reconnects to a server that went away at most every
``max_reconnect_backoff_s`` (gRPC's default grows to 120 s, so a restarted server would be left unused
for minutes while calls fail fast); and a ``balanced`` channel (a TLS name over several addresses)
spreads its calls with gRPC's ``round_robin``. gRPC's client-side health checking is not configured:
it needs the ``Health/Watch`` stream, which Triton 2.51 does not implement (``Check`` only); the
fleet's probes check readiness instead.

TLS and auth (``credentials.py``, ``tls.py``) are orthogonal to those arguments: a ``grpcs://`` channel
gets its channel credentials (CA, client certificate) beside the same arguments, and the auth headers
go on every call as its metadata.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ..credentials import redact, scrub
from ..endpoints import Endpoint
from ..status import CallError, Status, from_grpc_status
from ..tls import grpc_channel_credentials
from .base import (
    Heads,
    Transport,
    TransportSettings,
    WireInput,
    WireOutput,
    WireResult,
    refuse_unregister_all,
)
from .codec import decode, tensor_bytes
from .grpc_wire import MODEL_INFER, request_head, serialize

logger = logging.getLogger(__name__)

R = TypeVar("R")

#: The ``compression`` setting as gRPC takes it.
_COMPRESSION = {
    None: grpc.Compression.NoCompression,
    "gzip": grpc.Compression.Gzip,
    "deflate": grpc.Compression.Deflate,
}
#: Planned request bodies above this are refused before serialisation: protobuf caps a message at 2 GB,
#: and above ~1.3 GB a second large request has aborted clients (libprotobuf FATAL).
MAX_MESSAGE_BYTES = 1 << 30


class GrpcTransport(Transport):
    protocol = "grpc"
    any_thread = True  # one thread-safe client; every call has its deadline; close() ends calls still out

    def __init__(self, endpoint: Endpoint, settings: TransportSettings, *, balanced: bool = False) -> None:
        self.url = endpoint.url
        self.credentials = settings.credentials
        self._heads = Heads(request_head)
        self._closed = False
        self._compression = _COMPRESSION[settings.compression]
        keepalive = None
        if settings.keepalive_s is not None:
            keepalive = grpcclient.KeepAliveOptions(
                keepalive_time_ms=int(settings.keepalive_s * 1000), keepalive_permit_without_calls=True
            )
        credentials = settings.credentials
        options = channel_args(keepalive, balanced=balanced, reconnect_s=settings.max_reconnect_backoff_s)
        if endpoint.tls:
            channel = grpc.secure_channel(endpoint.address, grpc_channel_credentials(credentials), options=options)
        else:
            channel = grpc.insecure_channel(endpoint.address, options=options)
        self._channel = channel
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self._model_infer = channel.unary_unary(
            MODEL_INFER,
            request_serializer=serialize,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        self._metadata = tuple(credentials.headers_for(self.protocol).items())  # on every call (credentials.py)

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
        body = sum(int(i.data.nbytes) for i in inputs if i.data is not None)
        if body > MAX_MESSAGE_BYTES:
            raise CallError(
                Status.TOO_LARGE,
                f"the request body would hold {body} bytes, over the {MAX_MESSAGE_BYTES} bytes this client sends "
                "over gRPC",
            )
        with self._mapped():
            head = self._heads.get(model, version, inputs, outputs, parameters)
            tensors = [tensor_bytes(spec.data, spec.datatype) for spec in inputs if spec.data is not None]
            response = self._model_infer(
                (head, tensors), timeout=timeout_s, metadata=self._metadata, compression=self._compression
            )
        return _GrpcResult(response)

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        """Every exception of a call on the channel as a ``CallError``: the one place this transport translates.

        A ``grpc.RpcError`` (a ``grpc.Call`` too) carries the call's status code, read by
        ``status.from_grpc_status``. Anything else is a call the channel refused or ended under us: ``CANCELLED``
        once ``close()`` has closed it (a closed channel refuses new calls with ``ValueError``), else
        ``INTERNAL``. The foreign exception, secrets taken out (``credentials.scrub``), is the cause.
        """
        try:
            yield
        except CallError:
            raise
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
            raise from_grpc_status(str(code), redact(str(details or code))) from scrub(exc)
        except Exception as exc:
            clean = scrub(exc)
            status = Status.CANCELLED if self._closed else Status.INTERNAL
            raise CallError(status, f"{type(exc).__name__}: {clean}") from clean

    def _call(self, rpc: Callable[..., R], request: Message, timeout_s: float) -> R:
        """A control call through the generated stub, with the headers and the deadline."""
        with self._mapped():
            return rpc(request, timeout=timeout_s, metadata=self._metadata)

    # -- control calls ----------------------------------------------------------------------------
    def is_model_ready(self, model: str, version: str, *, timeout_s: float) -> bool:
        request = service_pb2.ModelReadyRequest(name=model, version=version)
        try:
            return bool(self._call(self._stub.ModelReady, request, timeout_s).ready)
        except CallError as error:
            if error.status is Status.INTERNAL and self._unknown_model(model, version, timeout_s):
                return False  # MLServer answers UNKNOWN for a model it does not have; Triton answers "not ready"
            raise

    def _unknown_model(self, model: str, version: str, timeout_s: float) -> bool:
        try:
            self._call(
                self._stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=model, version=version), timeout_s
            )
        except CallError as error:
            return error.status is Status.NOT_FOUND
        return False

    def use_binary_tensors(self, binary: bool) -> None:
        """gRPC always carries tensors as raw bytes."""

    def server_metadata(self, *, timeout_s: float) -> dict[str, Any]:
        return _as_dict(self._call(self._stub.ServerMetadata, service_pb2.ServerMetadataRequest(), timeout_s))

    def model_metadata(self, model: str, version: str, *, timeout_s: float) -> dict[str, Any]:
        request = service_pb2.ModelMetadataRequest(name=model, version=version)
        return _as_dict(self._call(self._stub.ModelMetadata, request, timeout_s))

    def model_config(self, model: str, version: str, *, timeout_s: float) -> pb.ModelConfig:
        request = service_pb2.ModelConfigRequest(name=model, version=version)
        response = self._call(self._stub.ModelConfig, request, timeout_s)
        config = pb.ModelConfig()
        config.CopyFrom(response.config)
        return config

    def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        index = _as_dict(self._call(self._stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(), timeout_s))
        return [_entry(m) for m in index.get("models", [])]

    def statistics(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        request = service_pb2.ModelStatisticsRequest(name=model, version="")
        return _as_dict(self._call(self._stub.ModelStatistics, request, timeout_s))

    def register_system_shm(self, name: str, key: str, byte_size: int, *, timeout_s: float) -> None:
        request = service_pb2.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=byte_size)
        self._call(self._stub.SystemSharedMemoryRegister, request, timeout_s)

    def unregister_system_shm(self, name: str, *, timeout_s: float) -> None:
        refuse_unregister_all(name)
        request = service_pb2.SystemSharedMemoryUnregisterRequest(name=name)
        self._call(self._stub.SystemSharedMemoryUnregister, request, timeout_s)

    def system_shm_names(self, *, timeout_s: float) -> list[str]:
        request = service_pb2.SystemSharedMemoryStatusRequest(name="")
        status = self._call(self._stub.SystemSharedMemoryStatus, request, timeout_s)
        return sorted(status.regions)

    def end_calls(self) -> None:
        """Nothing yet: ``close()`` ends the calls still out, once the shared memory regions have been unregistered
        through the channel it closes (the calls need no free thread for that, unlike HTTP's)."""

    def close(self) -> None:
        """Close the channel: calls still out end at once (``CANCELLED``), later ones are refused."""
        self._closed = True
        self._channel.close()


def channel_args(
    keepalive: grpcclient.KeepAliveOptions | None, *, balanced: bool = False, reconnect_s: float | None = None
) -> list[tuple[str, object]]:
    """tritonclient's own channel arguments (2 GB message limits, keepalive), and ours (see the module docstring)."""
    options = keepalive or grpcclient.KeepAliveOptions()
    args: list[tuple[str, object]] = [
        ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", options.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", options.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", options.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", options.http2_max_pings_without_data),
    ]
    if reconnect_s is not None:
        args += [
            ("grpc.initial_reconnect_backoff_ms", int(min(1.0, reconnect_s) * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(reconnect_s * 1000)),
        ]
    if balanced:
        args.append(("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})))
    return args


def _as_dict(message: Message) -> dict[str, Any]:
    """A response as JSON, as tritonclient's ``as_json=True`` gives it (proto field names; int64 as strings)."""
    result: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return result


def _entry(model: dict[str, Any]) -> dict[str, Any]:
    """An index entry; MLServer's gRPC index writes states as ``State.READY`` (Triton: ``READY``)."""
    entry = dict(model)
    if isinstance(entry.get("state"), str):
        entry["state"] = entry["state"].removeprefix("State.")
    return entry


class _GrpcResult(WireResult):
    def __init__(self, response: Any) -> None:
        self._response = response
        self._index = {output.name: i for i, output in enumerate(response.outputs)}

    def _output(self, name: str) -> Any:
        if name not in self._index:
            raise CallError(Status.INTERNAL, f"the response has no output {name!r}; it has {sorted(self._index)}")
        return self._response.outputs[self._index[name]]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._output(name).shape)  # a repeated int64 field: ints already

    def datatype(self, name: str) -> str:
        return str(self._output(name).datatype)

    def array(self, name: str) -> np.ndarray:
        output = self._output(name)
        index = self._index[name]
        raw = self._response.raw_output_contents
        return decode(raw[index] if index < len(raw) else b"", str(output.datatype), self.shape(name))
