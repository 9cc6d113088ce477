"""What the server process needs around it: a backend folder with the Python backend, and its environment.

The Python backend runs each model instance in a ``triton_python_backend_stub`` process that embeds
Python. The server looks for the backend in ``<backend-directory>/python/`` (``libtriton_python.so``,
``triton_python_backend_utils.py`` and the stub side by side), and the stub:

- loads ``libpython3.X.so`` and the wheel's bundled libraries, so ``LD_LIBRARY_PATH`` holds the
  running interpreter's ``LIBDIR`` and the install's library folders, in that order, before the caller's;
- takes its Python environment (``sys.prefix``, hence ``torch`` and ``numpy``) from the first
  ``python3`` on ``PATH``, so the running interpreter's ``bin/`` goes first on ``PATH``;
- imports each model's ``model.py`` (it ignores ``PYTHONDONTWRITEBYTECODE``: the server reads a symlink
  mirror of the repository, ``mirror.py``, so serving leaves the repository untouched);
- allocates and frees tensor-sized buffers on every request: glibc is told to keep them for reuse
  (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) instead of returning them to the kernel, which
  zeroes every page again on the next request.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import signal
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..discovery import PYTHON_BACKEND_FILES, STUB_COMM, STUB_NAME, TritonInstall
from ..processes import pid_exists
from .process import proc_stat

logger = logging.getLogger(__name__)

#: glibc tuning for the server and its stubs (see ``server_environment``); 32 MB is glibc's largest mmap threshold.
MALLOC_MMAP_THRESHOLD = 32 << 20
MALLOC_TRIM_THRESHOLD = 256 << 20
#: Where POSIX shared memory (``shm_open``) lives on Linux; the Python backend keeps one region per model instance.
SHM_DIR = Path("/dev/shm")  # noqa: S108 - only read and unlinked, names with our own prefix
_SHM_PREFIX = "monai_triton_"
_PREFIX_RE = re.compile(rf"{_SHM_PREFIX}(\d+)_[0-9a-f]+_")
_FOLDER_RE = re.compile(rf"{_SHM_PREFIX}[a-z]+_(\d+)_")
#: The executable a stub's parent has when a ``tritonserver`` process (not an in-process server) runs it.
SERVER_NAME = "tritonserver"


def assemble_backend_dir(install: TritonInstall, dest: Path) -> Path:
    """Fill ``dest`` (an empty folder the caller owns) with symlinks: ``python/`` and the install's other backends.

    Returns ``dest``, for ``--backend-directory``. Without a Python backend or a stub for this
    interpreter the folder still works for other backends, and a warning says why python models will fail.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if install.backends_dir is not None:
        for entry in sorted(install.backends_dir.iterdir()):
            if entry.is_dir() and entry.name != "python":
                (dest / entry.name).symlink_to(entry, target_is_directory=True)
    if install.python_backend_dir is None or install.stub_path is None:
        logger.warning(
            "no Python backend stub for Python %d.%d in %s: models with backend 'python' will fail to load",
            sys.version_info.major,
            sys.version_info.minor,
            install.home,
        )
        return dest
    python_dir = dest / "python"
    python_dir.mkdir()
    for name in PYTHON_BACKEND_FILES:
        (python_dir / name).symlink_to(install.python_backend_dir / name)
    (python_dir / STUB_NAME).symlink_to(install.stub_path)
    return dest


def server_environment(install: TritonInstall, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the server process: ``base`` (default ``os.environ``) plus library and Python paths."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR")
    libs = [str(p) for p in ([Path(libdir)] if libdir else []) + list(install.lib_dirs)]
    env["LD_LIBRARY_PATH"] = _prepend(libs, env.get("LD_LIBRARY_PATH", ""))
    env["PATH"] = _prepend([os.path.dirname(sys.executable)], env.get("PATH", os.defpath))
    # The model's OpenMP threads (torch) would otherwise spin after each request and take the cores the
    # clients on this host need between requests (measured: the sample app's sliding window 2x slower).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # glibc hands each tensor-sized buffer back to the kernel when it is freed (mmap'd blocks; a trimmed
    # heap top), so every request's buffers came back as fresh pages that the kernel zeroes on first touch:
    # ~500 page faults per 1 MB request in the stub, a third of its time. Serve blocks up to glibc's limit
    # (32 MB) from the heap and keep up to 256 MB free there for the next request.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MALLOC_MMAP_THRESHOLD))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(MALLOC_TRIM_THRESHOLD))
    return env


