"""``python ARGS`` for a test, forked from an interpreter that has already imported torch, MONAI and the App SDK.

Every app and CLI process pays about 4 s of CPU importing torch, MONAI (``import monai`` imports every MONAI
subpackage) and Holoscan before it reads an argument; the suite starts dozens of them on a 2-core machine
(CONTRIBUTING.md, "where the suite's time goes"). Here one *zygote* per test worker imports them once, and each run
is a fork of it that then does what ``python -m MODULE ARGS`` or ``python PATH ARGS`` does: ``sys.argv``,
``sys.path[0]``, the working directory and the environment, stdin from ``/dev/null``, stdout and stderr to files,
then the module or script as ``__main__`` (``runpy``, as ``python`` itself). It exits as ``python`` does
(``SystemExit``, an uncaught exception's traceback and exit 1, non-daemon threads joined, ``atexit``), less the
finalisation of the heap it shares with the zygote, which would copy nearly every page it inherited (``_exit``: 1.7 s
of CPU a run). A shell script's ``monai-triton`` lines fork too, through a stand-in on the ``PATH``
(``console_script``).

What could differ from a fresh ``python``, and how it is kept the same:

- output printed while importing: the zygote records it, and every run prints it first;
- the environment: the run gets the caller's, plus what the zygote's start-up changed in its own (the stack-limit
  restart's marker, as a restarted app has it);
- the stack limit: the zygote raises it and restarts itself before any heavy import, as every entry point does
  (``console.prepare_process``), so the threads of a run get Holoscan's 32 MiB stacks;
- a variable read while importing: a command whose environment differs from the test worker's in anything but
  ``MONAI_TRITON_*`` and ``RUNTIME_ENV`` runs as a fresh process (``subprocess.run``), as does any command that
  is not ``python -m ...`` or ``python PATH``. Holoscan's log level is applied as its import would have.

Tests of signals, interrupts and process exit start their processes themselves; this is for runs whose exit code and
output are what the test reads.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: What the zygote imports before it forks: what every app and ``monai-triton`` process imports first (``make
#: pytest`` imports it once beforehand, to write its bytecode).
PRELOAD = ("monai_triton_ops.cli", "torch", "monai", "monai.deploy.core", "holoscan")
#: Variables a run's environment may change without a fresh process. None but Holoscan's log level is read on import
#: (the run applies it); the rest are what an in-process server of the test worker sets in the worker's environment
#: for the processes it starts (``server_environment``), which a fresh app would inherit from the worker by accident.
RUNTIME_ENV_PREFIX = "MONAI_TRITON_"
RUNTIME_ENV = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "PYTHONPATH",  # a run puts its entries on sys.path, as the interpreter's start would
        "TORCHINDUCTOR_CACHE_DIR",  # torch sets it in its own process when the inductor first asks for its cache
        "HOLOSCAN_LOG_LEVEL",
        "PATH",
        "LD_LIBRARY_PATH",
        "OMP_WAIT_POLICY",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
    }
)
#: How long the zygote may take to import PRELOAD.
START_TIMEOUT_S = 120.0
#: How long a killed run may take to be reported.
KILL_TIMEOUT_S = 30.0
_ROOT = Path(__file__).resolve().parents[1]


class PythonRun(subprocess.CompletedProcess[str]):
    """A finished run: ``subprocess.CompletedProcess``, the run's process id (to look for what it left), and why it
    ran fresh (empty when it was forked from the warm interpreter)."""

    def __init__(
        self, args: Sequence[str], returncode: int, stdout: str, stderr: str, pid: int, why_fresh: str = ""
    ) -> None:
        super().__init__(list(args), returncode, stdout, stderr)
        self.pid = pid
        self.why_fresh = why_fresh

    @property
    def forked(self) -> bool:
        return not self.why_fresh


class Zygote:
    """One warm interpreter per test worker; runs are serialised by a lock (a worker runs one test at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="warm-python-"))
        self.base_env = dict(os.environ)
        self._log = open(self._dir / "zygote.log", "wb")  # noqa: SIM115 - lives as long as the zygote
        #: Where console scripts' stand-ins (``console_script``) ask the zygote for a fork.
        self.socket_path = self._dir / "scripts.sock"
        self._process = subprocess.Popen(
            [sys.executable, __file__, str(self.socket_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=_ROOT,
            env=self.base_env,
        )
        self._buffer = b""
        ready = self._read(START_TIMEOUT_S)
        self._delta: dict[str, str | None] = {
            key: value for key, value in ready["env"].items() if self.base_env.get(key) != value
        }
        self._delta.update({key: None for key in self.base_env if key not in ready["env"]})
        self._count = 0

    def refused(self, env: Mapping[str, str] | None) -> list[str]:
        """The variables of ``env`` that differ from the worker's and may be read on import: none, and a run forks."""
        if env is None:
            return []
        keys = set(env) | set(self.base_env)
        changed = {key for key in keys if env.get(key) != self.base_env.get(key)}
        return sorted(key for key in changed if not (key.startswith(RUNTIME_ENV_PREFIX) or key in RUNTIME_ENV))

    def console_script(self, folder: Path, name: str, real: Path | None = None) -> Path:
        """``folder/name``: a stand-in for the venv's console script ``name`` that runs it forked from this zygote.

        For commands that a test does not start itself (a shell script's ``monai-triton`` lines): put ``folder``
        first on the ``PATH``. The stand-in (``tests/warm_script.py``, a bare interpreter: ``python -IS``) hands its
        arguments, working folder, environment and its stdin, stdout and stderr themselves to the zygote, forwards
        SIGINT, SIGTERM and SIGHUP to the fork and exits as it does. An environment that changes a variable read on
        import runs the real script instead, as ``run`` does. ``real``: the script (default: the venv's ``name``).
        """
        real = real or Path(sys.executable).parent / name
        config = folder / f".{name}.json"
        delta = self._delta
        settings = {"socket": str(self.socket_path), "real": str(real), "base_env": self.base_env, "delta": delta}
        config.write_text(json.dumps({**settings, "prefix": RUNTIME_ENV_PREFIX, "runtime": sorted(RUNTIME_ENV)}))
        script = folder / name
        stand_in = _ROOT / "tests" / "warm_script.py"
        script.write_text(
            f"#!{sys.executable} -IS\n"
            f"CONFIG = {str(config)!r}\n"
            f"exec(compile(open({str(stand_in)!r}).read(), {str(stand_in)!r}, 'exec'))\n"
        )
        script.chmod(0o755)
        return script

    def run(self, args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str] | None, timeout: float) -> PythonRun:
        """``args`` (without the interpreter) in a fork; raises ``subprocess.TimeoutExpired`` after killing it."""
        with self._lock:
            self._count += 1
            out, err = self._dir / f"{self._count}.out", self._dir / f"{self._count}.err"
            child_env = dict(self.base_env if env is None else env)
            for key, value in self._delta.items():
                if value is None:
                    child_env.pop(key, None)
                else:
                    child_env[key] = value
            request = {"argv": list(args), "cwd": str(cwd), "env": child_env, "stdout": str(out), "stderr": str(err)}
            self._send(request)
            pid = self._read(START_TIMEOUT_S)["pid"]
            try:
                code = self._read(timeout)["code"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._read(KILL_TIMEOUT_S)
                raise subprocess.TimeoutExpired(args, timeout, _text(out), _text(err)) from None
            try:
                return PythonRun([sys.executable, *args], code, _text(out), _text(err), pid)
            finally:
                out.unlink(missing_ok=True)
                err.unlink(missing_ok=True)

    def close(self) -> None:
        """End the zygote (it exits when its stdin closes) and remove its folder."""
        if self._process.stdin:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=KILL_TIMEOUT_S)
        self._log.close()
        for path in self._dir.iterdir():
            path.unlink()
        self._dir.rmdir()

    def _send(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(message).encode() + b"\n")
        self._process.stdin.flush()

    def _read(self, timeout: float) -> dict[str, Any]:
        """The zygote's next message; TimeoutExpired after ``timeout``; RuntimeError (with its log) if it died."""
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired("zygote", timeout)
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    log = (self._dir / "zygote.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the warm interpreter ended (exit {self._process.wait()}):\n{log}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def run_fresh(
    args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str] | None, timeout: float, why: str = "asked"
) -> PythonRun:
    """``subprocess.run(args, capture_output=True, text=True)`` in a new process, keeping its pid."""
    with subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            exc.output, exc.stderr = process.communicate()
            raise
        return PythonRun(args, process.returncode, out, err, process.pid, why_fresh=why)


