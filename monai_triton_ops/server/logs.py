"""Reading the server's log file: a bounded tail for errors, and the few facts only the log tells.

Triton reports a port it cannot bind and a model it cannot load only in its log (and its exit code),
so these few patterns are matched on the log text. They are kept here, in one place, each pinned by a test
against the real server.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

MAX_TAIL_LINES = 60
MAX_TAIL_CHARS = 8192
#: Triton prints wide tables; a line longer than this is cut so the tail keeps more lines.
MAX_LINE_CHARS = 240

# E1202 ... main.cc:257] "failed to start HTTP service: Unavailable - Socket '127.0.0.1:18000' already in use "
_PORT_IN_USE = re.compile(r"failed to start (\w+) service: .*?Socket '[^']*:(\d+)' already in use")
# E1202 ... model_lifecycle.cc:642] "failed to load 'bad' version 1: Internal: RuntimeError: boom\n\nAt:\n ..."
_MODEL_FAILED = re.compile(r"failed to load '([^']+)' version (\d+): (.*)")
# What a Python-backend stub that cannot start, or dies while its model loads, leaves in the server's log: the
# dynamic loader's own words (a missing libpython3.X.so.1.0, a symbol version), its embedded interpreter's, or
# the backend's health check ("Stub process 'add_one_0_0' is not healthy.", python_backend src/python_be.cc).
_STUB_FAILURES = (
    (re.compile(r"triton_python_backend_stub: (error while loading shared libraries: .*)"), "cannot start"),
    (re.compile(r"triton_python_backend_stub: (\S+: version \S+ not found.*)"), "cannot start"),
    (re.compile(r"(Failed to run python backend stub\. Errno = \d+.*)"), "cannot start"),
    (re.compile(r"(Fatal Python error: .*)"), "cannot start its interpreter"),
    (re.compile(r"(Stub process '[^']*' is not healthy\.?)"), "exited while its model loaded"),
)
# What tritonserver prints when the Python backend aborts it (python_backend src/stub_launcher.cc, message_queue.h):
# the backend guards its stub IPC with mutexes in shared memory; when a stub dies or is killed while it holds one
# (its health check failed because it was starved of CPU), the next lock throws and nothing catches it, so the
# whole server ends with SIGABRT (triton-inference-server/server#8882).
_LOCK_ABORT = re.compile(r"terminate called after throwing an instance of '(boost::interprocess::\w+)'")
# Error lines that say nothing about the failure on a machine without a GPU.
_NOISE = re.compile(r"CUDA|Cuda|NVML|DCGM|GPU|pinned memory", re.IGNORECASE)


@dataclass(frozen=True)
class PortConflict:
    service: str
    """``HTTP``, ``GRPC`` or ``Metrics``, as Triton writes it."""
    port: int


@dataclass(frozen=True)
class ModelFailure:
    model: str
    version: int
    reason: str
    """The first line of Triton's reason, e.g. ``Internal: RuntimeError: boom``."""


def read_tail(path: Path, *, max_lines: int = MAX_TAIL_LINES, max_chars: int = MAX_TAIL_CHARS) -> str:
    """The last ``max_lines`` lines of the log, each cut at ``MAX_LINE_CHARS``, at most ``max_chars`` in all."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * max_chars))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [_cut(line) for line in text.splitlines()[-max_lines:]]
    tail = "\n".join(lines)
    return tail[-max_chars:]


def read_from(path: Path, offset: int) -> tuple[str, int]:
    """Complete lines written after byte ``offset``, and the offset after them (for incremental scans)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return "", offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode("utf-8", errors="replace"), offset + end


def port_conflicts(text: str) -> list[PortConflict]:
    return [PortConflict(m.group(1), int(m.group(2))) for m in _PORT_IN_USE.finditer(text)]


def model_failures(text: str) -> list[ModelFailure]:
    return [
        ModelFailure(m.group(1), int(m.group(2)), _cut(m.group(3).split("\\n")[0].rstrip('" ')))
        for m in _MODEL_FAILED.finditer(text)
    ]


def stub_failure(log_text: str) -> str | None:
    """Why a Python-backend stub could not start or died while loading, in one line quoting the log; else ``None``.

    The first such line of ``log_text`` wins (the earliest cause). Used while a server loads its models: the
    local server's log, and the in-process server's.
    """
    for line in log_text.splitlines():
        for pattern, what in _STUB_FAILURES:
            found = pattern.search(line)
            if found:
                cause = found.group(1).split("\\n")[0].rstrip('" ')
                return _cut(f"the Python backend stub {what}: {cause}")
    return None


def server_abort(log_text: str) -> str | None:
    """Why the server aborted, in one sentence that names the cause and what avoids it; ``None`` if the log
    shows no known abort."""
    found = _LOCK_ABORT.search(log_text)
    if found is None:
        return None
    return (
        f"the Python backend aborted the server ({found.group(1)}): a stub's interprocess lock failed, which "
        "Triton's Python backend does when its stubs are starved of CPU while models load or run "
        "(triton-inference-server/server#8882); give the server more CPU or load fewer models at once "
        "(--model-load-thread-count)"
    )


def exit_reason(code: int, log_text: str) -> str:
    """One line on a server that exited before it was ready: a known abort by name, else its exit status and
    first error lines."""
    status = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
    abort = server_abort(log_text)
    if abort is not None:
        return f"tritonserver {status} before it was ready: {abort}"
    errors = "; ".join(error_lines(log_text, limit=3))
    return f"tritonserver {status} before it was ready" + (f": {errors}" if errors else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank, cut short ("" if none): what a program said last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return _cut(lines[-1]) if lines else ""


def error_lines(text: str, *, limit: int = 5) -> list[str]:
    """The first ``limit`` error lines (``E...`` records and ``error:``), without GPU noise, each cut short."""
    found = []
    for line in text.splitlines():
        is_error = (line.startswith("E") and line[1:5].isdigit()) or line.startswith("error:")
        if is_error and not _NOISE.search(line):
            found.append(_cut(line))
            if len(found) == limit:
                break
    return found


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."
