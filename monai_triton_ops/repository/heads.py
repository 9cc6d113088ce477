"""A network's several outputs as named Triton tensors, and back into the structure the network returns.

A network may return a tensor, a tuple or list of tensors, a dict of them (HoVerNet's three heads), or a
dict of lists (RetinaNet: classification and box regression maps, one tensor per feature level). Triton
serves named tensors only, so the model's outputs are the result's tensors depth-first (dict values in
insertion order, sequence items in order: the runner's ``flatten_result``), each with a name, and the
*layout* records the structure with those names at its leaves::

    "pred"                                                   a tensor
    {"tuple": ["pred_0", "pred_1"]}                          a tuple (or "list") of tensors
    {"dict": [["classification", {"list": ["classification_0", ...]}], ["box_regression", {...}]]}

(a dict as ``[key, layout]`` pairs: ``config.pbtxt`` writes the metadata with its keys sorted, the pairs keep
the network's key order).

The layout travels in the model's MONAI metadata (``LAYOUT_KEY``), so every backend's client (the
TorchScript file's extra files, ``config.pbtxt``'s ``monai_metadata`` parameter, a remote server's model
configuration) gives the bundle's inferer exactly the structure the local network returns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from ..signature import TENSOR_NAME

#: Where the layout is kept in the model's MONAI metadata.
LAYOUT_KEY = "triton_output_layout"

#: A layout: a tensor name, or ``{"dict": [[key, layout], ...]}`` / ``{"list": [...]}`` / ``{"tuple": [...]}``.
Layout = Any


def layout_of(result: Any, names: Sequence[str]) -> Layout:
    """Name every tensor of ``result``: dict keys (``key_i`` below a key), else ``names`` (the bundle's outputs)."""
    base = names[0] if names else "pred"
    plain = isinstance(result, tuple | list) and all(isinstance(v, torch.Tensor) for v in result)
    if plain and len(result) == len(names):
        return {type(result).__name__: [_unique(_clean(n), set()) for n in names]}
    taken: set[str] = set()
    return _layout(result, base, taken)


def _layout(result: Any, prefix: str, taken: set[str]) -> Layout:
    if isinstance(result, torch.Tensor):
        return _unique(_clean(prefix), taken)
    if isinstance(result, Mapping):
        return {"dict": [[str(k), _layout(v, str(k), taken)] for k, v in result.items()]}
    if isinstance(result, tuple | list):
        kind = type(result).__name__
        return {kind: [_layout(v, f"{prefix}_{i}", taken) for i, v in enumerate(result)]}
    raise ConfigError(f"the network returns a {type(result).__name__} inside its result; only tensors can be served")


def tensor_names(layout: Layout) -> list[str]:
    """The layout's tensor names depth-first: the model's outputs in order."""
    if isinstance(layout, str):
        return [layout]
    kind, content = _node(layout)
    values = [value for _, value in content] if kind == "dict" else content
    return [name for value in values for name in tensor_names(value)]


def rebuild(layout: Layout, tensors: Mapping[str, Any], wrap: Callable[[Any], Any] = lambda t: t) -> Any:
    """The network's structure from its named tensors (each passed through ``wrap``)."""
    if isinstance(layout, str):
        if layout not in tensors:
            raise ConfigError(f"the model returned no output {layout!r} (outputs: {sorted(tensors)})")
        return wrap(tensors[layout])
    kind, content = _node(layout)
    if kind == "dict":
        return {key: rebuild(value, tensors, wrap) for key, value in content}
    items = [rebuild(value, tensors, wrap) for value in content]
    return tuple(items) if kind == "tuple" else items


def check_layout(layout: Any, outputs: Sequence[str]) -> Layout:
    """``layout`` read from a model's metadata, checked against the model's outputs (a ``ConfigError`` if not)."""
    try:
        names = tensor_names(layout)
    except (ConfigError, AttributeError, TypeError, ValueError) as exc:
        raise ConfigError(f"the model's metadata item {LAYOUT_KEY!r} is not an output layout: {exc}") from None
    if sorted(names) != sorted(outputs):
        raise ConfigError(
            f"the model's metadata item {LAYOUT_KEY!r} names tensors {names}, the model's outputs are {list(outputs)}"
        )
    return layout


def _node(layout: Any) -> tuple[str, Any]:
    if not isinstance(layout, Mapping) or len(layout) != 1:
        raise ConfigError(f"layout node {layout!r} must be a name or one of dict/list/tuple")
    kind, content = next(iter(layout.items()))
    if kind == "dict" and isinstance(content, list) and all(_pair(item) for item in content):
        return kind, content
    if kind in ("list", "tuple") and isinstance(content, list):
        return kind, content
    raise ConfigError(f"layout node {layout!r} must be a name or one of dict/list/tuple")


def _pair(item: Any) -> bool:
    return isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[0], str)


def _clean(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name) or "out"
    return cleaned if TENSOR_NAME.match(cleaned) else f"t_{cleaned}"


def _unique(name: str, taken: set[str]) -> str:
    candidate, number = name, 1
    while candidate in taken:
        candidate, number = f"{name}_{number}", number + 1
    taken.add(candidate)
    return candidate
