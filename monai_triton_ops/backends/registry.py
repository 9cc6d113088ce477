"""Backend spec string -> backend instance.

A spec names where the model runs, chosen at run time (command line, environment, app default):

    torch                           in-process TorchScript (default)
    torch?device=cuda               options ride in the query string, typed by the backend's options
    onnx?intra_op_threads=2         in-process ONNX Runtime (model.onnx)
    triton                          in-process Triton server (C API)
    grpc://HOST:PORT                remote Triton over gRPC (grpcs:// for TLS)
    grpc://H1:8001,H2:8001          several servers (failover)
    http://HOST:PORT?timeout_s=3    remote Triton over HTTP (https:// for TLS)

Backends are imported lazily (``"module:Class"`` strings), so an app that runs TorchScript never
imports a remote client or the Triton core. Each entry says whether its scheme takes server URLs,
so no scheme list is hard-coded. Third parties add schemes with ``register_backend`` or the entry
point group ``monai_triton_ops.backends``; an existing scheme is never silently replaced.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ..errors import BackendSpecError, BackendUnavailableError
from .base import Availability as Availability
from .base import BaseBackend
from .options import parse_options

ENTRY_POINT_GROUP = "monai_triton_ops.backends"
DEFAULT_BACKEND = "torch"


@dataclass(frozen=True, kw_only=True)
class BackendEntry:
    """Where a scheme's backend class lives, whether it takes server URLs, and how to install it."""

    target: str  # "package.module:Class", imported on first use
    hint: str = ""  # how to make it available when the import fails
    takes_urls: bool = False  # "scheme://HOST:PORT[,HOST:PORT...]" rather than a bare "scheme"


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """A parsed spec string: the scheme, its server URLs (remote schemes), and its raw query options."""

    scheme: str
    urls: tuple[str, ...] = ()
    options: Mapping[str, str] = field(default_factory=dict)


_REMOTE = "monai_triton_ops.backends.remote.backend:RemoteBackend"
_REMOTE_HINT = "the remote backend needs tritonclient: pip install 'tritonclient[grpc,http]'"
_registry: dict[str, BackendEntry] = {
    "torch": BackendEntry(target="monai_triton_ops.backends.torchscript:TorchScriptBackend"),
    "onnx": BackendEntry(target="monai_triton_ops.backends.onnx:OnnxBackend", hint="pip install onnxruntime onnx"),
    "triton": BackendEntry(
        target="monai_triton_ops.backends.inprocess.backend:InProcessBackend",
        hint="the in-process backend needs the Triton server library: pip install --no-deps nvidia-pytriton==0.7.0, "
        "or set TRITONSERVER_HOME to a Triton install",
    ),
    **{s: BackendEntry(target=_REMOTE, hint=_REMOTE_HINT, takes_urls=True) for s in ("grpc", "grpcs", "http", "https")},
}
_entry_points_loaded = False


def available_backends() -> Mapping[str, BackendEntry]:
    """A read-only view of every known scheme."""
    _load_entry_points()
    return MappingProxyType(_registry)


def is_installed(scheme: str) -> bool:
    """Whether ``scheme``'s backend class imports here (its module is built and its packages present)."""
    try:
        _load(scheme, scheme)
    except (BackendUnavailableError, BackendSpecError):
        return False
    return True


def backend_availability(scheme: str) -> Availability:
    """Whether ``scheme``'s backend can run here and why not: its import, then what the backend itself checks."""
    try:
        cls = _load(scheme, scheme)
    except (BackendUnavailableError, BackendSpecError) as exc:
        return Availability(False, str(exc))
    return cls.availability(scheme)


def register_backend(
    scheme: str, target: str | type[BaseBackend], *, hint: str = "", takes_urls: bool = False, clobber: bool = False
) -> None:
    """Make ``scheme`` create ``target`` (a class or a ``"module:Class"`` string).

    Replacing a scheme that already has a backend needs ``clobber=True``.
    """
    if not scheme.isidentifier():
        raise BackendSpecError(f"backend scheme {scheme!r} must be an identifier")
    current = _registry.get(scheme)
    if current is not None and not clobber:
        raise BackendSpecError(f"backend scheme {scheme!r} is already registered to {current.target}")
    if isinstance(target, type):
        target = f"{target.__module__}:{target.__qualname__}"
    _registry[scheme] = BackendEntry(target=target, hint=hint, takes_urls=takes_urls)


