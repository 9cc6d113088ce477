"""What the binding's tests share, in-process and in the subprocess cases: a started server and its checks.

A server here is the real ``libtritonserver`` from the wheel, in this process: ``start_server`` sets the
Python-backend stub environment (``server.environment``, as the local server does), assembles the backend
folder, gives the Python backend a shared-memory prefix of its own and loads the models explicitly;
``stop_server`` deletes it, then checks that no stub process and no shared-memory region of that prefix is
left, and restores the environment.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
#: A model load that takes longer is stuck (a numpy stub loads in a second, a torch one in ~10 s on a busy machine).
LOAD_TIMEOUT_S = 300.0


def light_import() -> None:
    """Make ``import monai_triton_ops.bindings`` (and ``.backends.inprocess.server``) skip the packages'
    ``__init__`` (torch, MONAI: ~5 s).

    Only for subprocess cases: they test the binding or the in-process server's owner, and each would
    otherwise spend most of its time importing.
    """
    for name in ("monai_triton_ops", "monai_triton_ops.backends"):
        if name in sys.modules:
            return
        package = types.ModuleType(name)
        package.__path__ = [str(REPO_ROOT / name.replace(".", "/"))]
        sys.modules[name] = package


@dataclass
class Started:
    """A running in-process server and what it was started with."""

    server: Any  # TRITONSERVER_Server
    workdir: Path
    log_path: Path
    shm_prefix: str
    saved_environ: dict[str, str] | None = None
    """The environment before ``start_server`` changed it (restored by ``stop_server``)."""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_server(
    repo: Path,
    workdir: Path,
    *,
    models: Sequence[str] = (),
    exit_timeout_s: int = 10,
    log_verbose: int = 0,
) -> Started:
    """Create the server over a symlink mirror of ``repo`` (explicit model control) and load ``models``.

    The mirror, as the backends use it: the stubs write ``__pycache__`` beside each ``model.py``, and a test must
    not write into a repository it does not own (the committed one).
    """
    from monai_triton_ops import bindings as b
    from monai_triton_ops.server.environment import assemble_backend_dir, server_environment, shm_prefix
    from monai_triton_ops.server.mirror import mirror_repository

    library = b.load_library()
    assert library.install is not None, "the wheel's library comes with its install"
    saved = dict(os.environ)
    os.environ.update(server_environment(library.install))
    workdir.mkdir(parents=True, exist_ok=True)
    backends = assemble_backend_dir(library.install, workdir / "backends")
    prefix = shm_prefix()
    log_path = workdir / "triton.log"
    options = b.TRITONSERVER_ServerOptions()
    served = mirror_repository(repo, workdir / "repository")
    options.set_model_repository_path(served).set_backend_directory(backends)
    options.set_model_control_mode(b.TRITONSERVER_ModelControlMode.EXPLICIT)
    options.set_exit_timeout(exit_timeout_s).set_log_file(log_path).set_log_verbose(log_verbose)
    options.set_pinned_memory_pool_byte_size(0).set_gpu_metrics(False).set_strict_readiness(True)
    options.set_backend_config("python", "shm-region-prefix-name", prefix)
    server = b.TRITONSERVER_Server(options)
    options.delete()
    started = Started(server=server, workdir=workdir, log_path=log_path, shm_prefix=prefix, saved_environ=saved)
    # One after another, as the in-process server's owner loads (under inprocess.shared's lock): with several
    # loads at once, Triton 2.51 starts their stubs from several threads at once, and now and then one
    # instance never finishes initialising (the log stops at "TRITONBACKEND_ModelInstanceInitialize", the
    # load waits forever: the hang of a CI run, seen again here once in a few runs). A numpy stub loads in
    # well under a second, so sequential costs little.
    loading = concurrent.futures.ThreadPoolExecutor(1)
    try:
        for model in models:
            # bounded: a load stuck in C must fail the test, not hang the run (joining its thread would)
            loading.submit(server.load_model, model).result(timeout=LOAD_TIMEOUT_S)
    finally:
        loading.shutdown(wait=False, cancel_futures=True)
    return started


def stop_server(started: Started, *, check: bool = True) -> None:
    """Delete the server; then no stub and no shared memory of its prefix may be left."""
    from monai_triton_ops.bindings import State

    try:
        server = started.server
        # the binding refuses to delete a server with requests in flight: let a test's last ones land
        assert wait_until(lambda: server.owner_state is not State.OWNED or not server.in_flight, timeout_s=30)
        if server.owner_state is State.OWNED and not server.stop_failed:
            server.set_exit_timeout(60)  # nothing in flight: only model unloading is left, slow on a busy machine
            server.delete()
        if check:
            # a stub whose server was deleted past its exit timeout notices within a second and exits
            gone = wait_until(lambda: not stub_pids(started.shm_prefix), timeout_s=10)
            assert gone, f"stub processes left: {stub_pids(started.shm_prefix)}"
            assert not shm_regions(started.shm_prefix), f"shared memory left: {shm_regions(started.shm_prefix)}"
    finally:
        if started.saved_environ is not None:
            os.environ.clear()
            os.environ.update(started.saved_environ)
        shutil.rmtree(started.workdir / "backends", ignore_errors=True)
        shutil.rmtree(started.workdir / "repository", ignore_errors=True)


@contextlib.contextmanager
def case_server(build: Callable[[Path], object], models: Sequence[str], **options: Any) -> Iterator[Started]:
    """For subprocess cases: a repository built by ``build``, a server over it, all removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="binding_case_"))
    try:
        build(folder / "repo")
        started = start_server(folder / "repo", folder / "work", models=models, **options)
        try:
            yield started
        finally:
            stop_server(started)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def stub_pids(prefix: str) -> list[int]:
    """Python backend stubs whose command line names a region of ``prefix`` (they are this process's children)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"triton_python_backend_stub" in cmdline and prefix.encode() in cmdline:
            pids.append(int(entry))
    return pids


def shm_regions(prefix: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}*"))


def thread_count() -> int:
    """OS threads of this process (Triton's threads are not Python threads)."""
    return len(os.listdir("/proc/self/task"))


def malloc_checked_environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with glibc's heap checks on: ``MALLOC_CHECK_=3`` (abort on a double
    free, an overrun or a corrupted heap), and from glibc 2.34 on the library that implements it preloaded:
    the variable alone does nothing there. ``test_ownership.py``'s canary proves a run has them."""
    env = dict(os.environ if base is None else base)
    env["MALLOC_CHECK_"] = "3"
    library = malloc_debug_library()
    if library is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [library, env.get("LD_PRELOAD", "")]))
    return env


