"""What the remote backend needs from a protocol, in neutral terms; the gRPC and HTTP transports implement it.

A transport is the boundary to the client libraries (``grpc``, ``geventhttpclient``, ``tritonclient``): every
call blocks the calling thread until an answer or its deadline (``timeout_s``), and every failure comes out as
a :class:`~..status.CallError` (never a library's exception: each transport maps its libraries' exceptions in
one context manager).
The backend calls ``infer`` on its worker threads; control calls may come from any thread.
:class:`TransportSettings` is how every endpoint of one backend is spoken to.

Both protocols describe a request with the same :class:`WireInput` / :class:`WireOutput` values; each writes
its own wire form (``grpc_wire.py``, ``http_wire.py``), and :class:`Heads` keeps the part of a shared memory
request that does not change from one request to the next.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.utils import TRITON_RESERVED_REQUEST_PARAMS, TRITON_RESERVED_REQUEST_PARAMS_PREFIX

from ..credentials import CredentialOptions, Credentials, load_credentials
from ..status import CallError, Status

H = TypeVar("H")


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


class Heads(Generic[H]):
    """The written head of shared memory requests (everything but tensors' bytes, which such a request has none
    of), kept: it depends only on the slot and the shapes, and a sliding window sends the same few again and again.

    ``write(model, version, inputs, outputs, parameters)`` writes one. Heads are found by the identity of the
    ``inputs`` and ``outputs`` sequences, which the exchange keeps per slot and layout (hashing the specs cost
    more than writing anew); the entry holds both, so their ids are not reused meanwhile. Not locked: a lost race
    writes the same head twice.
    """

    def __init__(self, write: Callable[..., H], limit: int = 256) -> None:
        self._write = write
        self._limit = limit  # slots x request shapes in use
        self._kept: dict[int, tuple[Sequence[WireInput], Sequence[WireOutput], tuple[Any, ...], H]] = {}

    def get(
        self,
        model: str,
        version: str,
        inputs: Sequence[WireInput],
        outputs: Sequence[WireOutput],
        parameters: Mapping[str, str | int | bool] | None,
    ) -> H:
        key = (model, version, *sorted((parameters or {}).items()))
        kept = self._kept.get(id(inputs))
        if kept is not None and kept[0] is inputs and kept[1] is outputs and kept[2] == key:
            return kept[3]
        head = self._write(model, version, inputs, outputs, parameters)
        if all(spec.shm is not None for spec in inputs):  # a body request's specs are made per request
            if len(self._kept) >= self._limit:
                self._kept.clear()
            self._kept[id(inputs)] = (inputs, outputs, key, head)
        return head


def refuse_unregister_all(name: str) -> None:
    """An empty name unregisters every client's regions on the server: never send one."""
    if not name:
        raise ValueError("refusing to unregister all shared memory regions")


def refuse_reserved(parameter: str) -> None:
    """A request parameter of Triton's own (``priority``, ``triton_...``: tritonclient's list) is not the caller's
    to send."""
    if parameter in TRITON_RESERVED_REQUEST_PARAMS or parameter.startswith(TRITON_RESERVED_REQUEST_PARAMS_PREFIX):
        raise CallError(Status.INVALID_ARGUMENT, f"request parameter {parameter!r} is reserved for Triton")
