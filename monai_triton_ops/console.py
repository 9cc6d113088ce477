"""What a process prints: one ``-l`` level for our logs, the App SDK's and Holoscan's; the stack limit.

``-l`` levels (the App SDK's names), for ``monai-triton`` and for apps started with ``run_app``:

    DEBUG     everything: our debug lines, Holoscan's own log, and the traceback of a failure
    INFO      what runs: backend, model, files written; Holoscan stays quiet
    WARN      warnings only (the default), and the one line saying which backend ran the model and how long
    ERROR     errors only
    CRITICAL  almost nothing

Holoscan logs through its own C++ logger (``HOLOSCAN_LOG_LEVEL``). At every level but DEBUG it is
set to CRITICAL: its error lines repeat, with a traceback, the exception that we report once, in
one line. A ``HOLOSCAN_LOG_LEVEL`` set by the user wins.

Holoscan warns when the soft stack limit is below 32 MiB. Where the hard limit allows, the soft
limit is raised instead; a process entry point then restarts itself once (``os.execv``, before any
heavy import) so that every thread, not only the main one, gets the larger stack.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Sequence

LEVELS = ("DEBUG", "INFO", "WARN", "ERROR", "CRITICAL")
DEFAULT_LEVEL = "WARN"
HOLOSCAN_ENV = "HOLOSCAN_LOG_LEVEL"
#: Holoscan's recommended minimum stack (its warning names 32 MiB).
STACK_BYTES = 32 * 1024 * 1024
#: Set in the environment of the restarted process, so that it never restarts again.
_RESTARTED_ENV = "MONAI_TRITON_STACK_RAISED"
_HOLOSCAN_STACK_WARNING = "Current stack size"
_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
#: ``operators.report``'s logger: its INFO line is shown at the default level.
RUN_LOGGER = "monai_triton_ops.run"

logger = logging.getLogger(__name__)
_holoscan_level_is_ours = False
_noted_low_stack = False


def level_from_argv(argv: Sequence[str], default: str = DEFAULT_LEVEL) -> str:
    """The ``-l/--log-level`` value in ``argv`` (upper case), else ``default``; an invalid one is left to the parser."""
    args = list(argv)
    for i, arg in enumerate(args):
        value = None
        if arg in ("-l", "--log-level") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--log-level="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-l") and len(arg) > 2 and not arg.startswith("--"):
            value = arg[2:]
        if value is not None and value.upper() in LEVELS:
            return value.upper()
    return default


def configure(level: str) -> None:
    """Python logging at ``level`` and Holoscan's log to match; quieten Holoscan's stack warning."""
    level = level.upper() if level.upper() in LEVELS else DEFAULT_LEVEL
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel("WARNING" if level == "WARN" else level)
    # The one line a run prints by default (which backend, where, how long): shown down to -l WARN, bare.
    run = logging.getLogger(RUN_LOGGER)
    run.setLevel("INFO" if level in ("DEBUG", "INFO", "WARN") else level)
    if not any(isinstance(h, _StderrHandler) for h in run.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        run.addHandler(handler)
    run.propagate = False
    configure_holoscan(level)
    warnings.filterwarnings("ignore", message=_HOLOSCAN_STACK_WARNING, category=RuntimeWarning)
    if level != "DEBUG":
        quiet_unactionable()


#: Warnings a user cannot act on: the GPU image decoder (nvImageCodec) is absent and DICOM is decoded by
#: pydicom instead, with the same pixels. They stay visible at ``-l DEBUG``: (logger name, message start).
_UNACTIONABLE = (
    ("monai.deploy.operators.decoder_nvimgcodec", "Module nvidia.nvimgcodec is not available"),
    ("root", "The nvimgcodec decoder plugin did not register successfully"),
    ("monai.data.nvimgcodec_pydicom_plugin", "nvImageCodec is not available"),
)
_UNACTIONABLE_WARNINGS = (r"NvImgCodecPydicomReader: nvImageCodec decoder plugin did not register",)


class _DropUnactionable(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(record.name == name and message.startswith(start) for name, start in _UNACTIONABLE)


_DROP = _DropUnactionable()


def quiet_unactionable() -> None:
    """Drop the warnings of ``_UNACTIONABLE`` (logger filters survive the App SDK's logging set-up)."""
    for name in {name for name, _ in _UNACTIONABLE}:
        logger_ = logging.getLogger() if name == "root" else logging.getLogger(name)
        if _DROP not in logger_.filters:
            logger_.addFilter(_DROP)
    for message in _UNACTIONABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def configure_holoscan(level: str) -> None:
    """``HOLOSCAN_LOG_LEVEL`` (and Holoscan's logger, when loaded): all of it at DEBUG, else CRITICAL only."""
    global _holoscan_level_is_ours
    if HOLOSCAN_ENV in os.environ and not _holoscan_level_is_ours:
        return  # the user's choice
    value = "DEBUG" if level.upper() == "DEBUG" else "CRITICAL"
    os.environ[HOLOSCAN_ENV] = value
    _holoscan_level_is_ours = True
    if "holoscan.logger" in sys.modules or "holoscan" in sys.modules:
        from holoscan.logger import LogLevel, set_log_level

        set_log_level(getattr(LogLevel, value))


def raise_stack_limit(target: int = STACK_BYTES) -> bool:
    """Raise the soft stack limit towards ``target`` as far as the hard limit allows; True when raised."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return False
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return False
    new = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if new <= soft:
        _note_low_stack(soft)
        return False
    try:
        resource.setrlimit(resource.RLIMIT_STACK, (new, hard))
    except (ValueError, OSError) as exc:
        logger.debug("cannot raise the stack limit: %s", exc)
        _note_low_stack(soft)
        return False
    if new < target:
        _note_low_stack(new)
    return True


def prepare_process(*, restart: bool) -> None:
    """Raise the stack limit; with ``restart``, re-execute this process once so that it applies to every thread.

    Call it first thing in a process entry point, before the App SDK or Holoscan are imported:
    the restarted process runs the same command line with the larger limit. Once Holoscan is
    imported a restart would repeat that import (seconds), so then only the main thread gains.
    """
    if not raise_stack_limit() or not restart or os.environ.get(_RESTARTED_ENV) or "holoscan" in sys.modules:
        return
    os.environ[_RESTARTED_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])  # noqa: S606 - our own command line
    except OSError as exc:  # the raised limit still helps the main thread
        logger.debug("cannot restart with the raised stack limit: %s", exc)


def _note_low_stack(soft: int) -> None:
    global _noted_low_stack
    if _noted_low_stack or os.environ.get(_RESTARTED_ENV):  # once per command, not again after the restart
        return
    _noted_low_stack = True
    print(
        f"note: the stack limit is {soft // (1024 * 1024)} MiB and the hard limit allows no more; Holoscan "
        f"recommends {STACK_BYTES // (1024 * 1024)} MiB ('ulimit -s {STACK_BYTES // 1024}' where you may)",
        file=sys.stderr,
    )
