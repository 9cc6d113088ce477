"""Ctrl-C and SIGTERM end an app run within seconds, from any moment: one line, exit 130 / 143, nothing left.

Holoscan runs operators on its own threads and ``Application.run()`` blocks the main thread in C++,
where Python's own signal handler never gets to run (a Ctrl-C would surface as a failed operator, exit 1),
and Holoscan installs handlers of its own when the graph starts. So the
signals are taken away from every thread instead: :func:`install_signal_handlers` blocks SIGINT and SIGTERM in the
calling (main) thread before any other thread exists, every thread created afterwards inherits the
mask, and one watcher thread waits for them with ``sigwait``, whichever handler anybody installed.

On a signal the watcher, within ``DEADLINE_S``:

1. prints ``error: interrupted (SIGINT, Ctrl-C)`` / ``error: terminated (SIGTERM)``, once;
2. runs the registered cleanups, newest first: backends close (their requests are cancelled, an
   in-process Triton server stops, shared-memory regions are unregistered and unlinked);
3. removes every file the run created in its output folder (``track_output``): a half-written file,
   and the outputs of a run that did not finish, so the folder is as it was;
4. ends the process with ``os._exit(130 or 143)``: Holoscan's threads are not waited for.

A second signal during the cleanup exits at once.

The library itself installs no signal handler: not on import, not when a backend opens. ``monai-triton exec``
and ``app_args.run_app`` call :func:`install_signal_handlers` (public as
``monai_triton_ops.install_signal_handlers``); a program that embeds an app or a backend may call it too, first
thing in its main thread, or keep its own handlers, which then run as they would without this package
(the shared-memory janitor, ``backends/remote/shm/janitor.py``, removes the regions of a process that a
signal ended without closing its backends). Where it is not called (a library use, a test calling
``run_app(argv=...)``), nothing changes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

#: The exit code of a process a signal ended: 128 + the signal's number, as a shell reports it.
#: ``exits`` lists them with the other codes.
INTERRUPTED = 128 + signal.SIGINT
TERMINATED = 128 + signal.SIGTERM

#: The whole cleanup gets this long before the process ends regardless.
DEADLINE_S = 8.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)
_CODES = {signal.SIGINT: INTERRUPTED, signal.SIGTERM: TERMINATED}
_LINES = {signal.SIGINT: "interrupted (SIGINT, Ctrl-C)", signal.SIGTERM: "terminated (SIGTERM)"}

_lock = threading.Lock()
_cleanups: dict[int, Callable[[], None]] = {}
_ids = itertools.count()
_outputs: dict[Path, set[Path]] = {}
_installed = False
_stopping = threading.Event()


def install_signal_handlers() -> bool:
    """Take SIGINT and SIGTERM from every thread to be created, and start the watcher; once per process.

    Call it first thing in the main thread (``app_args.run_app`` and ``monai-triton exec`` do); a
    program that wants its own SIGINT/SIGTERM handling does not call it (a handler installed after it would
    never run: the signals are blocked in every thread). A thread that already exists
    (an import that started one) keeps the signals unblocked; a signal it receives goes through
    Python's handler, whose wake-up file descriptor a second watcher reads. Returns False when not
    possible (not the main thread, not POSIX) and the process keeps Python's default handling. A
    signal the parent set to be ignored (``nohup``, a background job of a script) stays ignored.
    """
    global _installed
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return False
    wanted = [s for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    if not wanted:
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for number in wanted:
        signal.signal(number, _python_handler)
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    # A child inherits the mask: one forked by Python (os.fork, subprocess with preexec_fn, as the local
    # tritonserver is started) gets the signals back; one spawned without a Python fork keeps them blocked.
    os.register_at_fork(after_in_child=_unblock)
    threading.Thread(target=_watch, args=(wanted,), name="monai-triton-interrupts", daemon=True).start()
    threading.Thread(target=_watch_fd, args=(read_fd,), name="monai-triton-interrupts-fd", daemon=True).start()
    _installed = True
    return True


def block() -> None:
    """Only hold SIGINT and SIGTERM back (pending): before a restart (``os.execv``), which keeps the mask and the
    pending signals but not the watcher thread; ``install_signal_handlers()`` in the restarted process then
    takes them."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, [s for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN])


