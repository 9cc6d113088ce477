"""Several backends as one MONAI predictor: an ensemble, test-time mirroring, or both (Holoscan-free).

``EnsemblePredictor(backends, weights=..., flips=...)`` is what the sliding window (or the simple
inferer) calls with a batch of windows. For each flip (``()`` is the window as it is) and each member it
submits the batch at once, so every member's requests and every mirrored copy are in flight together:
on backends with room (a fleet, several servers, an in-process server's instances) the ensemble takes
about as long as its slowest member, not the sum. Results are added to one running weighted sum as they
arrive, each flipped back first, so memory holds the window batch once plus what is in flight, never N
member outputs; the sum is the weighted mean (``weights`` normalised, each flip weighing the same).

Combining per window is exact for the mean: the sliding window's blending is linear, so the blended mean
of the members equals the mean of each member's blended volume. A user ``combine`` gets, per window
batch, every member's prediction (its flips already averaged) in member order; it is applied per window
before blending, which is not the same as after it unless the function is linear.

Mirroring is nnU-Net's: ``mirror_flips((0, 1, 2))`` gives every subset of the spatial axes (8 for 3D),
each prediction flipped back before it is averaged.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import overload

import numpy as np
import torch

from ..backends.arrays import ArrayLike
from ..backends.base import BaseBackend
from ..errors import ConfigError, UsageError
from ..signature import ModelSignature

logger = logging.getLogger(__name__)

#: A user combination: every member's prediction of one window batch, in member order -> one prediction.
Combine = Callable[[list[ArrayLike]], ArrayLike]


def mirror_flips(axes: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Every subset of ``axes`` (spatial axes, 0-based), the empty one first: nnU-Net's mirroring."""
    unique = tuple(dict.fromkeys(int(a) for a in axes))
    if any(a < 0 for a in unique):
        raise ConfigError(f"mirror axes are spatial axes counted from 0, got {list(axes)}")
    return tuple(c for n in range(len(unique) + 1) for c in itertools.combinations(unique, n))


def normalised_weights(weights: Sequence[float] | None, members: int) -> tuple[float, ...]:
    """``weights`` scaled to sum to 1 (equal by default); one per member, each >= 0, not all 0."""
    if weights is None:
        return (1.0 / members,) * members
    values = tuple(float(w) for w in weights)
    if len(values) != members:
        raise ConfigError(f"ensemble weights: {len(values)} given for {members} members")
    if any(not np.isfinite(w) or w < 0 for w in values) or sum(values) <= 0:
        raise ConfigError(f"ensemble weights must be finite, >= 0 and not all 0, got {list(values)}")
    total = sum(values)
    return tuple(w / total for w in values)


@dataclass(frozen=True)
class _Part:
    """One request in flight: which member, which flip, where its windows go in the batch."""

    member: int
    flip: tuple[int, ...]
    start: int


