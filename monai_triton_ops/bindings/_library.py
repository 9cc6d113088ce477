"""Load ``libtritonserver`` once per process, give it the declarations of ``declarations.py``, and turn its errors
into exceptions.

Every function returning ``TRITONSERVER_Error*`` gets an ``errcheck`` that turns the error into the exception of
its code (``error.py``'s classes, chosen by code, never by message) and deletes it. ``ctypes.CDLL`` releases the
GIL for the duration of each call, so long calls (server stop, model load) never block Triton's threads that call
back into Python.

The wheel bundles the server's dependencies next to it under mangled names without an ``RPATH`` covering
them all; the loader preloads each missing one from the install's library folders before retrying. It also
opens the install's backends once the same way: their ``$ORIGIN`` paths do not resolve from the symlinked
backend folder a server is given, and a library already loaded is found by its name.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from ctypes import c_uint32, c_void_p
from pathlib import Path
from typing import Any, NoReturn

from ..discovery import TritonLibrary, find_triton_library
from .declarations import API_VERSION, DECLARATIONS, ERR
from .enums import TRITONSERVER_Error_Code
from .error import CODE_STRINGS, TritonError, TritonLibraryError, error_class

logger = logging.getLogger(__name__)

_MISSING_LIB = re.compile(r"^(?P<name>[^:\s]+): cannot open shared object file")
_MAX_PRELOADS = 100


class _State:
    lock = threading.Lock()
    cdll: ctypes.CDLL | None = None
    library: TritonLibrary | None = None
    preloaded: list[ctypes.CDLL] = []  # noqa: RUF012 - kept alive for the life of the process


def load_library(path: str | os.PathLike[str] | None = None) -> TritonLibrary:
    """Load ``libtritonserver`` (found as :func:`~monai_triton_ops.discovery.find_triton_library` says)
    and check its API version; idempotent. Returns what was loaded.

    Raises:
        ServerNotFoundError: no library where it was looked for (the message says how to install one).
        TritonLibraryError: it cannot be loaded, its API version does not match these declarations, or a
            different library is already loaded in this process.
    """
    with _State.lock:
        if _State.library is not None:
            if path is not None and find_triton_library(path).path != _State.library.path:
                raise TritonLibraryError(
                    f"libtritonserver is already loaded from {_State.library.path}; one process holds one library"
                )
            return _State.library
        library = find_triton_library(path)
        cdll = _dlopen(library, library.path)
        _declare(cdll)
        check_api_version(*_api_version(cdll), path=str(library.path))
        for backend in _backend_libraries(library):
            _State.preloaded.append(_dlopen(library, backend))
        _State.cdll, _State.library = cdll, library
        logger.info("loaded %s (from %s)", library.path, library.source)
        return library


def lib() -> Any:
    """The loaded library (loading the default one on first use); its attributes are the declared functions."""
    cdll = _State.cdll
    if cdll is None:
        load_library()
        cdll = _State.cdll
    return cdll


def loaded_library() -> TritonLibrary | None:
    """What :func:`load_library` loaded, or ``None`` before."""
    return _State.library


def check_api_version(major: int, minor: int, *, path: str = "libtritonserver") -> None:
    """Refuse a library whose API major differs from the declarations', or whose minor is older."""
    want_major, want_minor = API_VERSION
    if major != want_major or minor < want_minor:
        raise TritonLibraryError(
            f"{path} implements Triton server C API {major}.{minor}; this binding is declared against "
            f"{want_major}.{want_minor} and needs major {want_major} with minor >= {want_minor}"
        )


def _api_version(cdll: ctypes.CDLL) -> tuple[int, int]:
    major, minor = c_uint32(), c_uint32()
    cdll.TRITONSERVER_ApiVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _backend_libraries(library: TritonLibrary) -> list[Path]:
    backends = library.install.backends_dir if library.install is not None else None
    return sorted(backends.glob("*/libtriton_*.so")) if backends is not None else []


def _dlopen(library: TritonLibrary, path: Path) -> ctypes.CDLL:
    """Open ``path``, preloading (``RTLD_GLOBAL``) dependencies the loader cannot find by itself."""
    for _ in range(_MAX_PRELOADS):
        try:
            return ctypes.CDLL(os.fspath(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            _preload_missing(library, path, exc)
    raise TritonLibraryError(f"cannot load {path}: too many missing dependencies")


def _preload_missing(library: TritonLibrary, path: Path, exc: OSError) -> None:
    """Load the library named in ``exc`` from the install's folders, recursing into its own missing ones."""
    error: OSError = exc
    for _ in range(_MAX_PRELOADS):
        match = _MISSING_LIB.match(str(error))
        candidates = [d / match.group("name") for d in library.lib_dirs] if match else []
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise TritonLibraryError(f"cannot load {path}: {exc}") from exc
        try:
            _State.preloaded.append(ctypes.CDLL(os.fspath(found), mode=ctypes.RTLD_GLOBAL))
            return
        except OSError as deeper:
            error = deeper
    raise TritonLibraryError(f"cannot load {path}: {exc}") from exc


def _declare(cdll: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in DECLARATIONS.items():
        try:
            function = getattr(cdll, name)
        except AttributeError as exc:
            raise TritonLibraryError(f"{name} is missing from the Triton library: {exc}") from exc
        function.argtypes = argtypes
        if restype is ERR:
            function.restype = c_void_p
            function.errcheck = _errcheck
        else:
            function.restype = restype


def _errcheck(result: int | None, function: Any, arguments: tuple[Any, ...]) -> None:
    """``errcheck`` of every ``TRITONSERVER_Error*`` function: raise (and delete) a returned error."""
    if result:
        raise_error(result, owned=True)


# -- TRITONSERVER_Error* <-> exceptions ------------------------------------------------------------------
def read_error(error: int, *, owned: bool) -> TritonError:
    """The exception for ``error`` (a ``TRITONSERVER_Error*``); deletes it when the caller owns it."""
    library = lib()
    try:
        code = int(library.TRITONSERVER_ErrorCode(error))
        message = (library.TRITONSERVER_ErrorMessage(error) or b"").decode(errors="replace")
        code_string = (library.TRITONSERVER_ErrorCodeString(error) or b"").decode(errors="replace")
    finally:
        if owned:
            library.TRITONSERVER_ErrorDelete(error)
    cls = error_class(code)
    CODE_STRINGS.setdefault(cls.code, code_string)
    return cls(message)


def raise_error(error: int, *, owned: bool, cause: BaseException | None = None) -> NoReturn:
    """Raise the exception for ``error``, chained to ``cause`` (an exception a callback raised) if given."""
    raise read_error(error, owned=owned) from cause


def new_error(exc: BaseException) -> int:
    """A new ``TRITONSERVER_Error*`` describing ``exc``, for a callback to return to Triton (which deletes it)."""
    code = exc.code if isinstance(exc, TritonError) else TRITONSERVER_Error_Code.UNKNOWN
    message = f"{type(exc).__name__}: {exc}".encode(errors="replace")
    return int(lib().TRITONSERVER_ErrorNew(int(code), message))
