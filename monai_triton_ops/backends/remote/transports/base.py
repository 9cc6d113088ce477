"""What the remote backend needs from a protocol, in neutral terms; the gRPC and HTTP transports implement it.

A transport is the boundary to ``tritonclient``: every call blocks the calling thread until an answer
or its deadline (``timeout_s``), and every failure comes out as a :class:`~..status.CallError` (never
a ``tritonclient`` exception: each transport maps its library's exceptions in one context manager).
The backend calls ``infer`` on its worker threads; control calls may come from any thread.
:class:`TransportSettings` is how every endpoint of one backend is spoken to.

Both protocols describe a request with the same ``InferInput`` / ``InferRequestedOutput`` shape, so
:class:`RequestBuilder` builds it for either client module; only the body encoding differs (HTTP
asks for binary tensors, gRPC always sends raw bytes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb

from .credentials import CredentialOptions, Credentials, load_credentials


class TransportOptions(CredentialOptions, Protocol):
    """The options :class:`TransportSettings` is made from (``RemoteOptions`` has them)."""

    @property
    def compression(self) -> str: ...
    @property
    def keepalive_s(self) -> float | None: ...
    @property
    def max_probe_backoff_s(self) -> float: ...


@dataclass(frozen=True, kw_only=True)
class TransportSettings:
    """How every endpoint of one backend is spoken to; made once from the options (files read here, not per call)."""

    credentials: Credentials = field(default_factory=Credentials)  # TLS material and headers (credentials.py)
    compression: str | None = None  # gRPC message compression: gzip, deflate
    keepalive_s: float | None = None  # gRPC keepalive ping period
    max_reconnect_backoff_s: float | None = None  # gRPC: reconnect to a server that went away at least this often

    @classmethod
    def from_options(cls, options: TransportOptions) -> TransportSettings:
        return cls(
            credentials=load_credentials(options),
            compression=None if options.compression == "none" else options.compression,
            keepalive_s=options.keepalive_s,
            max_reconnect_backoff_s=options.max_probe_backoff_s,
        )


@dataclass(frozen=True)
class ShmRef:
    """Where a tensor lives in a registered system shared memory region (the region is registered at offset 0)."""

    region: str
    byte_size: int
    offset: int


@dataclass(frozen=True)
class WireInput:
    """One input as it goes on the wire: ``data`` in the request body, or ``shm`` for the server to read."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None = None
    shm: ShmRef | None = None


@dataclass(frozen=True)
class WireOutput:
    """One requested output: returned in the response body, or written by the server into ``shm``."""

    name: str
    shm: ShmRef | None = None


class WireResult(ABC):
    """A successful response: shapes and datatypes always; data for outputs not written to shared memory."""

    @abstractmethod
    def shape(self, name: str) -> tuple[int, ...]: ...

    @abstractmethod
    def datatype(self, name: str) -> str: ...

    @abstractmethod
    def array(self, name: str) -> np.ndarray:
        """The output carried in the response body (may be a read-only view of the response's bytes)."""


