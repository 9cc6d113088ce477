"""The one translation point: an exception at the edge of a command or an app -> one line and an exit code.

Every ``monai-triton`` command and every app started through ``app_args.run_app`` ends here, so a
failure reads the same wherever it happens::

    0    success
    1    a bug: an exception nobody anticipated (please report it with the -l DEBUG traceback)
    2    bad input or usage: an option, path, model, image or configuration that cannot work
    3    unavailable: a backend that is not built or not installed, a server that is absent or failed,
         a program a MAP build needs (buildah, mmdebstrap) missing or failing
    4    the server failed on a request: its internal error (the server's or its model's), not bad input
    70   ended at interpreter exit with requests still in the in-process Triton server after its deadline
         (``backends/inprocess/ending.py``; ``docs/inprocess.md``)
    130  interrupted (Ctrl-C, SIGINT)
    143  terminated (SIGTERM)

The line goes to stderr as ``error: <first line of the message>``; the traceback (and the rest of a
multi-line message, such as a server's log tail) only with ``-l DEBUG``. Exceptions are classified
by type, never by message text.
"""

from __future__ import annotations

import errno
import sys
import traceback
from collections.abc import Callable
from typing import TextIO

from .errors import (
    BackendStateError,
    BackendUnavailableError,
    MonaiTritonError,
    PackagingError,
    PortInUseError,
    ServerError,
    ServerInternalError,
)
from .interrupts import INTERRUPTED, TERMINATED, wait_if_stopping

OK = 0
BUG = 1
USAGE = 2
UNAVAILABLE = 3
SERVER_FAILED = 4
#: The in-process server's exit hook ends the process with it (``inprocess.ending.STRANDED_EXIT_CODE``).
STRANDED = 70

#: What each code means, for help texts and docs (docs/quickstart.md lists the same).
MEANINGS: dict[int, str] = {
    OK: "success",
    BUG: "a bug (an unexpected exception; rerun with -l DEBUG and report the traceback)",
    USAGE: "bad input or usage (option, path, model, image or configuration)",
    UNAVAILABLE: "backend or server unavailable",
    SERVER_FAILED: "the server failed on a request (its internal error; its log says why)",
    STRANDED: "requests still in the in-process Triton server at exit, after its deadline",
    INTERRUPTED: "interrupted (Ctrl-C, SIGINT)",
    TERMINATED: "terminated (SIGTERM)",
}

#: Foreign OS errors a user causes with a path (missing, not a folder, no permission, disk full).
_PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM, errno.ENOSPC}


def exit_code(exc: BaseException) -> int:
    """The documented exit code for ``exc``."""
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(exc, MonaiTritonError):
        if isinstance(exc, ServerInternalError):
            return SERVER_FAILED
        if isinstance(exc, PortInUseError):  # the port the user asked for is taken: their choice to change
            return USAGE
        if isinstance(exc, BackendUnavailableError | ServerError | PackagingError | ConnectionError | TimeoutError):
            return UNAVAILABLE
        if isinstance(exc, BackendStateError):  # lifecycle misuse is a programming error
            return BUG
        return USAGE
    if isinstance(exc, OSError) and exc.errno in _PATH_ERRNOS:
        return USAGE
    return BUG


def one_line(exc: BaseException) -> str:
    """The message as one line: the first line, a note when more was cut, the type name for bugs."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    text = lines[0].strip()
    if len(lines) > 1:
        text += f" [{len(lines) - 1} more line(s) with -l DEBUG]"
    code = exit_code(exc)
    if code == BUG:
        return f"internal error: {type(exc).__name__}: {text} (a bug: rerun with -l DEBUG and report the traceback)"
    if not isinstance(exc, MonaiTritonError):  # a foreign OSError: say what kind
        return f"{type(exc).__name__}: {text}"
    return text


def report(exc: BaseException, *, debug: bool = False, stream: TextIO | None = None) -> int:
    """Print ``exc`` as one ``error:`` line (after its traceback when ``debug``); return its exit code."""
    out = sys.stderr if stream is None else stream
    if debug and not isinstance(exc, KeyboardInterrupt):
        traceback.print_exception(exc, file=out)
    print(f"error: {one_line(exc)}", file=out, flush=True)
    return exit_code(exc)


def run_guarded(body: Callable[[], int | None], *, debug: bool = False) -> int:
    """Run ``body`` and turn whatever it raises into one line and an exit code (``SystemExit`` passes)."""
    try:
        code = int(body() or 0)
        wait_if_stopping()  # finished while an interrupt cleans up: the interrupt decides
        return code
    except SystemExit as exc:
        return system_exit_code(exc)
    except BaseException as exc:  # this is the edge: nothing may end in a traceback
        wait_if_stopping()  # a failure caused by an interrupt's cleanup: the interrupt reports
        return report(exc, debug=debug)


def system_exit_code(exc: SystemExit) -> int:
    """The status ``SystemExit`` carries, as the interpreter would report it (text -> printed, 1)."""
    if exc.code is None:
        return OK
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return BUG