class EnsemblePredictor:
    """``predictor(windows) -> combined prediction`` over several open backends with one input each.

    ``output_names`` picks each member's output (default: its ``output_name`` option, else its first);
    ``flips`` are spatial-axis tuples (``mirror_flips``); ``request_batch_size`` cuts each member's batch
    as ``Predictor`` does (default: the member's ``max_batch_size``).
    """

    def __init__(
        self,
        backends: Sequence[BaseBackend],
        *,
        weights: Sequence[float] | None = None,
        combine: Combine | None = None,
        flips: Sequence[Sequence[int]] = ((),),
        output_names: Sequence[str | None] | None = None,
        request_batch_size: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if not backends:
            raise ConfigError("an ensemble needs at least one member")
        if combine is not None and weights is not None:
            raise ConfigError("give an ensemble either weights (a weighted mean) or combine (a function), not both")
        if not flips:
            raise ConfigError("flips: give at least () (the window as it is)")
        if request_batch_size is not None and request_batch_size < 1:
            raise ConfigError(f"predictor request_batch_size must be >= 1, got {request_batch_size}")
        self.backends = tuple(backends)
        self.weights = normalised_weights(weights, len(self.backends))
        self.combine = combine
        self.flips = tuple(tuple(int(a) for a in f) for f in flips)
        names = list(output_names) if output_names is not None else [None] * len(self.backends)
        self.outputs = tuple(
            n or b.options.output_name or b.signature.output_names[0] for n, b in zip(names, self.backends, strict=True)
        )
        self.inputs = tuple(_single_input(b.signature) for b in self.backends)
        self.request_batch_size = request_batch_size
        self.timeout_s = timeout_s

    @overload
    def __call__(self, data: torch.Tensor) -> torch.Tensor: ...
    @overload
    def __call__(self, data: np.ndarray) -> np.ndarray: ...
    def __call__(self, data: ArrayLike) -> ArrayLike:
        spatial = data.ndim - 2
        for flip in self.flips:
            if any(a >= spatial for a in flip):
                raise UsageError(
                    f"mirror axes {list(flip)} are outside the {spatial} spatial axes of {tuple(data.shape)}"
                )
        futures: dict[Future[dict[str, ArrayLike]], _Part] = {}
        try:
            for flip in self.flips:
                source = _flip(data, flip)
                for index, backend in enumerate(self.backends):
                    for start, part in self._parts(backend, source):
                        future = backend.submit(
                            {self.inputs[index]: part}, outputs=(self.outputs[index],), timeout_s=self.timeout_s
                        )
                        futures[future] = _Part(index, flip, start)
            return self._gather(futures, int(data.shape[0]))
        finally:
            for future in futures:  # a failure: what is still queued is not needed
                future.cancel()

    def _parts(self, backend: BaseBackend, data: ArrayLike) -> list[tuple[int, ArrayLike]]:
        batch = int(data.shape[0])
        signature = backend.signature
        if signature.batch_axis != 0 or batch == 0:
            return [(0, data)]
        size = min(self.request_batch_size or signature.max_batch_size or batch, batch)
        return [(start, data[start : start + size]) for start in range(0, batch, size)]

    def _gather(self, futures: dict[Future[dict[str, ArrayLike]], _Part], batch: int) -> ArrayLike:
        """Add each result, flipped back and weighted, to a running sum as it arrives."""
        share = 1.0 / len(self.flips)
        members = 1 if self.combine is None else len(self.backends)
        sums: list[ArrayLike | None] = [None] * members
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                part = futures[future]
                value = _flip(future.result()[self.outputs[part.member]], part.flip)
                weight = share * (self.weights[part.member] if self.combine is None else 1.0)
                slot = 0 if self.combine is None else part.member
                sums[slot] = _accumulate(sums[slot], value, weight, part.start, batch, part.member)
        made = [s for s in sums if s is not None]  # every member answered: one sum per slot
        return made[0] if self.combine is None else self.combine(made)


def _accumulate(
    total: ArrayLike | None, value: ArrayLike, weight: float, start: int, batch: int, member: int
) -> ArrayLike:
    """``total[start:start+n] += weight * value``; ``total`` (``batch`` rows) is made from the first value."""
    end = start + int(value.shape[0])
    if total is None:
        total = _zeros_like(value, batch)
    elif tuple(total.shape[1:]) != tuple(value.shape[1:]):
        raise UsageError(
            f"ensemble member {member}: prediction of shape {tuple(value.shape)} does not fit the others' "
            f"{tuple(total.shape)} (members must have the same output channels)"
        )
    if isinstance(total, torch.Tensor):
        total[start:end].add_(torch.as_tensor(value), alpha=weight)  # in place: no weighted copy of the value
    else:
        total[start:end] += np.asarray(value) * weight
    return total


def _zeros_like(value: ArrayLike, rows: int) -> ArrayLike:
    shape = (rows, *tuple(value.shape[1:]))
    if isinstance(value, torch.Tensor):
        return torch.zeros(shape, dtype=value.dtype, device=value.device)
    return np.zeros(shape, dtype=value.dtype)


def _flip(data: ArrayLike, flip: tuple[int, ...]) -> ArrayLike:
    """``data`` (batch, channel, *spatial) mirrored along the spatial ``flip`` axes; itself for ``()``."""
    if not flip:
        return data
    dims = tuple(2 + a for a in flip)
    if isinstance(data, torch.Tensor):
        return torch.flip(data, dims)
    return np.ascontiguousarray(np.flip(data, dims))


def _single_input(signature: ModelSignature) -> str:
    if len(signature.inputs) != 1:
        raise UsageError(
            f"ensemble member {signature.name!r} has {len(signature.inputs)} inputs {list(signature.input_names)}; "
            "an ensemble feeds one image to each member"
        )
    return signature.input_names[0]


def output_channels(signature: ModelSignature, output: str | None) -> int | None:
    """The channel count of ``output`` (default the first) from the signature; ``None`` when it is dynamic."""
    spec = signature.output(output) if output else signature.outputs[0]
    shape = spec.full_shape(signature.max_batch_size)
    if len(shape) < 2 or shape[1] < 0:
        return None
    return int(shape[1])


def check_members(backends: Sequence[BaseBackend], names: Sequence[str]) -> None:
    """Refuse, before anything runs, members whose output channels or spatial rank differ from the first's."""
    first = backends[0].signature
    want = output_channels(first, backends[0].options.output_name)
    rank = len(first.inputs[0].full_shape(first.max_batch_size))
    for name, backend in zip(names[1:], backends[1:], strict=True):
        signature = backend.signature
        got = output_channels(signature, backend.options.output_name)
        if want is not None and got is not None and got != want:
            raise ConfigError(
                f"ensemble member {name!r} gives {got} output channels, member {names[0]!r} gives {want}: "
                "the members of an ensemble must predict the same channels"
            )
        got_rank = len(signature.inputs[0].full_shape(signature.max_batch_size)) if signature.inputs else 0
        if got_rank != rank:
            raise ConfigError(
                f"ensemble member {name!r} takes rank-{got_rank} input, member {names[0]!r} rank {rank}: "
                "the members of an ensemble must take the same images"
            )