_zygote: Zygote | None = None


def run(
    command: Sequence[str | Path],
    *,
    cwd: Path | str = _ROOT,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    fresh: bool = False,
) -> PythonRun:
    """``subprocess.run(command, capture_output=True, text=True, check=False)``, forked when it can be (not with
    ``fresh``: a test that asserts all a new process prints).

    ``WARM_PYTHON=0`` in the environment runs every command fresh (to compare).

    ``command`` is ``[sys.executable, "-m", MODULE, ...]`` or ``[sys.executable, PATH, ...]`` to be forked; anything
    else, or an environment that changes a variable read on import, runs as a fresh process.
    """
    args = [str(part) for part in command]
    python = len(args) >= 2 and args[0] == sys.executable
    forkable_command = python and (not args[1].startswith("-") or (args[1] == "-m" and len(args) >= 3))
    env = dict(os.environ) if env is None else env  # as the fresh process would inherit it now
    if fresh or not forkable_command or os.environ.get("WARM_PYTHON") == "0":
        return _logged(run_fresh(args, cwd=cwd, env=env, timeout=timeout, why="asked" if fresh else "not forkable"))
    zygote = _started()
    refused = zygote.refused(env)
    if refused:
        return _logged(run_fresh(args, cwd=cwd, env=env, timeout=timeout, why=f"environment {refused}"))
    return _logged(zygote.run(args[1:], cwd=cwd, env=env, timeout=timeout))


