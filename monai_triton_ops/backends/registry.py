"""Backend spec string -> backend instance.

A spec names where the model runs, chosen at run time (command line, environment, app default):

    torch                       in-process TorchScript (default)
    torch?device=cuda           options ride in the query string, typed by the backend's keywords
    triton                      in-process Triton server (C API)            -- reserved
    grpc://HOST:PORT            remote Triton over gRPC (grpcs:// for TLS)  -- reserved
    http://HOST:PORT            remote Triton over HTTP (https:// for TLS)  -- reserved

Backends are imported lazily (``"module:Class"`` strings), so an app that runs TorchScript never
imports a remote client or the Triton core (reading a ``config.pbtxt`` uses only tritonclient's
protobuf model). Third parties add schemes with ``register_backend`` or the entry point group
``monai_triton_ops.backends``; an existing scheme is never silently replaced.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ..errors import BackendSpecError, BackendUnavailableError, ConfigError
from .base import BaseBackend

ENTRY_POINT_GROUP = "monai_triton_ops.backends"
DEFAULT_BACKEND = "torch"


@dataclass(frozen=True, kw_only=True)
class BackendEntry:
    """Where a scheme's backend class lives, or why it cannot be used yet."""

    target: str | None  # "package.module:Class"; None while the backend is reserved
    hint: str = ""  # how to make it available (install command or planned work)


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """A parsed spec string: the scheme, the server URL for remote schemes, and typed-later options."""

    scheme: str
    url: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)


_REMOTE_HINT = "remote Triton backends are planned and not built yet; serve models today with 'monai-triton serve'"
_registry: dict[str, BackendEntry] = {
    "torch": BackendEntry(target="monai_triton_ops.backends.torchscript:TorchScriptBackend"),
    "triton": BackendEntry(target=None, hint="the in-process Triton backend is planned and not built yet"),
    "grpc": BackendEntry(target=None, hint=_REMOTE_HINT),
    "grpcs": BackendEntry(target=None, hint=_REMOTE_HINT),
    "http": BackendEntry(target=None, hint=_REMOTE_HINT),
    "https": BackendEntry(target=None, hint=_REMOTE_HINT),
}
_entry_points_loaded = False


def available_backends() -> Mapping[str, BackendEntry]:
    """A read-only view of every known scheme, reserved ones included."""
    _load_entry_points()
    return MappingProxyType(_registry)


def register_backend(scheme: str, target: str | type[BaseBackend], *, hint: str = "", clobber: bool = False) -> None:
    """Make ``scheme`` create ``target`` (a class or a ``"module:Class"`` string).

    Replacing a scheme that already has a backend needs ``clobber=True``; filling a reserved one
    does not.
    """
    if not scheme.isidentifier():
        raise BackendSpecError(f"backend scheme {scheme!r} must be an identifier")
    current = _registry.get(scheme)
    if current is not None and current.target is not None and not clobber:
        raise BackendSpecError(f"backend scheme {scheme!r} is already registered to {current.target}")
    if isinstance(target, type):
        target = f"{target.__module__}:{target.__qualname__}"
    _registry[scheme] = BackendEntry(target=target, hint=hint)


def parse_backend_spec(spec: str) -> BackendSpec:
    """Split a spec string into scheme, server URL and query options."""
    text = spec.strip()
    if not text:
        raise BackendSpecError("empty backend spec; expected one of: " + _known())
    parts = urlsplit(text)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "://" not in text:
        scheme = text.split("?", 1)[0].lower()
        _entry(scheme, spec)
        return BackendSpec(scheme=scheme, options=options)
    scheme = parts.scheme.lower()
    _entry(scheme, spec)
    try:
        port = parts.port
    except ValueError as exc:
        raise BackendSpecError(f"backend spec {spec!r}: invalid port") from exc
    if not parts.hostname or port is None:
        raise BackendSpecError(f"backend spec {spec!r}: expected {scheme}://HOST:PORT")
    return BackendSpec(scheme=scheme, url=f"{scheme}://{parts.netloc}", options=options)


def create_backend(
    spec: str | None,
    model_repository: str | Path | None,
    model_name: str,
    *,
    version: int | None = None,
    **options: Any,
) -> BaseBackend:
    """Create (not open) the backend that ``spec`` names for one model.

    ``model_repository`` is the local repository folder (``<repo>/<name>/<version>/model.pt``);
    remote backends may pass ``None``. Keyword ``options`` override those in the spec's query.
    """
    parsed = parse_backend_spec(spec or DEFAULT_BACKEND)
    cls = _load(parsed.scheme, spec or DEFAULT_BACKEND)
    merged = {**_typed_options(cls, parsed.options, spec or DEFAULT_BACKEND), **options}
    _check_options(cls, merged, parsed.scheme)
    if parsed.url is not None:
        merged.setdefault("url", parsed.url)
    factory: Callable[..., BaseBackend] = cls  # subclasses add keyword-only options of their own
    return factory(model_repository=model_repository, model_name=model_name, version=version, **merged)


def _known() -> str:
    return ", ".join(f"{s}://HOST:PORT" if s in {"grpc", "grpcs", "http", "https"} else s for s in _registry)


def _entry(scheme: str, spec: str) -> BackendEntry:
    _load_entry_points()
    if scheme not in _registry:
        raise BackendSpecError(f"unknown backend spec {spec!r}; expected one of: {_known()}")
    return _registry[scheme]


def _load(scheme: str, spec: str) -> type[BaseBackend]:
    entry = _entry(scheme, spec)
    if entry.target is None:
        raise BackendUnavailableError(f"backend {spec!r} is not available yet: {entry.hint}")
    module_name, _, class_name = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; {entry.hint}" if entry.hint else ""
        raise BackendUnavailableError(f"backend {spec!r} cannot be imported ({exc}){hint}") from exc
    cls = getattr(module, class_name)
    if not (isinstance(cls, type) and issubclass(cls, BaseBackend)):
        raise BackendSpecError(f"backend {spec!r}: {entry.target} is not a BaseBackend subclass")
    return cls


def _keywords(cls: type[BaseBackend]) -> dict[str, inspect.Parameter]:
    params = inspect.signature(cls.__init__).parameters
    return {n: p for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _check_options(cls: type[BaseBackend], options: Mapping[str, Any], scheme: str) -> None:
    accepted = set(_keywords(cls)) - {"model_repository", "model_name", "version", "url"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(f"backend {scheme!r} has no option(s) {unknown}; accepted: {sorted(accepted)}")


def _typed_options(cls: type[BaseBackend], raw: Mapping[str, str], spec: str) -> dict[str, Any]:
    """Convert query-string values to the type of each keyword's default (int, float, bool, str)."""
    keywords = _keywords(cls)
    typed: dict[str, Any] = {}
    for name, text in raw.items():
        param = keywords.get(name)
        default = None if param is None else param.default
        try:
            typed[name] = _convert(text, default)
        except ValueError as exc:
            raise ConfigError(
                f"backend spec {spec!r}: option {name}={text!r} is not a {type(default).__name__}"
            ) from exc
    return typed


def _convert(text: str, default: Any) -> Any:
    if isinstance(default, bool):
        if text.lower() not in {"1", "0", "true", "false", "yes", "no"}:
            raise ValueError(text)
        return text.lower() in {"1", "true", "yes"}
    if isinstance(default, int | float):
        return type(default)(text)
    return text


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _registry or _registry[ep.name].target is None:
            _registry[ep.name] = BackendEntry(target=ep.value)
