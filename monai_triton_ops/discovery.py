"""Find a Triton installation: the ``tritonserver`` executable (local server) or ``libtritonserver.so`` (in-process).

The first location given wins and a bad one is an error, never a silent fall-through to the next: a
user who points at a server must get that server or be told why not. Both searches share the wheel
and install layouts below, so the local server and the in-process binding always agree::

    executable:  server_path > $TRITONSERVER_HOME > nvidia-pytriton wheel
    library:     path > $TRITONSERVER_LIB > $TRITONSERVER_HOME/lib > /opt/tritonserver/lib > nvidia-pytriton wheel

Two layouts are understood::

    nvidia-pytriton wheel (site-packages)            Triton install (NGC container, /opt/tritonserver)
    pytriton/tritonserver/bin/tritonserver           bin/tritonserver
    pytriton/tritonserver/backends/python/           backends/python/  (stub included)
    pytriton/tritonserver/python_backend_stubs/X.Y/  lib/libtritonserver.so
    nvidia_pytriton.libs/libtritonserver-<hash>.so
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ServerNotFoundError

logger = logging.getLogger(__name__)

#: Environment variable naming a Triton install folder (the one holding ``bin/tritonserver``).
HOME_ENV = "TRITONSERVER_HOME"
#: Environment variable naming ``libtritonserver.so`` itself.
LIB_ENV = "TRITONSERVER_LIB"
#: Where the NGC images install Triton.
SYSTEM_HOME = Path("/opt/tritonserver")
#: How to get a server when there is none.
INSTALL_HINT = (
    "install the Triton server shipped in a wheel with `pip install --no-deps nvidia-pytriton==0.7.0`, "
    f"or set {HOME_ENV} to a Triton install folder (holding bin/tritonserver), or pass server_path"
)
#: How to get the library when there is none.
LIBRARY_HINT = (
    "install the Triton library shipped in a wheel with `pip install --no-deps nvidia-pytriton==0.7.0`, "
    f"or set {HOME_ENV} to a Triton install folder (holding lib/libtritonserver.so), "
    f"or set {LIB_ENV} to the library file"
)
_LIB_GLOB = "libtritonserver*.so*"
STUB_NAME = "triton_python_backend_stub"
#: The stub's name in ``/proc/<pid>/comm`` and ``stat``: the kernel keeps an executable's first 15 characters.
STUB_COMM = STUB_NAME[:15]
PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")


@dataclass(frozen=True, kw_only=True)
class TritonInstall:
    """The files of one Triton installation that the launcher needs."""

    server_path: Path
    """The ``tritonserver`` executable."""
    home: Path
    """The folder above ``bin/``."""
    source: str
    """Where it was found: ``"server_path"``, ``"TRITONSERVER_HOME"`` or ``"nvidia-pytriton"``."""
    lib_dirs: tuple[Path, ...] = ()
    """Folders of shared libraries the server, its backends and the Python stub load."""
    backends_dir: Path | None = None
    """The install's own ``backends/`` folder, if any."""
    python_backend_dir: Path | None = None
    """The folder holding ``libtriton_python.so`` and ``triton_python_backend_utils.py``, if any."""
    stub_path: Path | None = None
    """The Python backend stub built for the running interpreter's version, if any."""


