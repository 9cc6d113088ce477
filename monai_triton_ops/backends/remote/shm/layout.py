"""Where a request's tensors sit in its slot: inputs, then the outputs whose size is known, each at an aligned offset.

A slot holds one request's inputs and outputs side by side. An output's size is known once a response to a
request of the same input shapes has said it (:class:`OutputSizes` remembers it, bounded: shapes can vary
without end); until then, and for BYTES outputs (their size depends on their values), the output comes back in
the response body. Every tensor starts at a multiple of ``ALIGN`` bytes (``pool.aligned``) from the region's
start; the region itself is registered at offset 0 and tensors are placed by offset within it
(``InferInput.set_shared_memory(region, byte_size, offset)``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from .pool import aligned

#: A request's shape: its inputs' names and shapes, and the outputs asked for.
Key = tuple[Any, ...]
#: Input shapes remembered with the output sizes they produced (bounded: shapes can vary without end).
SIZE_MEMORY = 64


class OutputSizes:
    """Bytes each output took for given input shapes: the place reserved for it in the next slot."""

    def __init__(self) -> None:
        self._sizes: OrderedDict[Key, dict[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Key) -> dict[str, int] | None:
        with self._lock:
            sizes = self._sizes.get(key)
            if sizes is not None:
                self._sizes.move_to_end(key)
            return sizes

    def learn(self, key: Key, sizes: dict[str, int]) -> bool:
        """Remember the sizes (the larger of old and new); whether anything changed."""
        with self._lock:
            known = self._sizes.get(key)
            if known is not None and all(known.get(n, -1) >= b for n, b in sizes.items()):
                return False
            known = known or {}
            self._sizes[key] = {n: max(b, known.get(n, 0)) for n, b in sizes.items()}
            self._sizes.move_to_end(key)
            while len(self._sizes) > SIZE_MEMORY:
                self._sizes.popitem(last=False)
            return True


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a key of the exchange's kept requests
class Layout:
    """Offsets in one slot: ``(offset, bytes)`` of each input in order, of each output of a known size; the size."""

    inputs: tuple[tuple[int, int], ...]
    outputs: dict[str, tuple[int, int]]
    size: int


def place(
    input_bytes: Sequence[int], outputs: Sequence[str], sizes: dict[str, int] | None, *, in_body: Collection[str]
) -> Layout:
    """The layout of a request whose inputs take ``input_bytes``: inputs first, then each output of ``outputs``
    whose size ``sizes`` knows, except those that always come in the body (``in_body``: BYTES outputs)."""
    in_places, offset = [], 0
    for nbytes in input_bytes:
        in_places.append((offset, nbytes))
        offset = aligned(offset + nbytes)
    out_places: dict[str, tuple[int, int]] = {}
    for name in outputs:
        if sizes is None or name not in sizes or name in in_body:
            continue
        out_places[name] = (offset, max(1, sizes[name]))
        offset = aligned(offset + max(1, sizes[name]))
    return Layout(tuple(in_places), out_places, max(offset, 1))
