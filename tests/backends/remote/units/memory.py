"""A stand-in for a Triton server, in memory, behind the real transport interface (``transports/base.py``).

The unit tests of the remote backend's parts (region pool, exchange, fleet) need something on the other side of
a :class:`~monai_triton_ops.client.transports.base.Transport` that behaves like a server where the parts
rely on it, without a ``tritonserver`` process: this is a stand-in for a server, not a server. What it keeps of
Triton's behaviour, and nothing more:

- a registered system shared memory region is mapped by the server from its key in ``/dev/shm`` (real shared
  memory: the server reads the client's inputs from it and writes outputs into it, at the offsets asked);
- a region is *in use* while a request that reads or writes it runs on the server, and unregistering it is then
  refused ("currently in use", Triton's ``SharedMemoryManager::Unregister``); ``hold(name)`` keeps a region in use
  the way a request the client gave up on (deadline, cancel) keeps it while the server still runs it;
- an output that does not fit its place in a region fails the request with ``INTERNAL``, as Triton does;
- readiness is a flag the test sets (``ready``), and a readiness answer can be held on its way back
  (``answering``, ``asked``); a model that is not ready is ``LOADING`` in the repository index.

``model`` computes the outputs from the inputs (``dict`` in, ``dict`` out); ``before`` runs at the start of every
request with what it received, and may wait (a ``threading.Barrier``) or raise a ``CallError`` (a failure).
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb

from monai_triton_ops.backends.remote.shm.region import SHM_DIR
from monai_triton_ops.client.credentials import Credentials
from monai_triton_ops.client.status import CallError, Status
from monai_triton_ops.client.transports.base import ShmRef, Transport, WireInput, WireOutput, WireResult
from monai_triton_ops.signature import dtype_of, dtype_to_numpy

#: A bound on every wait for the test's thread, never reached when the code under test is right.
WAIT_S = 30.0

Model = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def doubled(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The default model: ``y`` is the first input times two."""
    return {"y": next(iter(inputs.values())) * 2}


@dataclass(frozen=True)
class Received:
    """One request as the server received it (what the client put on the wire)."""

    model: str
    version: str
    inputs: tuple[WireInput, ...]
    outputs: tuple[WireOutput, ...]
    parameters: Mapping[str, str | int | bool] | None
    timeout_s: float


class MemoryResult(WireResult):
    def __init__(self, outputs: dict[str, tuple[str, tuple[int, ...], np.ndarray | None]]) -> None:
        self._outputs = outputs

    def shape(self, name: str) -> tuple[int, ...]:
        return self._outputs[name][1]

    def datatype(self, name: str) -> str:
        return self._outputs[name][0]

    def array(self, name: str) -> np.ndarray:
        data = self._outputs[name][2]
        if data is None:
            raise CallError(Status.INTERNAL, f"output {name!r} was written to shared memory, not the body")
        return data


class MemoryServer:
    """The server side (see the module docstring); thread-safe."""

    def __init__(self, model_name: str = "m", model: Model = doubled) -> None:
        self.model_name = model_name
        self.model = model
        self.before: Callable[[Received], None] | None = None
        self.ready = True
        #: Cleared, a readiness answer, once decided, waits until it is set again (an answer still on its way).
        self.answering = threading.Event()
        self.answering.set()
        #: Set by every readiness call once its answer is decided.
        self.asked = threading.Event()
        self.received: list[Received] = []
        self.registrations: Counter[str] = Counter()  # how often each region name was registered
        self._lock = threading.Lock()
        self._mapped: dict[str, mmap.mmap] = {}
        self._in_use: Counter[str] = Counter()
        self._held: set[str] = set()

    # -- shared memory ------------------------------------------------------------------------------
    def register(self, name: str, key: str, byte_size: int) -> None:
        with self._lock:
            if name in self._mapped:
                raise CallError(Status.ALREADY_EXISTS, f"shared memory region {name!r} already in manager")
            try:
                fd = os.open(SHM_DIR / key.lstrip("/"), os.O_RDWR)
            except FileNotFoundError as exc:  # Triton's answer when the key names no file
                raise CallError(Status.INTERNAL, f"Unable to open shared memory region: '{key}'") from exc
            try:
                self._mapped[name] = mmap.mmap(fd, byte_size)
            finally:
                os.close(fd)
            self.registrations[name] += 1

    def unregister(self, name: str) -> None:
        with self._lock:
            if self._in_use[name] or name in self._held:
                raise CallError(Status.INTERNAL, f"cannot unregister shared memory region '{name}', currently in use")
            mapping = self._mapped.pop(name, None)
        if mapping is not None:
            mapping.close()

    def registered(self) -> list[str]:
        with self._lock:
            return sorted(self._mapped)

    def hold(self, name: str) -> None:
        """Keep ``name`` in use, as a request the client gave up on while the server still runs it."""
        with self._lock:
            self._held.add(name)

    def let_go(self, name: str) -> None:
        with self._lock:
            self._held.discard(name)

    # -- requests -----------------------------------------------------------------------------------
    def infer(self, received: Received) -> MemoryResult:
        with self._lock:
            self.received.append(received)
        refs = [t.shm for t in received.inputs] + [t.shm for t in received.outputs]
        regions = [ref.region for ref in refs if ref is not None]
        with self._lock:
            self._in_use.update(regions)
        try:
            if self.before is not None:
                self.before(received)
            inputs = {spec.name: self._read(spec) for spec in received.inputs}
            computed = self.model(inputs)
            return MemoryResult({out.name: self._write(out, computed[out.name]) for out in received.outputs})
        finally:
            with self._lock:
                self._in_use.subtract(regions)

    def _read(self, spec: WireInput) -> np.ndarray:
        if spec.shm is None:
            assert spec.data is not None
            return np.array(spec.data, copy=True)
        dtype = dtype_to_numpy(spec.datatype)
        view = np.frombuffer(
            self._region(spec.shm), dtype=dtype, count=int(np.prod(spec.shape)), offset=spec.shm.offset
        )
        return view.reshape(spec.shape).copy()

    def _write(self, out: WireOutput, array: np.ndarray) -> tuple[str, tuple[int, ...], np.ndarray | None]:
        datatype = dtype_of(array)
        if out.shm is None:
            return datatype, array.shape, array
        if array.nbytes > out.shm.byte_size:
            raise CallError(Status.INTERNAL, f"output {out.name!r}: insufficient space in the shared memory region")
        region = self._region(out.shm)
        region[out.shm.offset : out.shm.offset + array.nbytes] = array.tobytes()
        return datatype, array.shape, None

    def _region(self, ref: ShmRef) -> mmap.mmap:
        with self._lock:
            mapping = self._mapped.get(ref.region)
        if mapping is None:
            raise CallError(Status.INVALID_ARGUMENT, f"unable to find system shared memory region: '{ref.region}'")
        return mapping

    def close(self) -> None:
        with self._lock:
            mappings, self._mapped = list(self._mapped.values()), {}
        for mapping in mappings:
            mapping.close()


