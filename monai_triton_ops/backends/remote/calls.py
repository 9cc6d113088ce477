"""One request from ``_submit`` to its future's end: where its tensors go, its attempts, and its results.

Per attempt: inputs are written into a shared memory slot (or carried in the request body),
outputs are written by the server into the same slot when their size is known from an earlier
response with the same input shapes (else they come back in the response body), and the result is
copied out once, so what the caller gets is theirs to keep (the slot serves the next request).

Retries: a transient error (``UNAVAILABLE``) is tried again after a backoff, inside the deadline.
An output that outgrew its place in the slot (Triton says ``INTERNAL`` for that, as for a model
error) is tried again once with outputs in the response body; no other error is retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import InferenceError, InferenceTimeoutError, MonaiTritonError
from ...signature import ModelSignature, dtype_to_numpy
from .pool import PoolExhausted, RegionPool, Slot, aligned
from .retry import Backoff
from .translate import CallError, Status, to_public
from .transport import Cancel, ShmRef, Transport, WireInput, WireOutput, WireResult

if TYPE_CHECKING:
    from ..base import InferRequest

logger = logging.getLogger(__name__)

Outputs = dict[str, Any]
#: Input shapes remembered with the output sizes they produced (bounded: shapes can vary without end).
_SIZE_MEMORY = 64
#: Statuses after which the server may still read or write a request's slot.
_UNFINISHED = frozenset({Status.DEADLINE, Status.CANCELLED, Status.UNAVAILABLE})


class OutputSizes:
    """Bytes each output took for given input shapes: the place reserved for it in the next slot."""

    def __init__(self) -> None:
        self._sizes: OrderedDict[tuple[Any, ...], dict[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> dict[str, int] | None:
        with self._lock:
            sizes = self._sizes.get(key)
            if sizes is not None:
                self._sizes.move_to_end(key)
            return sizes

    def learn(self, key: tuple[Any, ...], sizes: dict[str, int]) -> None:
        with self._lock:
            known = self._sizes.get(key, {})
            self._sizes[key] = {n: max(b, known.get(n, 0)) for n, b in sizes.items()}
            self._sizes.move_to_end(key)
            while len(self._sizes) > _SIZE_MEMORY:
                self._sizes.popitem(last=False)


@dataclass
class Context:
    """What every call of one backend shares."""

    transport: Transport
    signature: ModelSignature
    version: str
    pool: RegionPool | None
    sizes: OutputSizes
    backoff: Backoff
    default_timeout_s: float
    #: ``shared_memory=auto``: a slot that cannot be had (``/dev/shm`` full) sends that request in the body instead.
    fallback: bool = True
    started: Callable[[Call], None] = field(default=lambda call: None)
    ended: Callable[[Call], None] = field(default=lambda call: None)


@dataclass
class _Plan:
    inputs: list[WireInput]
    outputs: list[WireOutput]
    slot: Slot | None = None
    reserved: dict[str, ShmRef] = field(default_factory=dict)


class Call:
    """Drives one request through its attempts; completes ``future`` exactly once."""

    def __init__(self, context: Context, request: InferRequest) -> None:
        self.context = context
        self.request = request
        self.future: Future[Mapping[str, Any]] | None = Future()
        self._attempt = 0
        self._shm_outputs = True
        self._handle: Cancel | None = None
        self._settled = False
        self._started = time.monotonic()
        self._key = tuple((name, tuple(value.shape)) for name, value in request.inputs.items()) + request.outputs

    # -- attempts ---------------------------------------------------------------------------------
    def start(self) -> Future[Mapping[str, Any]]:
        future = self.future
        assert future is not None  # noqa: S101 - a call starts once
        self.context.started(self)
        self._send()
        return future

    def cancel(self) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()

    def _send(self) -> None:
        self._attempt += 1
        remaining = self.request.remaining_s()
        timeout_s = self.context.default_timeout_s if remaining is None else remaining
        if timeout_s <= 0:
            self._fail(CallError(Status.DEADLINE, "the deadline passed before the request was sent"))
            return
        plan: _Plan | None = None
        try:
            plan = self._plan()
            self._handle = self.context.transport.infer_async(
                self.context.signature.name,
                self.context.version,
                plan.inputs,
                plan.outputs,
                timeout_s=timeout_s,
                callback=lambda result, error: self._done(plan, result, error),
            )
        except CallError as exc:
            self._done(plan, None, exc)
        except Exception as exc:  # anything else ends this request, never the caller's thread
            if plan is not None and plan.slot is not None and self.context.pool is not None:
                self.context.pool.release(plan.slot)
            self._settle(exc=exc)

    def _done(self, plan: _Plan | None, result: WireResult | None, error: CallError | None) -> None:
        """The transport's callback (any thread): never raises."""
        try:
            if error is None and result is not None and plan is not None:
                outputs = self._read(plan, result)  # leases the slot when outputs are views of it
                self._free(plan, reuse=True)
                self._settle(result=outputs)
                return
            assert error is not None  # noqa: S101 - the transport gives a result or an error
            self._free(plan, reuse=error.status not in _UNFINISHED)
            self._retry_or_fail(plan, error)
        except Exception as exc:  # a result that cannot be read is this request's error
            self._free(plan, reuse=False)
            self._settle(exc=exc)

    def _retry_or_fail(self, plan: _Plan | None, error: CallError) -> None:
        if error.status is Status.INTERNAL and plan is not None and plan.reserved:
            logger.info("model %r: output outgrew its shared memory place; once more via the response body", self.name)
            self._shm_outputs = False
            self._later(0.0)
            return
        if error.transient:
            delay = self.context.backoff.delay_s(self._attempt, self.request.deadline)
            if delay is not None:
                logger.debug("model %r attempt %d: %s; retrying in %.3f s", self.name, self._attempt, error, delay)
                self._later(delay)
                return
        self._fail(error)

    def _later(self, delay_s: float) -> None:
        """The next attempt on a thread of its own: never inside the transport's callback thread."""
        timer = threading.Timer(delay_s, self._send)
        timer.daemon = True
        timer.start()

    def _fail(self, error: CallError) -> None:
        waited = time.monotonic() - self._started
        exc: MonaiTritonError = to_public(error, model=self.name, url=self.context.transport.url, waited_s=waited)
        if isinstance(exc, InferenceTimeoutError) and self._attempt > 1:
            exc = InferenceTimeoutError(f"{exc} (after {self._attempt} attempts)")
        text = [n for n in self.request.inputs if self.context.signature.input(n).dtype == "BYTES"]
        if text and error.status in (Status.INTERNAL, Status.MODEL_DOWN):  # what we know, not what the message says
            exc = type(exc)(
                f"{exc} (the request carried BYTES input(s) {text}; a Python-backend model on Triton 2.51 cannot "
                "decode BYTES when its stub sees numpy 2)"
            )
        self._settle(exc=exc)

    def _settle(self, *, result: Mapping[str, Any] | None = None, exc: BaseException | None = None) -> None:
        if self._settled:
            return
        self._settled = True
        self._handle = None  # the transport's call holds our callback: no cycle keeping the results alive
        self.context.ended(self)
        # Whoever still references this call (gRPC keeps its last call) must not keep the results, which may
        # be views of a leased shared memory slot: the future goes once it is set.
        future, self.future = self.future, None
        if future is None:
            return
        try:
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result or {})
        except InvalidStateError:  # cancelled by the caller meanwhile
            pass

    @property
    def name(self) -> str:
        return self.context.signature.name

    # -- where tensors go -------------------------------------------------------------------------
    def _plan(self) -> _Plan:
        arrays = {name: to_numpy(value) for name, value in self.request.inputs.items()}
        pool = self.context.pool
        if pool is None or any(a.dtype == np.object_ for a in arrays.values()):
            return _wire_plan(self.context.signature, arrays, self.request.outputs)
        in_places, offset = {}, 0
        for name, array in arrays.items():
            in_places[name] = (offset, int(array.nbytes))
            offset = aligned(offset + int(array.nbytes))
        sizes = self.context.sizes.get(self._key) if self._shm_outputs else None
        out_places: dict[str, tuple[int, int]] = {}
        for name in self.request.outputs:
            if sizes is None or name not in sizes or self.context.signature.output(name).dtype == "BYTES":
                continue
            out_places[name] = (offset, max(1, sizes[name]))
            offset = aligned(offset + max(1, sizes[name]))
        try:
            slot = pool.acquire(max(offset, 1))
        except (OSError, CallError) as exc:
            exhausted = isinstance(exc, PoolExhausted)  # a bounded pool, in any mode: this one request in the body
            if not (self.context.fallback or exhausted) or (
                isinstance(exc, CallError) and exc.status is Status.CANCELLED
            ):
                raise
            logger.warning(
                "model %r: no shared memory slot (%s); this request goes in the request body", self.name, exc
            )
            return _wire_plan(self.context.signature, arrays, self.request.outputs)
        region = slot.region
        assert region is not None  # noqa: S101 - acquire() sizes the slot
        inputs = []
        for name, array in arrays.items():
            start, size = in_places[name]
            region.write(array, start)
            ref = ShmRef(region.name, size, start)
            inputs.append(WireInput(name, self.context.signature.input(name).dtype, tuple(array.shape), shm=ref))
        reserved = {n: ShmRef(region.name, size, start) for n, (start, size) in out_places.items()}
        outputs = [WireOutput(n, shm=reserved.get(n)) for n in self.request.outputs]
        return _Plan(inputs, outputs, slot, reserved)

    def _free(self, plan: _Plan | None, *, reuse: bool) -> None:
        pool = self.context.pool
        if plan is None or plan.slot is None or pool is None:
            return
        slot, plan.slot = plan.slot, None
        if reuse:
            pool.release(slot)
        else:
            pool.quarantine(slot)

    # -- results ----------------------------------------------------------------------------------
    def _read(self, plan: _Plan, result: WireResult) -> Outputs:
        outputs: Outputs = {}
        sizes: dict[str, int] = {}
        in_slot: dict[str, tuple[np.dtype[Any], tuple[int, ...], int]] = {}
        for name in self.request.outputs:
            spec = self.context.signature.output(name)
            got = result.datatype(name)
            if got != spec.dtype:
                raise InferenceError(f"model {self.name!r} output {name!r}: expected dtype {spec.dtype}, got {got}")
            shape = result.shape(name)
            ref = plan.reserved.get(name)
            if ref is None:
                outputs[name] = _owned(self.name, name, shape, result)
                sizes[name] = int(outputs[name].nbytes)
                continue
            dtype = dtype_to_numpy(spec.dtype)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if nbytes > ref.byte_size:
                raise InferenceError(f"model {self.name!r} output {name!r}: {nbytes} bytes exceed its place")
            in_slot[name] = (dtype, shape, ref.offset)
            sizes[name] = nbytes
        if in_slot:
            outputs.update(self._from_slot(plan, in_slot))
        if self.context.pool is not None:
            self.context.sizes.learn(self._key, sizes)
        return outputs

    def _from_slot(self, plan: _Plan, places: dict[str, tuple[np.dtype[Any], tuple[int, ...], int]]) -> Outputs:
        """Outputs written into the slot: handed out as views (the slot leased until they are gone), or copies."""
        pool, slot = self.context.pool, plan.slot
        assert pool is not None  # noqa: S101 - outputs in a slot need a pool
        assert slot is not None  # noqa: S101
        assert slot.region is not None  # noqa: S101
        if pool.can_lease():
            plan.slot = None  # the pool holds it until the caller drops the arrays
            return dict(zip(places, pool.lease_views(slot, list(places.values())), strict=True))
        return {name: slot.region.view(d, shape, offset).copy() for name, (d, shape, offset) in places.items()}


def _wire_plan(signature: ModelSignature, arrays: dict[str, np.ndarray], outputs: tuple[str, ...]) -> _Plan:
    inputs = [WireInput(n, signature.input(n).dtype, tuple(a.shape), data=a) for n, a in arrays.items()]
    return _Plan(inputs, [WireOutput(n) for n in outputs])


def _owned(model: str, name: str, shape: tuple[int, ...], result: WireResult) -> np.ndarray:
    """The output from the response body, as a writable array of its own (the body is read-only bytes)."""
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
    return np.array(array, copy=True)


def to_numpy(value: Any) -> np.ndarray:
    """A C-contiguous numpy array of a caller's input (torch on any device, numpy, or a MetaTensor)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if type(tensor) is not torch.Tensor:
            tensor = tensor.as_subclass(torch.Tensor)
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.uint16)
        return np.ascontiguousarray(tensor.numpy())
    return np.ascontiguousarray(value)