def _unblock() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def _python_handler(number: int, frame: object) -> None:
    """The main thread's part when it runs Python again: nothing; the watcher has the signal already."""


def is_installed() -> bool:
    return _installed


def stopping() -> bool:
    """Whether a signal is being handled: an error raised now is a consequence, not news."""
    return _stopping.is_set()


def register(cleanup: Callable[[], None]) -> int:
    """Run ``cleanup`` (it must not block for long) if the run is interrupted; returns a key for ``unregister``."""
    key = next(_ids)
    with _lock:
        _cleanups[key] = cleanup
    return key


def unregister(key: int) -> None:
    with _lock:
        _cleanups.pop(key, None)


def track_output(folder: str | os.PathLike[str] | None) -> None:
    """Remember what ``folder`` holds now; an interrupted run removes every file added after this."""
    if not folder:
        return
    path = Path(folder).resolve()
    with _lock:
        if path not in _outputs:
            _outputs[path] = _entries(path)


def wait_if_stopping() -> None:
    """Called where a failure is about to be reported: while a signal is handled, leave the exit to it."""
    if _stopping.is_set():
        time.sleep(DEADLINE_S + 5)  # the watcher ends the process before this returns


def _watch(wanted: list[signal.Signals]) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
    _handle(signal.sigwait(wanted))


def _watch_fd(read_fd: int) -> None:
    """Signals delivered to a thread that did not block them: Python's C handler writes their numbers here."""
    while True:
        data = os.read(read_fd, 64)
        numbers = [n for n in data if n in (int(s) for s in SIGNALS)]
        if numbers:
            _handle(numbers[0])


_handling = threading.Lock()


def _handle(number: int) -> None:
    """The first signal: report, clean up, exit. A second one (from either watcher): remove outputs, exit now."""
    code = _CODES.get(signal.Signals(number), INTERRUPTED)
    if not _handling.acquire(blocking=False):
        _remove_new_outputs()
        os._exit(code)
    _stopping.set()
    print(f"error: {_LINES.get(signal.Signals(number), 'interrupted')}", file=sys.stderr, flush=True)
    threading.Thread(target=_second_signal, args=(code,), name="monai-triton-interrupts-2", daemon=True).start()
    timer = threading.Timer(DEADLINE_S, os._exit, args=(code,))
    timer.daemon = True
    timer.start()
    _clean_up()
    _flush()
    os._exit(code)


def _second_signal(code: int) -> None:
    signal.sigwait(SIGNALS)
    _remove_new_outputs()
    os._exit(code)


def _clean_up() -> None:
    with _lock:
        cleanups = [_cleanups[k] for k in sorted(_cleanups, reverse=True)]
    for cleanup in cleanups:
        try:
            cleanup()
        except Exception as exc:  # one cleanup failing must not stop the others
            logger.debug("cleanup %r failed at interrupt: %s", cleanup, exc)
    _remove_new_outputs()


def _remove_new_outputs() -> None:
    """Files, then folders (deepest first), that appeared in a tracked output folder since it was tracked."""
    with _lock:
        outputs = dict(_outputs)
    for folder, before in outputs.items():
        new = _entries(folder) - before
        for path in sorted(new, key=lambda p: len(p.parts), reverse=True):
            try:
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()
            except OSError as exc:
                logger.debug("cannot remove %s at interrupt: %s", path, exc)


def _entries(folder: Path) -> set[Path]:
    """Every file and folder under ``folder`` (``folder`` itself excluded)."""
    if not folder.is_dir():
        return set()
    return set(folder.rglob("*"))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
