"""Typed backend options: a frozen dataclass per backend, filled from a spec's query string or keywords.

``torch?device=cuda`` and ``grpc://h:8001?timeout_s=3&max_in_flight=4`` carry options as text; the
annotations of the backend's options dataclass say what each one is, so ``timeout_s: float | None``
arrives as ``3.0``, not ``'3'``. Keyword options (``create_backend(..., timeout_s=3)``) go through the
same checks. Unknown or mistyped options fail with the list of accepted ones and their types.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from ..errors import ConfigError

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NONE = frozenset({"", "none", "null"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What every backend accepts; a backend's own options subclass this (frozen, keyword-only).

    ``timeout_s`` is the default per-request deadline (``None``: none; remote backends set one),
    ``max_in_flight`` how many requests may be outstanding at once on this backend, and
    ``output_name`` the output the predictor ``__call__`` returns (default: the first).
    """

    timeout_s: float | None = None
    max_in_flight: int = 2
    output_name: str | None = None

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(f"option timeout_s must be > 0 seconds or None, got {self.timeout_s!r}")
        if isinstance(self.max_in_flight, bool) or self.max_in_flight < 1:
            raise ConfigError(f"option max_in_flight must be an integer >= 1, got {self.max_in_flight!r}")
        for name, hint in _hints(type(self)).items():  # every backend's Literal options, however they were built
            if get_origin(hint) is Literal and getattr(self, name) not in get_args(hint):
                raise ConfigError(f"option {name}={getattr(self, name)!r} is not a {type_name(hint)}")


def parse_options(options_type: type[BackendOptions], raw: Mapping[str, Any], *, backend: str) -> BackendOptions:
    """Build ``options_type`` from ``raw``: strings are typed from the annotations, other values checked.

    Raises ``ConfigError`` naming the option, the value and the type it needs, or the unknown
    names together with every accepted option and its type.
    """
    hints = _hints(options_type)
    unknown = sorted(set(raw) - set(hints))
    if unknown:
        raise ConfigError(f"backend {backend!r} has no option(s) {unknown}; accepted: {describe_options(options_type)}")
    values = {}
    for name, value in raw.items():
        try:
            values[name] = _coerce(value, hints[name])
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"backend {backend!r}: option {name}={value!r} is not a {type_name(hints[name])}"
            ) from exc
    try:
        return options_type(**values)
    except ConfigError as exc:
        raise ConfigError(f"backend {backend!r}: {exc}") from exc


def describe_options(options_type: type[BackendOptions]) -> str:
    """``"device (str), max_in_flight (int), ..."``: every accepted option with its type, sorted."""
    return ", ".join(f"{name} ({type_name(hint)})" for name, hint in sorted(_hints(options_type).items()))


def type_name(hint: Any) -> str:
    """A readable name for an annotation: ``float | None``, ``tuple[int, ...]``, ``'a' | 'b'``."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is type(None):
        return "None"
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is tuple:
        inner = (
            f"{type_name(args[0])}, ..." if len(args) == 2 and args[1] is Ellipsis else ", ".join(map(type_name, args))
        )
        return f"tuple[{inner}]"
    return getattr(hint, "__name__", str(hint))


def _hints(options_type: type[BackendOptions]) -> dict[str, Any]:
    hints = typing.get_type_hints(options_type)
    return {f.name: hints[f.name] for f in dataclasses.fields(options_type) if f.init}


def _coerce(value: Any, hint: Any) -> Any:
    """``value`` as the annotation ``hint`` wants it; text is parsed, anything else type-checked."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None or (type(None) in args and isinstance(value, str) and value.strip().lower() in _NONE):
            if type(None) in args:
                return None
            raise TypeError("None")
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg)
            except (TypeError, ValueError):
                continue
        raise TypeError(value)
    if origin is Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and str(choice) == value.strip()):
                return choice
        raise ValueError(value)
    if origin is tuple:
        return _coerce_tuple(value, args)
    return _coerce_scalar(value, hint)


def _coerce_tuple(value: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    items = [s.strip() for s in value.split(",") if s.strip()] if isinstance(value, str) else list(value)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_coerce(item, args[0]) for item in items)
    if len(items) != len(args):
        raise ValueError(f"expected {len(args)} items, got {len(items)}")
    return tuple(_coerce(item, arg) for item, arg in zip(items, args, strict=True))


def _coerce_scalar(value: Any, hint: Any) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TypeError(value)
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError(value)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise TypeError(value)
        return value
    if hint is Path:
        if not isinstance(value, str | Path):
            raise TypeError(value)
        return Path(value)
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise TypeError(f"options of type {type_name(hint)} are not supported")