def parse_backend_spec(spec: str) -> BackendSpec:
    """Split a spec string into scheme, server URLs and query options."""
    text = spec.strip()
    if not text:
        raise BackendSpecError("empty backend spec; expected one of: " + _known())
    head, _, query = text.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    scheme, sep, hosts = head.partition("://")
    scheme = scheme.lower()
    entry = _entry(scheme, spec)
    if not sep:
        if entry.takes_urls:
            raise BackendSpecError(f"backend spec {spec!r}: expected {scheme}://HOST:PORT")
        return BackendSpec(scheme=scheme, options=options)
    if not entry.takes_urls:
        raise BackendSpecError(f"backend spec {spec!r}: backend {scheme!r} takes no server URL; write {scheme!r}")
    urls = tuple(_url(scheme, host, spec) for host in hosts.rstrip("/").split(","))
    return BackendSpec(scheme=scheme, urls=urls, options=options)


def backend_class(spec: str) -> type[BaseBackend]:
    """The backend class a spec (or a bare scheme) names; ``BackendUnavailableError`` says why it cannot load."""
    scheme = parse_backend_spec(spec).scheme if "://" in spec or "?" in spec else spec.strip().lower()
    return _load(scheme, spec)


def create_backend(
    spec: str | None,
    model_name: str,
    *,
    model_repository: str | Path | None = None,
    version: int | None = None,
    **options: Any,
) -> BaseBackend:
    """Create (not open) the backend that ``spec`` names (default ``torch``) for one model.

    ``model_repository`` is the local repository folder (``<repo>/<name>/<version>/model.pt``);
    remote backends need none. Keyword ``options`` override those in the spec's query; both are
    typed and checked against the backend's options dataclass.
    """
    text = spec or DEFAULT_BACKEND
    parsed = parse_backend_spec(text)
    cls = _load(parsed.scheme, text)
    typed = parse_options(cls.options_type, {**parsed.options, **options}, backend=parsed.scheme)
    return cls(model_name, model_repository=model_repository, version=version, urls=parsed.urls, options=typed)


def _url(scheme: str, host: str, spec: str) -> str:
    parts = urlsplit(f"{scheme}://{host.strip()}")
    try:
        port = parts.port
    except ValueError as exc:
        raise BackendSpecError(f"backend spec {spec!r}: invalid port in {host!r}") from exc
    if not parts.hostname or port is None or parts.path:
        raise BackendSpecError(f"backend spec {spec!r}: expected {scheme}://HOST:PORT[,HOST:PORT...], got {host!r}")
    return f"{scheme}://{parts.netloc}"


def _known() -> str:
    _load_entry_points()
    return ", ".join(f"{s}://HOST:PORT" if e.takes_urls else s for s, e in _registry.items())


def _entry(scheme: str, spec: str) -> BackendEntry:
    _load_entry_points()
    if scheme not in _registry:
        raise BackendSpecError(f"unknown backend spec {spec!r}; expected one of: {_known()}")
    return _registry[scheme]


def _load(scheme: str, spec: str) -> type[BaseBackend]:
    entry = _entry(scheme, spec)
    module_name, _, class_name = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if _is_own_missing_module(exc.name, module_name):
            raise BackendUnavailableError(
                f"backend {spec!r} is not available yet: {entry.target} is not part of this installation"
            ) from exc
        hint = f"; {entry.hint}" if entry.hint else ""
        raise BackendUnavailableError(f"backend {spec!r} cannot be imported ({exc}){hint}") from exc
    except ImportError as exc:
        hint = f"; {entry.hint}" if entry.hint else ""
        raise BackendUnavailableError(f"backend {spec!r} cannot be imported ({exc}){hint}") from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseBackend)):
        raise BackendSpecError(f"backend {spec!r}: {entry.target} is not a BaseBackend subclass")
    return cls


def _is_own_missing_module(missing: str | None, module_name: str) -> bool:
    """The target itself (a module of this package not built in this installation) is what is missing."""
    if not missing or not missing.startswith("monai_triton_ops."):
        return False
    return module_name == missing or module_name.startswith(f"{missing}.")


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _registry.setdefault(ep.name, BackendEntry(target=ep.value))
