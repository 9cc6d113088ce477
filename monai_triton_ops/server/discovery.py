"""Find a ``tritonserver`` installation: an explicit path, ``TRITONSERVER_HOME``, or the nvidia-pytriton wheel.

The first one given wins and a bad one is an error, never a silent fall-through to the next: a user
who points at a server must get that server or be told why not.

Two layouts are understood::

    nvidia-pytriton wheel (site-packages)            Triton install (NGC container, /opt/tritonserver)
    pytriton/tritonserver/bin/tritonserver           bin/tritonserver
    pytriton/tritonserver/backends/python/           backends/python/  (stub included)
    pytriton/tritonserver/python_backend_stubs/X.Y/  lib/
    nvidia_pytriton.libs/
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ServerNotFoundError

logger = logging.getLogger(__name__)

#: Environment variable naming a Triton install folder (the one holding ``bin/tritonserver``).
HOME_ENV = "TRITONSERVER_HOME"
#: How to get a server when there is none.
INSTALL_HINT = (
    "install the Triton server shipped in a wheel with `pip install --no-deps nvidia-pytriton==0.7.0`, "
    f"or set {HOME_ENV} to a Triton install folder (holding bin/tritonserver), or pass server_path"
)
STUB_NAME = "triton_python_backend_stub"
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