def find_tritonserver(
    server_path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> TritonInstall:
    """Locate ``tritonserver``: ``server_path`` (binary or home folder), then ``$TRITONSERVER_HOME``, then the wheel.

    Raises:
        ServerNotFoundError: the chosen location holds no executable server, or none was found; the message
            says how to install one.
    """
    env = os.environ if environ is None else environ
    if server_path is not None:
        return _from_path(Path(server_path).expanduser(), source="server_path")
    home = env.get(HOME_ENV)
    if home:
        return _from_path(Path(home).expanduser(), source=HOME_ENV)
    wheel_home = _wheel_home()
    if wheel_home is None:
        raise ServerNotFoundError(f"no tritonserver found: the nvidia-pytriton wheel is not installed; {INSTALL_HINT}")
    return _from_path(wheel_home, source="nvidia-pytriton")


def _wheel_home() -> Path | None:
    """``site-packages/pytriton/tritonserver`` without importing ``pytriton`` (its imports need extra packages)."""
    try:
        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def _from_path(path: Path, *, source: str) -> TritonInstall:
    binary = path / "bin" / "tritonserver" if path.is_dir() else path
    if not binary.is_file():
        raise ServerNotFoundError(f"no tritonserver executable at {str(binary)!r} (from {source}); {INSTALL_HINT}")
    if not os.access(binary, os.X_OK):
        raise ServerNotFoundError(f"{str(binary)!r} (from {source}) is not executable; {INSTALL_HINT}")
    binary = binary.resolve()
    home = binary.parent.parent if binary.parent.name == "bin" else binary.parent
    python_dir = home / "backends" / "python"
    has_python = all((python_dir / name).is_file() for name in PYTHON_BACKEND_FILES)
    install = TritonInstall(
        server_path=binary,
        home=home,
        source=source,
        lib_dirs=tuple(d for d in (home / "lib", home.parent.parent / "nvidia_pytriton.libs") if d.is_dir()),
        backends_dir=home / "backends" if (home / "backends").is_dir() else None,
        python_backend_dir=python_dir if has_python else None,
        stub_path=_find_stub(home, python_dir) if has_python else None,
    )
    logger.debug("tritonserver found (%s): %s", source, install)
    return install


def _find_stub(home: Path, python_dir: Path) -> Path | None:
    """The stub for this interpreter: the wheel keeps one per Python version, an install one next to the backend."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (home / "python_backend_stubs" / version / STUB_NAME, python_dir / STUB_NAME):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass(frozen=True, kw_only=True)
class TritonLibrary:
    """``libtritonserver.so`` and what loading it in-process needs."""

    path: Path
    """The shared library file."""
    source: str
    """Where it was found: ``"path"``, ``"TRITONSERVER_LIB"``, ``"TRITONSERVER_HOME"``, ``"/opt/tritonserver"``
    or ``"nvidia-pytriton"``."""
    lib_dirs: tuple[Path, ...]
    """Folders holding the libraries it needs (the wheel bundles them next to it under mangled names)."""
    install: TritonInstall | None
    """The installation around it (backends, Python stub), when it sits in one."""


def find_triton_library(
    path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> TritonLibrary:
    """Locate ``libtritonserver.so``: ``path`` (file or folder), ``$TRITONSERVER_LIB``, ``$TRITONSERVER_HOME/lib``,
    ``/opt/tritonserver/lib``, then the nvidia-pytriton wheel.

    Raises:
        ServerNotFoundError: the chosen location holds no library, or none was found; the message says how
            to install one.
    """
    env = os.environ if environ is None else environ
    if path is not None:
        return _library_at(Path(path).expanduser(), source="path")
    if env.get(LIB_ENV):
        return _library_at(Path(env[LIB_ENV]).expanduser(), source=LIB_ENV)
    if env.get(HOME_ENV):
        return _library_at(Path(env[HOME_ENV]).expanduser() / "lib", source=HOME_ENV)
    if (SYSTEM_HOME / "lib").is_dir() and _library_files(SYSTEM_HOME / "lib"):
        return _library_at(SYSTEM_HOME / "lib", source=str(SYSTEM_HOME))
    wheel_home = _wheel_home()
    wheel_libs = wheel_home.parent.parent / "nvidia_pytriton.libs" if wheel_home is not None else None
    if wheel_libs is None or not wheel_libs.is_dir():
        raise ServerNotFoundError(
            f"no libtritonserver found: the nvidia-pytriton wheel is not installed; {LIBRARY_HINT}"
        )
    return _library_at(wheel_libs, source="nvidia-pytriton")


def _library_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob(_LIB_GLOB) if p.is_file())


def _library_at(path: Path, *, source: str) -> TritonLibrary:
    """The library at ``path`` (the file, or the one ``libtritonserver*.so`` in a folder) and its surroundings."""
    if path.is_dir():
        found = _library_files(path)
        if not found:
            raise ServerNotFoundError(f"no libtritonserver*.so in {str(path)!r} (from {source}); {LIBRARY_HINT}")
        path = found[0]
    if not path.is_file():
        raise ServerNotFoundError(f"no libtritonserver library at {str(path)!r} (from {source}); {LIBRARY_HINT}")
    path = path.resolve()
    install = _install_around(path, source=source)
    lib_dirs = [path.parent, *(install.lib_dirs if install is not None else ())]
    library = TritonLibrary(path=path, source=source, lib_dirs=tuple(dict.fromkeys(lib_dirs)), install=install)
    logger.debug("libtritonserver found (%s): %s", source, library)
    return library


def _install_around(library: Path, *, source: str) -> TritonInstall | None:
    """The install holding ``library``: ``<home>/lib/`` (NGC) or the wheel's ``nvidia_pytriton.libs/``."""
    if library.parent.name == "nvidia_pytriton.libs":
        home = library.parent.parent / "pytriton" / "tritonserver"
    elif library.parent.name == "lib":
        home = library.parent.parent
    else:
        return None
    try:
        return _from_path(home, source=source)
    except ServerNotFoundError:
        return None
