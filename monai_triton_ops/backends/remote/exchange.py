"""One attempt of one request, on the calling thread: where its tensors go, the blocking call, and its outputs.

Inputs are written into a shared memory slot (or carried in the request body); outputs are written by
the server into the same slot when their size is known from an earlier response with the same input
shapes (else they come back in the response body). Outputs in the slot are handed out as views and
the slot stays leased until the caller drops them (``shm/pool.py``); outputs from the body are copied
once into buffers lent to the caller (``leases.py``), reused once the caller's arrays are gone.

An output that outgrew its place in the slot (Triton says ``INTERNAL`` for that, as for a model error)
is sent once more with outputs in the response body, inside the same attempt; no other error is
handled here: the backend's attempt loop decides on retries.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...client.status import CallError, Status
from ...client.transports.base import ShmRef, Transport, WireInput, WireOutput, WireResult
from ...errors import InferenceError
from ...signature import ModelSignature, dtype_to_numpy
from ..arrays import to_numpy
from ..leases import BufferPool
from ..requests import Parameter
from .shm.layout import SIZE_MEMORY, Key, Layout, OutputSizes, place
from .shm.pool import PoolExhausted, RegionPool, Slot

if TYPE_CHECKING:
    from ..base import InferRequest

logger = logging.getLogger(__name__)

Outputs = dict[str, Any]
#: Shared memory requests whose wire objects are kept (slots x request shapes in use).
_KEPT_WIRES = 256
#: Statuses after which the server may still read or write a request's slot.
_UNFINISHED = frozenset({Status.DEADLINE, Status.CANCELLED, Status.UNAVAILABLE})


@dataclass
class _Plan:
    inputs: Sequence[WireInput]
    outputs: Sequence[WireOutput]
    slot: Slot | None = None
    reserved: dict[str, ShmRef] = field(default_factory=dict)
    deadline: float | None = None  # the request's: calls made for it on the way (a registration) end by then


@dataclass(frozen=True)
class _Wire:
    """A shared memory request's tensors as the transport sends them: the same objects for the same slot and layout."""

    inputs: tuple[WireInput, ...]
    outputs: tuple[WireOutput, ...]
    reserved: dict[str, ShmRef]


class _Outgrew(Exception):
    """An output did not fit the place reserved for it in the slot."""