class Transport(ABC):
    """One server endpoint over one protocol (``protocol`` is ``"grpc"`` or ``"http"``)."""

    protocol: str
    url: str
    #: The TLS material and headers it speaks with (the shared-memory janitor reaches the server with them too).
    credentials: Credentials
    #: Whether any thread may call ``infer`` (else only the backend's workers may, each with its own client).
    any_thread: bool = False

    @abstractmethod
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
        """Send one request (with Triton request ``parameters``, if any) and wait for its answer; a failure or
        the deadline raises ``CallError``."""

    @abstractmethod
    def is_model_ready(self, model: str, version: str, *, timeout_s: float) -> bool: ...

    @abstractmethod
    def server_metadata(self, *, timeout_s: float) -> dict[str, Any]:
        """``{"name", "version", "extensions": [str]}`` as the server reports it (``protocol.py`` reads it)."""

    @abstractmethod
    def use_binary_tensors(self, binary: bool) -> None:
        """Whether request and response bodies carry tensors as binary (HTTP; gRPC always does)."""

    @abstractmethod
    def model_metadata(self, model: str, version: str, *, timeout_s: float) -> dict[str, Any]:
        """``{"name", "versions": [str], "inputs": [...], "outputs": [...]}`` as the server reports it."""

    @abstractmethod
    def model_config(self, model: str, version: str, *, timeout_s: float) -> pb.ModelConfig: ...

    @abstractmethod
    def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        """``[{"name", "version", "state", "reason"}]`` for every model in the server's repository."""

    @abstractmethod
    def statistics(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        """Triton's inference statistics for ``model`` (``model_stats`` list), as JSON."""

    @abstractmethod
    def register_system_shm(self, name: str, key: str, byte_size: int, *, timeout_s: float) -> None: ...

    @abstractmethod
    def unregister_system_shm(self, name: str, *, timeout_s: float) -> None:
        """Unregister exactly ``name`` (never every region: other clients share the server)."""

    @abstractmethod
    def system_shm_names(self, *, timeout_s: float) -> list[str]:
        """Names of the system shared memory regions registered on the server (by anyone)."""

    @abstractmethod
    def end_calls(self) -> None:
        """End every inference call still out now (``CANCELLED``) and refuse new ones; control calls still work
        (closing unregisters its shared memory regions through them). The backend's ``close()`` calls it first:
        its requests in flight are abandoned, and nothing then waits for them. A transport whose ``close()`` ends
        its calls at once (gRPC: closing the channel does) may leave them to it."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; calls still out end at once; idempotent."""


class RequestBuilder:
    """``tritonclient.grpc`` or ``tritonclient.http`` input and output objects for a request, for either protocol.

    ``binary`` goes to the body setters: ``{"binary_data": True}`` for HTTP, ``{}`` for gRPC. The objects of a
    request whose tensors are all in shared memory depend only on the slot and the shapes, and tritonclient only
    reads them, so they are kept and reused (a sliding window sends the same few again and again). They are found
    by the identity of the ``inputs`` and ``outputs`` sequences, which the exchange keeps per slot and layout
    (hashing the specs cost more than building anew); the entry holds both, so their ids are not reused meanwhile.
    """

    def __init__(self, client: ModuleType, *, binary: dict[str, Any]) -> None:
        self._client = client
        self._binary = binary
        self._kept: dict[int, tuple[Sequence[WireInput], Sequence[WireOutput], tuple[list[Any], list[Any]]]] = {}

    def build(self, inputs: Sequence[WireInput], outputs: Sequence[WireOutput]) -> tuple[list[Any], list[Any]]:
        kept = self._kept.get(id(inputs))
        if kept is not None and kept[0] is inputs and kept[1] is outputs:
            return kept[2]
        built = build_request(self._client, inputs, outputs, binary=self._binary)
        if all(spec.shm is not None for spec in inputs):  # a body request's objects hold its data: never kept
            if len(self._kept) >= _KEPT_REQUESTS:
                self._kept.clear()
            self._kept[id(inputs)] = (inputs, outputs, built)
        return built


#: Shared memory requests whose tritonclient objects are kept (slots x request shapes in use).
_KEPT_REQUESTS = 256


def build_request(
    client: ModuleType, inputs: Sequence[WireInput], outputs: Sequence[WireOutput], *, binary: dict[str, Any]
) -> tuple[list[Any], list[Any]]:
    """``tritonclient.grpc`` or ``tritonclient.http`` input and output objects for one request (see above)."""
    tensors = []
    for spec in inputs:
        tensor = client.InferInput(spec.name, list(spec.shape), spec.datatype)
        if spec.shm is not None:
            tensor.set_shared_memory(spec.shm.region, spec.shm.byte_size, spec.shm.offset)
        elif spec.data is not None:
            tensor.set_data_from_numpy(spec.data, **binary)
        tensors.append(tensor)
    requested = []
    for out in outputs:
        output = client.InferRequestedOutput(out.name, **binary)  # shared memory turns binary_data off
        if out.shm is not None:
            output.set_shared_memory(out.shm.region, out.shm.byte_size, out.shm.offset)
        requested.append(output)
    return tensors, requested


def refuse_unregister_all(name: str) -> None:
    """An empty name unregisters every client's regions on the server: never send one."""
    if not name:
        raise ValueError("refusing to unregister all shared memory regions")
