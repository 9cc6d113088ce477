"""What the remote backend needs from a protocol, in neutral terms: the gRPC and HTTP transports implement it.

A transport is the boundary to ``tritonclient``: every call takes a deadline (``timeout_s``), every
failure comes out as a :class:`~.translate.CallError` (never a ``tritonclient`` exception), and an
inference completes through a callback that is called exactly once, on some other thread or in the
calling thread, never raising into the transport.
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb

from .translate import CallError, Status

logger = logging.getLogger(__name__)
J = TypeVar("J")


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


Callback = Callable[[WireResult | None, CallError | None], None]


class Cancel(ABC):
    @abstractmethod
    def cancel(self) -> None:
        """Stop waiting for the call (best effort; the server may still finish its work)."""


class Transport(ABC):
    """One server endpoint over one protocol (``protocol`` is ``"grpc"`` or ``"http"``)."""

    protocol: str
    url: str

    @abstractmethod
    def is_model_ready(self, model: str, version: str, *, timeout_s: float) -> bool: ...

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
        """Send one request; ``callback(result, error)`` is called once. Raises ``CallError`` if it cannot be sent."""

    @abstractmethod
    def close(self) -> None:
        """Release connections and threads; idempotent."""


def deliver(callback: Callable[[Any, CallError | None], None], result: Any, error: CallError | None) -> None:
    """Hand a call's outcome to its callback on a worker thread: the callback owns its errors, the worker lives on."""
    try:
        callback(result, error)
    except Exception:
        logger.exception("remote backend completion failed")


class Workers(Generic[J]):
    """The threads that make a transport's blocking calls: ``count`` daemon threads fed from one queue.

    Each thread runs ``work(workers)``, which takes its jobs from ``jobs()`` until ``stop()`` sends it the
    end; ``put()`` refuses jobs once stopping has begun.
    """

    def __init__(self, name: str, count: int, work: Callable[[Workers[J]], None]) -> None:
        self._queue: queue.SimpleQueue[J | None] = queue.SimpleQueue()
        self.closed = False
        self._threads = [
            threading.Thread(target=work, args=(self,), name=f"{name}-{i}", daemon=True) for i in range(max(1, count))
        ]
        for thread in self._threads:
            thread.start()

    def put(self, job: J) -> None:
        if self.closed:
            raise CallError(Status.CANCELLED, "the transport is closed")
        self._queue.put(job)

    def jobs(self) -> Iterator[J]:
        """A worker's jobs, in order, until ``stop()``."""
        while (job := self._queue.get()) is not None:
            yield job

    def stop(self, *, join_timeout_s: float, first: Callable[[], None] | None = None) -> None:
        """Refuse new jobs, run ``first`` (once), let the queued jobs run, wait for the threads; idempotent."""
        if self.closed:
            return
        self.closed = True
        if first is not None:
            first()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=join_timeout_s)
