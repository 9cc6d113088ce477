"""Can the Python backend's stub start here? Asked before a server starts, in milliseconds, without starting it.

The stub (``triton_python_backend_stub``) embeds Python: it links ``libpython3.X.so.1.0``, which Debian's
``python3`` package does not ship (it is ``libpython3.X``) and a fresh container often lacks. A stub that
cannot link exits at once, and Triton 2.51 then waits for it forever: the model load never ends (an app
hung 590 s until it was killed). So the dynamic loader itself is asked what the stub would load, in the
environment the server hands it (``LD_TRACE_LOADED_OBJECTS``, the mechanism ``ldd`` uses, without needing
``ldd``): every ``not found`` is a stub that cannot start.

:func:`stub_problem` is the one check, shared by ``LocalTritonServer``, the in-process server and an
app's preflight; the server log scanner (``logs.stub_failure``) is the backstop for what only shows at run
time.
"""

from __future__ import annotations

import logging
import re
import struct
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .discovery import TritonInstall

logger = logging.getLogger(__name__)

#: The loader answers in milliseconds; this only bounds a machine that is badly overloaded.
CHECK_TIMEOUT_S = 10.0
_PT_INTERP = 3
_PYTHON_BACKEND = re.compile(r'^\s*backend\s*:\s*"python"', re.MULTILINE)


def stub_problem(install: TritonInstall, env: Mapping[str, str]) -> str | None:
    """One line saying why the install's Python stub cannot start with ``env``, or ``None`` when it can.

    ``env`` is the server's environment (``environment.server_environment``), which the stub inherits.
    An install without a stub for this Python is not a problem here (``assemble_backend_dir`` warns).
    """
    stub = install.stub_path
    if stub is None:
        return None
    missing = unresolved_libraries(stub, env)
    if not missing:
        return None
    hint = ""
    if any(name.startswith("libpython") for name in missing):
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        hint = (
            f"; install the Python {version} shared library (Debian/Ubuntu: apt-get install libpython{version}), "
            "use a Python built with --enable-shared, or put the folder holding it on LD_LIBRARY_PATH"
        )
    return f"the Python backend stub {str(stub)!r} cannot start: {', '.join(missing)} not found{hint}"


def python_models(repository: Path) -> list[str]:
    """Names of the models in ``repository`` whose ``config.pbtxt`` runs them on the Python backend."""
    found = []
    for config in sorted(repository.glob("*/config.pbtxt")):
        try:
            if _PYTHON_BACKEND.search(config.read_text(encoding="utf-8", errors="replace")):
                found.append(config.parent.name)
        except OSError:  # unreadable: the server reports it with its own words
            continue
    return found


def unresolved_libraries(executable: Path, env: Mapping[str, str]) -> list[str]:
    """The shared libraries (and symbol versions) the dynamic loader cannot find for ``executable`` with ``env``.

    Empty for a program that is not dynamically linked: only the loader honours the trace variable, and a
    static program would simply run.
    """
    if not _dynamically_linked(executable):
        return []
    try:
        result = subprocess.run(  # our own stub, an argv list, no shell
            [str(executable)],
            env={**env, "LD_TRACE_LOADED_OBJECTS": "1"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("cannot ask the loader about %s: %s", executable, exc)
        return []
    missing = []
    for line in (result.stdout + "\n" + result.stderr).splitlines():
        line = line.strip()
        if line.endswith("=> not found"):  # "libpython3.11.so.1.0 => not found"
            missing.append(line.split(" =>", 1)[0])
        elif "version `" in line and "not found" in line:  # "/lib/libc.so.6: version `GLIBC_2.38' not found (...)"
            missing.append(line.split("(required by", 1)[0].strip().rstrip(":"))
    logger.debug("loader check of %s: %s", executable, missing or "every library found")
    return missing


def _dynamically_linked(path: Path) -> bool:
    """Whether ``path`` is a 64-bit little-endian ELF file with an interpreter (``PT_INTERP``)."""
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
                return False
            phoff, phentsize, phnum = (
                struct.unpack_from("<Q", header, 0x20)[0],
                *struct.unpack_from("<HH", header, 0x36),
            )
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return any(
        struct.unpack_from("<I", table, i * phentsize)[0] == _PT_INTERP
        for i in range(phnum)
        if (i + 1) * phentsize <= len(table)
    )