class Exchange:
    """Sends requests of one model; thread-safe (each call uses its own slot)."""

    def __init__(
        self,
        signature: ModelSignature,
        version: str,
        pool: RegionPool | None,
        *,
        fallback: bool,
        parameters: Mapping[str, Parameter] | None = None,
    ) -> None:
        self.signature = signature
        self.version = version
        #: Request parameters every request carries (a request's own win).
        self.parameters = dict(parameters or {})
        self.pool = pool
        #: ``shared_memory=auto``: a slot that cannot be had (``/dev/shm`` full) sends that request in the body.
        self.fallback = fallback
        self.sizes = OutputSizes()
        self._layouts: dict[Key, Layout] = {}
        self._wires: dict[tuple[str, Layout], _Wire] = {}
        self._buffers = BufferPool()  # outputs from response bodies
        self._input_types = {spec.name: spec.dtype for spec in signature.inputs}
        self._output_types = {spec.name: (spec.dtype, dtype_to_numpy(spec.dtype)) for spec in signature.outputs}
        self._body_outputs = frozenset(spec.name for spec in signature.outputs if spec.dtype == "BYTES")

    @property
    def name(self) -> str:
        return self.signature.name

    def send(self, transport: Transport, request: InferRequest) -> Outputs:
        """One attempt: the request's outputs, or ``CallError`` (transport or server) / ``InferenceError``."""
        arrays = {name: to_numpy(value) for name, value in request.inputs.items()}
        key = tuple((name, array.shape) for name, array in arrays.items()) + request.outputs
        try:
            return self._send(transport, request, arrays, key, shm_outputs=True)
        except _Outgrew:
            logger.info("model %r: output outgrew its shared memory place; once more via the response body", self.name)
            return self._send(transport, request, arrays, key, shm_outputs=False)

    def _send(
        self, transport: Transport, request: InferRequest, arrays: dict[str, np.ndarray], key: Key, *, shm_outputs: bool
    ) -> Outputs:
        remaining = request.remaining_s()
        if remaining is not None and remaining <= 0:
            raise CallError(Status.DEADLINE, "the deadline passed before the request was sent")
        plan = self._plan(arrays, request.outputs, key if shm_outputs else None, request.deadline)
        parameters = {**self.parameters, **request.parameters} or None
        try:
            result = transport.infer(
                self.name,
                self.version,
                plan.inputs,
                plan.outputs,
                timeout_s=remaining or _NO_DEADLINE_S,
                parameters=parameters,
            )
        except CallError as error:
            self._free(plan, reuse=error.status not in _UNFINISHED)
            if error.status is Status.INTERNAL and plan.reserved:
                raise _Outgrew from error
            raise
        except BaseException:
            self._free(plan, reuse=False)
            raise
        try:
            outputs = self._read(plan, result, request.outputs, key)
        except BaseException:
            self._free(plan, reuse=False)
            raise
        self._free(plan, reuse=True)  # a no-op when its outputs leased it
        return outputs

    # -- where tensors go -------------------------------------------------------------------------
    def _plan(
        self, arrays: dict[str, np.ndarray], outputs: tuple[str, ...], key: Key | None, deadline: float | None
    ) -> _Plan:
        pool = self.pool
        if pool is None or any(a.dtype.kind == "O" for a in arrays.values()):
            return self._body_plan(arrays, outputs)
        layout = self._layout(arrays, outputs, key)
        try:
            slot = pool.acquire(layout.size, deadline=deadline)
        except (OSError, CallError) as exc:
            exhausted = isinstance(exc, PoolExhausted)  # a bounded pool, in any mode: this one request in the body
            over = deadline is not None and time.monotonic() >= deadline  # no time left for the body either
            if (
                not (self.fallback or exhausted)
                or over
                or (isinstance(exc, CallError) and exc.status is Status.CANCELLED)
            ):
                raise
            logger.warning("model %r: no shared memory slot (%s); this request goes in the body", self.name, exc)
            return self._body_plan(arrays, outputs)
        region = slot.region
        assert region is not None  # noqa: S101 - acquire() sizes the slot
        try:
            for array, (start, _) in zip(arrays.values(), layout.inputs, strict=True):
                region.write(array, start)
        except BaseException:
            pool.release(slot)  # nothing was sent: the slot serves the next request
            raise
        wire = self._wires.get((region.name, layout)) if key is not None else None
        if wire is None:
            wire = self._wire(region.name, layout, arrays, outputs, keep=key is not None)
        return _Plan(wire.inputs, wire.outputs, slot, wire.reserved, deadline)

    def _wire(
        self, region: str, layout: Layout, arrays: dict[str, np.ndarray], outputs: tuple[str, ...], *, keep: bool
    ) -> _Wire:
        """The tensors of a request in ``region`` placed by ``layout``; kept (a transport keeps the request head it
        writes for the same objects: ``client.transports.base.Heads``)."""
        inputs = tuple(
            WireInput(name, self._input_types[name], array.shape, shm=ShmRef(region, size, start))
            for (name, array), (start, size) in zip(arrays.items(), layout.inputs, strict=True)
        )
        reserved = {n: ShmRef(region, size, start) for n, (start, size) in layout.outputs.items()}
        wire = _Wire(inputs, tuple(WireOutput(n, shm=reserved.get(n)) for n in outputs), reserved)
        if keep:
            if len(self._wires) >= _KEPT_WIRES:
                self._wires.clear()
            self._wires[(region, layout)] = wire
        return wire

    def _layout(self, arrays: dict[str, np.ndarray], outputs: tuple[str, ...], key: Key | None) -> Layout:
        """Where the request's tensors sit in its slot (``shm/layout.py``); kept per request shape."""
        layout = self._layouts.get(key) if key is not None else None
        if layout is not None:
            return layout
        sizes = self.sizes.get(key) if key is not None else None
        layout = place([a.nbytes for a in arrays.values()], outputs, sizes, in_body=self._body_outputs)
        if key is not None and sizes is not None:
            if len(self._layouts) >= SIZE_MEMORY:
                self._layouts.clear()
            self._layouts[key] = layout
        return layout

    def _body_plan(self, arrays: dict[str, np.ndarray], outputs: tuple[str, ...]) -> _Plan:
        inputs = [WireInput(n, self._input_types[n], a.shape, data=a) for n, a in arrays.items()]
        return _Plan(inputs, [WireOutput(n) for n in outputs])

    def _free(self, plan: _Plan, *, reuse: bool) -> None:
        pool, slot = self.pool, plan.slot
        if slot is None or pool is None:
            return
        plan.slot = None
        if reuse:
            pool.release(slot)
        else:
            pool.quarantine(slot, deadline=plan.deadline)

    # -- results ----------------------------------------------------------------------------------
    def _read(self, plan: _Plan, result: WireResult, names: tuple[str, ...], key: Key) -> Outputs:
        outputs: Outputs = {}
        sizes: dict[str, int] = {}
        in_slot: dict[str, tuple[np.dtype[Any], tuple[int, ...], int]] = {}
        for name in names:
            datatype, dtype = self._output_types[name]
            got = result.datatype(name)
            if got != datatype:
                raise InferenceError(f"model {self.name!r} output {name!r}: expected dtype {datatype}, got {got}")
            shape = result.shape(name)
            ref = plan.reserved.get(name)
            if ref is None:
                outputs[name] = self._owned(_body_array(self.name, name, shape, result))
                sizes[name] = int(outputs[name].nbytes)
                continue
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > ref.byte_size:
                raise InferenceError(f"model {self.name!r} output {name!r}: {nbytes} bytes exceed its place")
            in_slot[name] = (dtype, shape, ref.offset)
            sizes[name] = nbytes
        if in_slot:
            outputs.update(self._from_slot(plan, in_slot))
        # Every output fitting the place its learned size gave it: nothing new to learn (the common case).
        if self.pool is not None and len(in_slot) < len(names) and self.sizes.learn(key, sizes):
            self._layouts.pop(key, None)  # places change with the sizes learned
        return outputs

    def _owned(self, array: np.ndarray) -> np.ndarray:
        """A writable copy the caller keeps, in a lent buffer (``leases.py``): fresh memory would cost a page fault
        per 4 KB on every response (5 ms for 8 MB here); a buffer comes back once the caller's arrays are gone."""
        if array.dtype.kind == "O" or array.nbytes == 0:
            return np.array(array, copy=True)
        owned = self._buffers.lend(array.nbytes).view(array.dtype).reshape(array.shape)
        np.copyto(owned, array, casting="no")
        return owned

    def _from_slot(self, plan: _Plan, places: dict[str, tuple[np.dtype[Any], tuple[int, ...], int]]) -> Outputs:
        """Outputs written into the slot: handed out as views (the slot leased until they are gone), or copies."""
        pool, slot = self.pool, plan.slot
        assert pool is not None  # noqa: S101 - outputs in a slot need a pool
        assert slot is not None  # noqa: S101
        assert slot.region is not None  # noqa: S101
        if pool.can_lease():
            plan.slot = None  # the pool holds it until the caller drops the arrays
            return dict(zip(places, pool.lease_views(slot, list(places.values())), strict=True))
        return {name: slot.region.view(d, shape, offset).copy() for name, (d, shape, offset) in places.items()}


#: The transport's deadline for a request that has none (the options always give one; this is a guard).
_NO_DEADLINE_S = 3600.0


def _body_array(model: str, name: str, shape: tuple[int, ...], result: WireResult) -> np.ndarray:
    """The output in the response body, checked against the shape the response declares (a read-only view)."""
    try:
        array = result.array(name)
    except ValueError as exc:  # the data does not fill the shape the response declares
        raise InferenceError(
            f"model {model!r} output {name!r}: output byte size mismatch: the response declares shape "
            f"{list(shape)} but carries data of another size ({exc}); a Python-backend model built with "
            "pb_utils.Tensor(name, ndarray) under numpy 2 sends empty tensors"
        ) from exc
    if tuple(array.shape) != shape:
        raise InferenceError(f"model {model!r} output {name!r}: shape {list(array.shape)}, declared {list(shape)}")
    return array