def malloc_debug_library() -> str | None:
    """``libc_malloc_debug.so.0`` next to this process's libc (``None`` before glibc 2.34, which needs none)."""
    version = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0").split()[-1]
    if tuple(int(part) for part in version.split(".")[:2]) < (2, 34):
        return None
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if Path(path).name.startswith("libc.so"):
            candidate = Path(path).parent / "libc_malloc_debug.so.0"
            if candidate.exists():
                return str(candidate)
    import ctypes.util

    found = ctypes.util.find_library("c_malloc_debug")  # a soname the dynamic loader finds itself
    if found is None:
        raise RuntimeError(f"glibc {version} checks the heap only with libc_malloc_debug.so.0, which is not here")
    return found


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


# -- inference through the binding alone ---------------------------------------------------------------
@dataclass
class Outcome:
    """What one inference's callbacks collected."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    responses: int = 0
    flags: list[int] = field(default_factory=list)


def _collect(response: Any, flags: int, outcome: Outcome) -> None:
    outcome.flags.append(int(flags))
    if response is None:
        return
    outcome.responses += 1
    for index in range(response.output_count):
        outcome.outputs[response.output(index).name] = response.output_array(index)


def make_request(server: Any, model: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str] = ()) -> Any:
    from monai_triton_ops import bindings as b

    request = b.TRITONSERVER_InferenceRequest(server, model)
    for name, array in inputs.items():
        request.add_input(name, b.triton_dtype(array.dtype), array.shape)
        request.append_input_data(name, array)
    for name in outputs:
        request.add_requested_output(name)
    return request


def submit(
    server: Any,
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Iterable[str] = (),
    *,
    allocator: Any = None,
) -> tuple[concurrent.futures.Future[None], Outcome]:
    """Start one inference; the future completes when Triton is done with it."""
    from monai_triton_ops import bindings as b

    request = make_request(server, model, inputs, outputs)
    outcome = Outcome()
    request.set_response_callback(allocator or b.ArrayAllocator(), None, _collect, outcome)
    return server.infer_async(request), outcome


def infer(
    server: Any, model: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str] = (), *, timeout_s: float = 60
) -> dict[str, np.ndarray]:
    future, outcome = submit(server, model, inputs, outputs)
    future.result(timeout_s)
    return outcome.outputs