def _logged(result: PythonRun) -> PythonRun:
    """With ``WARM_PYTHON_LOG=FILE``: one line per run there, forked or fresh and why (to see what is not forked)."""
    log = os.environ.get("WARM_PYTHON_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as file:
            file.write(f"{'forked' if result.forked else 'fresh'}\t{result.why_fresh}\t{' '.join(result.args[1:3])}\n")
    return result


def console_script(folder: Path, name: str = "monai-triton", real: Path | None = None) -> Path:
    """``folder/name``, a stand-in for the venv's console script ``name`` (or the script ``real``) that forks it from
    this worker's zygote (``Zygote.console_script``); with ``WARM_PYTHON=0``, a link to the real script."""
    script = folder / name
    if os.environ.get("WARM_PYTHON") == "0":
        script.symlink_to(real or Path(sys.executable).parent / name)
        return script
    return _started().console_script(folder, name, real)


def environment(**changes: str) -> dict[str, str]:
    """The environment the warm interpreter started with, plus ``changes``: a run with it is always forked."""
    return {**_started().base_env, **changes}


def _started() -> Zygote:
    """This worker's zygote, started on first use and ended at exit."""
    global _zygote
    if _zygote is None:
        _zygote = Zygote()
        atexit.register(close)
    return _zygote


def close() -> None:
    """End this worker's zygote, if one was started (the session's end)."""
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


# -- the zygote itself ---------------------------------------------------------------------------------------------
def _serve(socket_path: str) -> tuple[str, str]:
    """Import PRELOAD, say ready, then fork one child per request and report its pid and exit code.

    Requests come from the test worker (stdin: a JSON line naming files for stdout and stderr; answers on stdout)
    and from console-script stand-ins (``socket_path``: a JSON message with the stand-in's stdin, stdout and stderr
    attached; answers on that connection). Returns in a child only: what it is to run (``("module", NAME)`` or
    ``("path", PATH)``).
    """
    ctl_in, ctl_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    captured = tempfile.TemporaryFile()  # noqa: SIM115 - the zygote's life long
    saved_err = os.dup(2)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen()
    own = [ctl_in, ctl_out, null, saved_err, captured.fileno(), listener.fileno()]
    os.dup2(captured.fileno(), 1)
    os.dup2(captured.fileno(), 2)
    import importlib

    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_err, 1)
        os.dup2(saved_err, 2)
    captured.seek(0)
    printed = captured.read()
    _write(ctl_out, {"env": dict(os.environ)})
    children: dict[int, tuple[int, socket.socket | None]] = {}  # pidfd -> pid, the stand-in's connection or None
    buffer = b""
    while True:
        ready = select.select([ctl_in, listener, *children], [], [])[0]
        for fd in ready:
            if fd in children:
                pid, connection = children.pop(fd)
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                _answer(connection, ctl_out, {"pid": pid, "code": os.waitstatus_to_exitcode(status)})
        requests: list[tuple[dict[str, Any], socket.socket | None, list[int]]] = []
        if listener in ready:
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            requests.append((json.loads(message), connection, fds))
        if ctl_in in ready:
            chunk = os.read(ctl_in, 1 << 20)
            if not chunk:
                os._exit(0)  # the test worker is done; running children finish on their own
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                requests.append((json.loads(line), None, []))
        for request, connection, fds in requests:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for fd in (*own, *children):
                    os.close(fd)
                for _, other in children.values():
                    if other is not None:
                        other.close()
                return _become(request, printed, fds)
            for fd in fds:
                os.close(fd)
            children[os.pidfd_open(pid)] = (pid, connection)
            _answer(connection, ctl_out, {"pid": pid})