def shm_prefix() -> str:
    """A ``shm-region-prefix-name`` for one server: ``monai_triton_<launcher pid>_<random>_``.

    The Python backend names its shared-memory regions ``<prefix><uuid>`` and unlinks them on a clean stop; a
    killed server leaves them behind. A prefix of our own lets the launcher remove exactly its own leftovers.
    """
    return f"{_SHM_PREFIX}{os.getpid()}_{secrets.token_hex(4)}_"


def remove_shm_regions(prefix: str) -> int:
    """Unlink the regions named ``<prefix>*``; returns how many were removed."""
    removed = 0
    for region in SHM_DIR.glob(f"{prefix}*"):
        try:
            region.unlink()
            removed += 1
        except OSError as exc:
            logger.debug("cannot remove %s: %s", region, exc)
    return removed


def remove_leftovers_of_dead_launchers() -> None:
    """What a server start clears first: the stubs, the regions, then the temporary folders of launchers that no
    longer run."""
    end_stale_stubs()
    remove_stale_shm_regions()
    remove_stale_temp_folders()


def temp_folder(kind: str) -> Path:
    """A new temporary folder ``monai_triton_<kind>_<pid>_<random>`` for one server's files: a process killed
    before it could remove it (SIGKILL, an unhandled SIGTERM) leaves it to the next start of any server."""
    return Path(tempfile.mkdtemp(prefix=f"{_SHM_PREFIX}{kind}_{os.getpid()}_"))


def remove_stale_temp_folders() -> int:
    """Remove the :func:`temp_folder` folders of processes that no longer run; returns how many."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{_SHM_PREFIX}*_*_*"):
        match = _FOLDER_RE.match(folder.name)
        if match and folder.is_dir() and _gone(int(match.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    if removed:
        logger.info("removed %d temporary folders of dead processes", removed)
    return removed


def remove_stale_shm_regions() -> int:
    """Unlink regions left by launchers that no longer run (a server killed with its parent cannot clean up)."""
    removed = 0
    for region in SHM_DIR.glob(f"{_SHM_PREFIX}*_*_*"):
        launcher = _launcher_pid(region.name)
        if launcher is not None and _gone(launcher):
            removed += remove_shm_regions(region.name)
    if removed:
        logger.info("removed %d shared-memory regions left by tritonservers of dead processes", removed)
    return removed


def end_stale_stubs() -> list[int]:
    """SIGKILL the Python-backend stubs of launchers that no longer run; returns their pids.

    A stub whose parent dies notices within ~300 ms and exits, unless it is blocked: one was seen deadlocked
    on a futex for 18 minutes after its app was killed (a mutex in shared memory that the dead app held),
    holding the app's output pipes and its region. Its region name carries our prefix with the launcher's
    pid (:func:`shm_prefix`). A stub whose parent is a ``tritonserver`` is left alone: that server still
    runs and answers for its stubs, whoever started it.
    """
    ended = []
    for pid, argv in _stub_processes():
        launchers = {launcher for launcher in map(_launcher_pid, argv) if launcher is not None}
        if not launchers or not all(map(_gone, launchers)) or _parent_name(pid) == SERVER_NAME:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        ended.append(pid)
    if ended:
        logger.warning("ended %d Python-backend stub(s) left running by dead processes: pids %s", len(ended), ended)
    return ended


def _launcher_pid(name: str) -> int | None:
    """The launcher pid in ``monai_triton_<pid>_<token>_...`` (a region name), else None."""
    match = _PREFIX_RE.match(name)
    return int(match.group(1)) if match else None


def _gone(launcher: int) -> bool:
    """Whether the process that named a region or stub no longer runs (never this one)."""
    return launcher != os.getpid() and not pid_exists(launcher)


def _stub_processes() -> list[tuple[int, list[str]]]:
    """``(pid, argv)`` of every Python-backend stub on this host that this process can see."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != STUB_COMM:
                continue
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        found.append((int(entry), argv))
    return found


def _parent_name(pid: int) -> str | None:
    """The executable name of ``pid``'s parent, else None (either one gone)."""
    stat = proc_stat(pid)
    parent = proc_stat(int(stat[1][1])) if stat is not None else None
    return parent[0] if parent is not None else None


def _prepend(first: list[str], rest: str) -> str:
    """``first`` then the entries of the ``:``-separated ``rest``, without duplicates or empty entries."""
    seen: list[str] = []
    for entry in first + rest.split(os.pathsep):
        if entry and entry not in seen:
            seen.append(entry)
    return os.pathsep.join(seen)