class MemoryTransport(Transport):
    """A client connection to a :class:`MemoryServer`: the transport interface, in memory (a stand-in for a
    server's gRPC or HTTP endpoint). Every call raises ``CallError`` like a real transport; after ``close()``
    calls are ``CANCELLED``."""

    protocol = "grpc"
    any_thread = True

    def __init__(self, server: MemoryServer, url: str = "grpc://127.0.0.1:9") -> None:
        self.server = server
        self.url = url
        self.closed = 0  # how many times close() was called
        self.unavailable = False  # every call fails UNAVAILABLE (a channel that cannot reach the server)
        self.binary: bool | None = None
        self.credentials = Credentials()  # no TLS, no headers: what the janitor is handed

    def _check(self) -> None:
        if self.closed:
            raise CallError(Status.CANCELLED, "the transport is closed")
        if self.unavailable:
            raise CallError(Status.UNAVAILABLE, "failed to connect to all addresses")

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
        self._check()
        params = None if parameters is None else dict(parameters)
        return self.server.infer(Received(model, version, tuple(inputs), tuple(outputs), params, timeout_s))

    def is_model_ready(self, model: str, version: str, *, timeout_s: float) -> bool:
        self._check()
        ready = self.server.ready and model == self.server.model_name
        self.server.asked.set()
        if not self.server.answering.wait(WAIT_S):
            raise CallError(Status.DEADLINE, "the stand-in was held past the test's bound")
        return ready

    def server_metadata(self, *, timeout_s: float) -> dict[str, Any]:
        self._check()
        return {"name": "memory", "version": "0", "extensions": ["system_shared_memory", "binary_tensor_data"]}

    def use_binary_tensors(self, binary: bool) -> None:
        self.binary = binary

    def model_metadata(self, model: str, version: str, *, timeout_s: float) -> dict[str, Any]:
        raise CallError(Status.UNSUPPORTED, "the stand-in has no model metadata")

    def model_config(self, model: str, version: str, *, timeout_s: float) -> pb.ModelConfig:
        raise CallError(Status.UNSUPPORTED, "the stand-in has no model configuration")

    def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        self._check()
        state = "READY" if self.server.ready else "LOADING"
        return [{"name": self.server.model_name, "version": "1", "state": state, "reason": ""}]

    def statistics(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        self._check()
        return {"model_stats": []}

    def register_system_shm(self, name: str, key: str, byte_size: int, *, timeout_s: float) -> None:
        self._check()
        self.server.register(name, key, byte_size)

    def unregister_system_shm(self, name: str, *, timeout_s: float) -> None:
        self._check()
        self.server.unregister(name)

    def system_shm_names(self, *, timeout_s: float) -> list[str]:
        self._check()
        return self.server.registered()

    def end_calls(self) -> None:
        """Nothing to end: the stand-in's calls never wait."""

    def close(self) -> None:
        self.closed += 1