def _answer(connection: socket.socket | None, ctl_out: int, message: dict[str, Any]) -> None:
    """A child's pid, then its exit code: to the stand-in that asked (closed after the code), else to the worker."""
    if connection is None:
        _write(ctl_out, message)
        return
    with contextlib.suppress(OSError):  # the stand-in was killed: nobody waits for the answer
        connection.send(json.dumps(message).encode())
    if "code" in message:
        connection.close()


def _write(fd: int, message: dict[str, Any]) -> None:
    os.write(fd, json.dumps(message).encode() + b"\n")


def _become(request: dict[str, Any], printed: bytes, stdio: Sequence[int]) -> tuple[str, str]:
    """In the child: the process ``python ARGV`` would be, up to running its ``__main__``.

    ``stdio``: a stand-in's stdin, stdout and stderr; none: stdout and stderr to the files the request names.
    """
    if stdio:
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
            os.close(fd)
    else:
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
    os.write(2, printed)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    level = os.environ.get("HOLOSCAN_LOG_LEVEL")
    if level and "holoscan" in sys.modules:  # what Holoscan's logger would have read on import
        from holoscan.logger import LogLevel, set_log_level

        set_log_level(getattr(LogLevel, level.upper(), LogLevel.INFO))
    argv = request["argv"]
    sys.orig_argv = [sys.executable, *argv]
    extra = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[0:0] = [os.path.abspath(entry) for entry in extra if os.path.abspath(entry) not in sys.path]
    if argv[0] == "-m":
        sys.path.insert(0, os.getcwd())
        sys.argv = ["-m", *argv[2:]]
        loaded = sys.modules.get(argv[1])
        if loaded is not None and not hasattr(loaded, "__path__"):
            del sys.modules[argv[1]]  # a module, not a package: run afresh as __main__, as ``python -m`` does
        return "module", argv[1]
    path = os.path.abspath(argv[0])
    if os.path.isfile(path):
        sys.path.insert(0, os.path.dirname(path))  # a folder or zip is put first by runpy.run_path
    sys.argv = list(argv)
    return "path", path


def _exit(raised: BaseException | None) -> None:
    """End a run as the interpreter ends ``python``, less its teardown of the heap the run shares with the zygote.

    The exit code and what is printed are the interpreter's: ``SystemExit``'s code (a message printed, 1), an uncaught
    exception's traceback and 1, an uncaught ``KeyboardInterrupt`` as death by SIGINT; non-daemon threads are joined,
    then the ``atexit`` functions run (logging's shutdown, ``weakref.finalize``) and the standard streams are flushed.
    What is skipped is the finalisation of every object still alive (the modules of torch, MONAI and Holoscan, then
    C++ static destructors): in a fork it writes to nearly every page it inherited, copying them, 1.7 s of CPU per
    run against 0.05 s without (``os._exit``). An object's ``__del__`` at exit and the tail of a file left unclosed
    are what a forked run would lose; ``WARM_PYTHON=0`` runs fresh.
    """
    import atexit

    code = 0
    if isinstance(raised, SystemExit):
        if raised.code is None or isinstance(raised.code, int):
            code = raised.code or 0
        else:
            print(raised.code, file=sys.stderr)
            code = 1
    elif raised is not None:
        sys.excepthook(type(raised), raised, raised.__traceback__)
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize does first: join non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if isinstance(raised, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    import runpy

    del sys.path[0]  # this file's folder, tests/: its packages would shadow installed ones (tests/packaging)
    from monai_triton_ops.console import prepare_process

    prepare_process(restart=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the test run is the worker's to handle
    kind, target = _serve(sys.argv[1])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except BaseException as exc:  # every way out of __main__ ends the run, as the interpreter's would
        _exit(exc)
    _exit(None)
