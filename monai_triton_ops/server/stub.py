"""Can a Python-backend stub start here, and which models start one? Asked before a model loads, in milliseconds.

The stub (``triton_python_backend_stub``) embeds Python: it links ``libpython3.X.so.1.0``, which Debian's
``python3`` package does not ship (it is ``libpython3.X``) and a fresh container often lacks. A stub that
cannot start exits at once, and Triton 2.51 then waits for its first message forever: the model load never
ends (an app hung 590 s until it was killed). So the stub is run once without arguments, as Triton runs it
before it launches one (it prints its usage and exits 1): anything else is a stub that cannot start, and
the dynamic loader's own words say why.

This is the one check, for ``LocalTritonServer`` / ``monai-triton serve`` (``readiness.check_stub``), the
in-process server (``InProcessServer.load``) and an app's checks before its graph runs
(``preflight.check_model_entry``). What only shows once a stub runs (it dies in ``initialize()``) is read
from the server's log (``logs.stub_failure``) or seen as a dead child (``backends.stubs``).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ..discovery import STUB_NAME
from .capabilities import read_config
from .logs import last_line, stub_failure

logger = logging.getLogger(__name__)

#: Running the stub without arguments takes milliseconds; this only bounds a broken file system.
CHECK_TIMEOUT_S = 30.0
#: The stub's exit status for "no arguments" (it prints its usage): the one answer of a stub that can start.
USAGE_STATUS = 1
_LIBPYTHON = re.compile(r"libpython(\d+\.\d+)")


def stub_problem(stub: Path, env: Mapping[str, str]) -> str | None:
    """One line saying why ``stub`` cannot start with ``env``, or ``None`` when it can.

    ``env`` is the environment the server hands its stubs (``LocalTritonServer``'s, or the app's own for the
    in-process server). The line quotes the loader or the stub, names the stub and, for a missing
    ``libpython``, says how to get it.
    """
    try:
        result = subprocess.run(  # our own stub (or a model's), an argv list, no shell
            [str(stub)],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the Python backend stub {str(stub)!r} cannot start: {exc}"
    if result.returncode == USAGE_STATUS:
        logger.debug("stub check of %s: it starts", stub)
        return None
    said = (result.stderr + result.stdout).decode(errors="replace")
    status = f"exit status {result.returncode}" if result.returncode >= 0 else f"signal {-result.returncode}"
    cause = stub_failure(said) or f"the Python backend stub cannot start: {last_line(said) or 'it printed nothing'}"
    return f"{cause} ({str(stub)!r}, {status}){_hint(said)}"


def _hint(said: str) -> str:
    """How to get a missing ``libpython``, when the loader names one."""
    if "libpython" not in said:
        return ""
    found = _LIBPYTHON.search(said)
    version = found.group(1) if found else f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"; install the Python {version} shared library (Debian/Ubuntu: apt-get install libpython{version}), "
        "use a Python built with --enable-shared, or put the folder holding it on LD_LIBRARY_PATH"
    )


def model_stub(folder: Path, default: Path | None) -> Path | None:
    """The stub loading the model in ``folder`` starts: its own (a ``triton_python_backend_stub`` beside its
    ``config.pbtxt``, as Triton prefers), else ``default`` (the install's); ``None`` for a model that starts
    none (not a Python-backend model)."""
    if not is_python_model(folder):
        return None
    own = folder / STUB_NAME
    return own if own.exists() else default


def is_python_model(folder: Path) -> bool:
    """Whether the model in ``folder`` runs on the Python backend (its stub starts when it loads).

    By its ``config.pbtxt`` (parsed, so comments and spacing do not matter): ``backend: "python"``; with
    neither a backend nor a platform, Triton picks the backend from the model file, so a ``model.py`` in a
    version folder. A config that does not parse: a ``model.py`` decides (Triton reports the config itself).
    """
    has_runner = any(folder.glob("*/model.py"))
    config = read_config(folder)
    if config is None:
        return has_runner
    if config.backend or config.platform:
        return bool(config.backend == "python")
    return has_runner


def python_models(repository: Path) -> list[str]:
    """Names of the models in ``repository`` that run on the Python backend, sorted."""
    if not repository.is_dir():
        return []
    return [p.name for p in sorted(repository.iterdir()) if p.is_dir() and is_python_model(p)]


def repository_stub_problems(repository: Path, default: Path | None, env: Mapping[str, str]) -> dict[str, list[str]]:
    """Each problem of a stub the repository's models would start -> those models (each stub run once)."""
    checked: dict[Path, str | None] = {}
    problems: dict[str, list[str]] = {}
    for name in python_models(repository):
        stub = model_stub(repository / name, default)
        if stub is None:
            continue
        if stub not in checked:
            checked[stub] = stub_problem(stub, env)
        problem = checked[stub]
        if problem:
            problems.setdefault(problem, []).append(name)
    return problems
