"""The in-process ``triton`` backend beyond the contract: one shared server, exact dtypes, load errors, stop.

One repository per module (Python-backend kit models, cheap to load); every backend here shares the
process's one server, which the last close of the module stops. What needs a fresh interpreter (leaks and
interpreter exit, a missing library, a dead stub) runs in a subprocess (the end with requests in flight:
``test_inprocess_exit.py``), so a crash fails that test, not the suite; the owner-level children import only the
binding and ``inprocess.server`` (no torch), the backend-level ones the whole package.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from monai_triton_ops import create_backend
from monai_triton_ops.backends.base import BaseBackend
from monai_triton_ops.backends.inprocess import shared
from monai_triton_ops.backends.inprocess.backend import (
    InProcessBackend,
    TritonOptions,
    deserialize_bytes,
    serialize_bytes,
)
from monai_triton_ops.discovery import find_triton_library
from monai_triton_ops.errors import (
    BackendStateError,
    BackendUnavailableError,
    ConfigError,
    ModelLoadError,
)
from monai_triton_ops.server.process import proc_stat

from .. import triton_models, warm_python
from ..server.conftest import wait_until

pytestmark = [
    pytest.mark.triton,
]
ROOT = Path(__file__).resolve().parents[2]
DTYPES = ("TYPE_FP32", "TYPE_INT64", "TYPE_UINT8", "TYPE_BOOL", "TYPE_FP16", "TYPE_INT32")


def _has_library() -> bool:
    try:
        find_triton_library()
    except Exception:
        return False
    return True


if not _has_library():
    pytest.skip("no libtritonserver here (pip install --no-deps nvidia-pytriton)", allow_module_level=True)


def build(repo: Path) -> Path:
    triton_models.identity(repo, "mixed", dtypes=DTYPES, dims=(-1, -1))
    triton_models.passthrough(repo)
    triton_models.passthrough(repo, "other")
    triton_models.passthrough(repo, "slow", delay_s=0.3)
    triton_models.crashing(repo)
    # Two models Triton cannot load: a config naming a backend this install does not have, and a Python model
    # whose initialize() raises.
    triton_models.passthrough(repo, "broken")
    config = repo / "broken" / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "python"', 'backend: "no_such_backend"'))
    tensor = [("INPUT__0", "TYPE_FP32", [-1])]
    triton_models.write_python_model(
        repo, "initfail", inputs=tensor, outputs=tensor, execute="pass", initialize="raise RuntimeError('no weights')"
    )
    # Python models whose stub cannot start or dies while loading (the fail-fast load)
    triton_models.passthrough(repo, "nolib")
    broken_stub(repo / "nolib" / "triton_python_backend_stub")
    triton_models.write_python_model(
        repo,
        "initexit",
        inputs=tensor,
        outputs=tensor,
        execute="pass",
        initialize="import sys; print('initexit: cannot find the weights', file=sys.stderr, flush=True); os._exit(3)",
    )
    return repo


def broken_stub(dest: Path) -> Path:
    """A copy of this install's stub that links a libpython which does not exist: the real dynamic loader fails
    as on a host without ``libpython3.X.so.1.0``. Triton starts a model's own stub when its folder has one."""
    library = find_triton_library()
    assert library.install is not None
    assert library.install.stub_path is not None
    data = library.install.stub_path.read_bytes()
    name = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0".encode()
    assert data.count(name) == 1, "the stub names its libpython once"
    dest.write_bytes(data.replace(name, name[:-3] + b"9.9"))  # same length: the ELF stays valid
    dest.chmod(0o755)
    return dest


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = build(tmp_path_factory.mktemp("inprocess") / "repo")
    # One backend holds the server (and passthrough) for the module: tests open and close around it.
    with create_backend("triton", "passthrough", model_repository=path):
        yield path
    assert shared.current() is None


def open_backend(repo: Path, model: str, **options: object) -> BaseBackend:
    return create_backend("triton", model, model_repository=repo, **options).open()


def test_mixed_dtypes_multi_input_multi_output_round_trip_exactly(repo: Path) -> None:
    rng = np.random.default_rng(0)
    with open_backend(repo, "mixed") as backend:
        sig = backend.signature
        inputs = {
            "INPUT__0": rng.standard_normal((3, 5)).astype(np.float32),
            "INPUT__1": rng.integers(-(2**62), 2**62, (3, 5), dtype=np.int64),
            "INPUT__2": rng.integers(0, 255, (3, 5), dtype=np.uint8),
            "INPUT__3": rng.integers(0, 2, (3, 5)).astype(np.bool_),
            "INPUT__4": rng.standard_normal((3, 5)).astype(np.float16),
            "INPUT__5": np.arange(15, dtype=np.int32).reshape(5, 3).T,  # not contiguous: sent as a copy
        }
        out = backend.infer(inputs)
        assert list(out) == list(sig.output_names)
        for i, name in enumerate(sig.output_names):
            np.testing.assert_array_equal(out[name], inputs[f"INPUT__{i}"])
            assert out[name].dtype == inputs[f"INPUT__{i}"].dtype
        torch_out = backend.infer({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in inputs.items()})
        assert all(isinstance(v, torch.Tensor) for v in torch_out.values())
        chosen = backend.infer(inputs, outputs=["OUTPUT__3", "OUTPUT__1"])
        assert list(chosen) == ["OUTPUT__1", "OUTPUT__3"]


def test_outputs_are_the_allocators_arrays_handed_over_without_a_copy(repo: Path) -> None:
    with open_backend(repo, "other") as backend:
        x = np.arange(1000, dtype=np.float32)
        (out,) = backend.infer({"INPUT__0": x}).values()
        assert not out.flags.owndata  # a view of the uint8 buffer Triton wrote into
        assert out.base is not None
        assert out.base.dtype == np.uint8
        assert out.base.nbytes == x.nbytes
        np.testing.assert_array_equal(out, x)


def test_output_buffers_come_back_for_the_next_request_but_never_under_a_kept_result(repo: Path) -> None:
    with open_backend(repo, "other") as backend:
        assert isinstance(backend, InProcessBackend)
        x = np.arange(4096, dtype=np.float32)
        for i in range(20):  # results dropped at once (a sliding window): one buffer goes round
            backend.infer({"INPUT__0": x + i})
        assert backend._buffers.created == 1
        kept = [backend.infer({"INPUT__0": x + i})["OUTPUT__0"] for i in range(5)]
        for i in range(50):
            backend.infer({"INPUT__0": x - i})
        for i, out in enumerate(kept):
            np.testing.assert_array_equal(out, x + i)  # never written again while the caller holds it


def test_threads_calling_infer_concurrently_get_their_own_results(repo: Path) -> None:
    with open_backend(repo, "other", max_in_flight=4) as backend:
        results: dict[int, list[np.ndarray]] = {i: [] for i in range(6)}

        def work(i: int) -> None:
            for j in range(20):
                (out,) = backend.infer({"INPUT__0": np.full(64, i * 100 + j, np.float32)}).values()
                results[i].append(out)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        for i, outs in results.items():
            assert [int(o[0]) for o in outs] == [i * 100 + j for j in range(20)]


def test_two_backends_on_two_models_share_one_server(repo: Path) -> None:
    with open_backend(repo, "other") as one, open_backend(repo, "mixed") as two:
        assert isinstance(one, InProcessBackend)
        assert isinstance(two, InProcessBackend)
        assert one.server is two.server is shared.current()
        ready = {m["name"] for m in one.server.server.model_index(1).json()}
        assert {"passthrough", "other", "mixed"} <= ready
        assert "slow" not in ready  # explicit model control: only what was opened
    still = {m["name"] for m in shared.current().server.model_index(1).json()}  # type: ignore[union-attr]
    assert "mixed" not in still
    assert "passthrough" in still


def test_close_with_requests_in_flight_lets_them_finish_then_the_model_reopens(repo: Path) -> None:
    backend = open_backend(repo, "slow", max_in_flight=8)
    futures = [backend.submit({"INPUT__0": np.full(4, i, np.float32)}) for i in range(8)]
    backend.close(timeout_s=60)
    for i, future in enumerate(futures):
        (out,) = future.result(timeout=0).values()
        assert out[0] == i
    with pytest.raises(BackendStateError):
        backend.infer({"INPUT__0": np.zeros(4, np.float32)})
    for _ in range(3):  # unload then load again at once: the model comes back and answers
        with open_backend(repo, "slow") as again:
            (out,) = again.infer({"INPUT__0": np.ones(8, np.float32)}).values()
            assert out.sum() == 8


@pytest.mark.parametrize(("model", "reason"), [("broken", "no_such_backend"), ("initfail", "RuntimeError: no weights")])
def test_a_model_that_fails_to_load_gives_tritons_own_message_at_once(repo: Path, model: str, reason: str) -> None:
    backend = create_backend("triton", model, model_repository=repo)
    with pytest.raises(ModelLoadError, match=rf"model '{model}' failed to load.*{reason}"):
        backend.open()
    server = shared.current()
    assert server is not None  # the server the holder uses keeps running, and tried the load once
    assert server.log_path.read_text(errors="replace").count(f"failed to load '{model}' version 1") <= 1
    with open_backend(repo, "other") as other:
        (out,) = other.infer({"INPUT__0": np.ones(3, np.float32)}).values()
        np.testing.assert_array_equal(out, np.ones(3, np.float32))


def _open_within(seconds: float, open_: Callable[[], object]) -> BaseException | None:
    """``open_()`` on a thread: the exception it raised (``None`` if it opened); fails if it still runs after
    ``seconds`` (a load that never ends: the failure these tests exist for)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            open_()
        except BaseException as exc:
            raised.append(exc)
        else:
            raised.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the load still had not ended after {seconds} s"
    return raised[0]


def test_a_stub_that_cannot_link_its_libpython_fails_the_load_at_once_quoting_the_loader(repo: Path) -> None:
    """Finding 7: a Python-backend stub without its ``libpython3.X.so.1.0`` left the load blocked forever."""
    error = _open_within(30, lambda: create_backend("triton", "nolib", model_repository=repo).open())
    assert isinstance(error, BackendUnavailableError), repr(error)  # an app exits 3 (test below)
    message = str(error)
    assert "\n" not in message
    assert "model 'nolib'" in message
    assert re.search(r"error while loading shared libraries: libpython3\.\d+\.so\.9\.9: cannot open", message), message
    with open_backend(repo, "other") as other:  # the server runs on, and Triton never saw the stub
        np.testing.assert_array_equal(other.infer({"INPUT__0": np.ones(2, np.float32)})["OUTPUT__0"], [1, 1])


def test_a_stub_that_exits_while_its_model_loads_fails_the_load_quoting_what_it_said(repo: Path) -> None:
    error = _open_within(30, lambda: create_backend("triton", "initexit", model_repository=repo).open())
    assert isinstance(error, BackendUnavailableError), repr(error)
    message = str(error)
    assert "\n" not in message
    assert "model 'initexit'" in message
    assert "exited with status 3" in message
    assert "initexit: cannot find the weights" in message  # the stub's own stderr, through the server's pipe
    with open_backend(repo, "other") as other:
        np.testing.assert_array_equal(other.infer({"INPUT__0": np.ones(2, np.float32)})["OUTPUT__0"], [1, 1])


def test_the_repository_is_left_as_it_was(repo: Path, tmp_path: Path) -> None:
    fresh = triton_models.passthrough(tmp_path / "repo", "fresh")
    before = sorted(p.relative_to(fresh) for p in fresh.rglob("*"))
    with open_backend(fresh, "fresh") as backend:
        backend.infer({"INPUT__0": np.ones(4, np.float32)})
    assert sorted(p.relative_to(fresh) for p in fresh.rglob("*")) == before  # no __pycache__ beside model.py


def test_options_are_typed_from_the_spec_and_the_server_runs_with_one_set(repo: Path) -> None:
    backend = create_backend(
        "triton?log_verbose=1&exit_timeout_s=5&shm_default_byte_size=2097152&backend_config=python:a=1,python:b=2",
        "other",
        model_repository=repo,
    )
    options = backend.options
    assert isinstance(options, TritonOptions)
    assert (options.log_verbose, options.exit_timeout_s) == (1, 5)
    assert options.backend_settings() == (
        ("python", "shm-default-byte-size", "2097152"),
        ("python", "a", "1"),
        ("python", "b", "2"),
    )
    with pytest.raises(ConfigError, match="already runs with other server options"):
        backend.open()
    with pytest.raises(ConfigError, match="not 'backend:setting=value'"):
        TritonOptions(backend_config=("python-no-colon",))
    with pytest.raises(ConfigError, match="takes no server URL"):
        InProcessBackend("other", model_repository=repo, urls=("grpc://h:1",))


@pytest.mark.parametrize(
    ("items", "shape"),
    [
        ([b"", b"a\x00\x00", "é".encode(), b"x" * 70000], (4,)),  # empty, trailing NULs, UTF-8, > 64 KiB
        ([b"", b"a\x00\x00", "é".encode(), b"x" * 70000, b"\x00", b"tail"], (2, 3)),
        ([], (0,)),
    ],
    ids=["vector", "matrix", "empty"],
)
def test_bytes_serialization_matches_tritonclient(items: list[bytes], shape: tuple[int, ...]) -> None:
    """Triton's BYTES layout as ``tritonclient`` writes and reads it (pitfall A12), both ways."""
    from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    array = array.reshape(shape)
    ours = serialize_bytes(array)
    theirs = serialize_byte_tensor(array)
    assert ours == (theirs.item() if theirs.size else b"")
    back = deserialize_bytes(np.frombuffer(ours, np.uint8), len(ours), shape)
    assert back.shape == shape
    assert back.reshape(-1).tolist() == items
    assert deserialize_bytes_tensor(ours).tolist() == items


# -- in a fresh interpreter ---------------------------------------------------------------------------
def run_python(
    code: str, *, env: dict[str, str] | None = None, timeout_s: float = 300, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=environ,
        check=False,
    )


#: What a crash on the way out prints (CPython, glibc, the C++ runtime, the shell).
CRASH_SIGNS = ("Fatal Python error", "Segmentation fault", "terminate called", "FATAL", "Aborted")

#: An owner-level child: the binding and ``inprocess.server`` only (no torch), the repository in argv[1].
OWNER_PRELUDE = """
import faulthandler, os, sys, time
sys.path.insert(0, os.getcwd())
from tests.bindings.harness import light_import
light_import()
import numpy as np
from pathlib import Path
from monai_triton_ops import bindings as b
from monai_triton_ops.backends.inprocess.server import InProcessServer, ServerSettings
from tests.bindings.harness import Outcome, _collect, make_request

REPO = Path(sys.argv[1])
print("pid", os.getpid(), flush=True)


def open_server(exit_timeout_s, *models):
    server = InProcessServer(ServerSettings(exit_timeout_s=exit_timeout_s), REPO)
    for model in models:
        server.load(model, REPO)
    return server


def submit(server, model, value):
    request = make_request(server.server, model, {"INPUT__0": np.full(2, value, np.float32)})
    outcome = Outcome()
    request.set_response_callback(b.ArrayAllocator(), None, _collect, outcome)
    return server.submit(request), outcome
"""


def run_owner_child(body: str, repo: Path, *, timeout_s: float = 120) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``body`` after :data:`OWNER_PRELUDE`; returns the result and the child's pid (its stubs' prefix)."""
    result = run_python(OWNER_PRELUDE + textwrap.dedent(body), args=(str(repo),), timeout_s=timeout_s)
    match = re.search(r"^pid (\d+)$", result.stdout, re.MULTILINE)
    assert match, f"the child did not start: {result.stderr[-3000:]}"
    return result, int(match.group(1))


def _stubs_of(pid: int) -> list[str]:
    """Python backend stubs whose shm prefix names process ``pid`` (``monai_triton_<pid>_``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"triton_python_backend_stub" in cmdline and f"monai_triton_{pid}_".encode() in cmdline:
                found.append(entry)
    return found


def assert_clean_exit(result: subprocess.CompletedProcess[str], pid: int) -> None:
    """Exit code 0, no crash on the way out, and 3 s later no stub, shared memory or temporary folder of the child."""
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stderr[-3000:]}"
    for sign in CRASH_SIGNS:
        assert sign not in result.stderr, result.stderr[-3000:]
    time.sleep(3)
    assert not _stubs_of(pid), f"stubs of {pid} left: {_stubs_of(pid)}"
    assert not list(Path("/dev/shm").glob(f"monai_triton_{pid}_*"))
    assert not list(Path(tempfile.gettempdir()).glob(f"monai_triton_inprocess_{pid}_*"))


def test_a_stub_that_died_ends_its_requests_and_the_server_without_waiting(repo: Path) -> None:
    """A model whose stub exits: its requests fail, Triton can never unload it, so the owner leaves the server
    undeleted (no exit-timeout wait, no crash) and the process still exits cleanly."""
    body = """
    server = open_server(60, "crashing")
    for value in (-1.0, 1.0):  # the stub calls os._exit; then the next request: both fail, neither hangs
        future, _ = submit(server, "crashing", value)
        try:
            future.result(30)
        except b.TritonError as exc:
            print("failed", type(exc).__name__, flush=True)
    ending = server.close()
    print("deleted", ending.deleted, "reason", ending.reason, flush=True)
    sys.exit(0)
    """
    result, pid = run_owner_child(body, repo)
    assert_clean_exit(result, pid)
    assert result.stdout.count("failed InternalError") == 2, result.stdout
    assert "deleted False reason 1 stub(s) died" in result.stdout, result.stdout


ORPHAN_A_BLOCKED_STUB = """
import signal
server = open_server(60, "passthrough")
from monai_triton_ops.backends.inprocess import stubs
pids = stubs.stub_pids(server.shm_prefix)
print("stubs", *pids, flush=True)
for pid in pids:  # blocked, it cannot notice that its app died (as the one seen deadlocked on a futex)
    os.kill(pid, signal.SIGSTOP)
time.sleep(0.2)
print("states", *(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] for pid in pids), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _state(pid: int) -> str | None:
    """The process state letter from ``/proc/<pid>/stat`` (``T``: stopped), else None (gone)."""
    stat = proc_stat(pid)
    return stat[1][0] if stat is not None else None


def test_a_stub_left_blocked_by_a_killed_app_is_ended_by_the_next_server_start(repo: Path, tmp_path: Path) -> None:
    """A stub whose app was killed while the stub could not run kept running (one deadlocked for 18 min, holding
    its app's output pipes); the next in-process start ends it and its region. Output goes to files: the
    orphan holds whatever pipes its app had. Any server start ends such stubs, so under parallel tests another
    worker's start may come first; without the cleanup nothing ends a stopped stub, and the test fails."""
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        killed = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(OWNER_PRELUDE + ORPHAN_A_BLOCKED_STUB), str(repo)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=sink, stderr=subprocess.STDOUT,
            timeout=120, check=False,
        )  # fmt: skip
    said = out.read_text()
    assert killed.returncode == -9, said[-3000:]
    app = int(re.findall(r"^pid (\d+)$", said, re.MULTILINE)[0])
    orphans = [int(p) for p in re.findall(r"^stubs (.*)$", said, re.MULTILINE)[0].split()]
    try:
        assert orphans, said[-3000:]
        assert re.findall(r"^states (.*)$", said, re.MULTILINE)[0].split() == ["T"] * len(orphans), said[-3000:]
        started, _ = run_owner_child("server = open_server(60, 'passthrough'); server.close(); sys.exit(0)", repo)
        assert started.returncode == 0, started.stderr[-3000:]
        assert wait_until(lambda: all(_state(p) in (None, "Z") for p in orphans), 5), [_state(p) for p in orphans]
        assert not list(Path("/dev/shm").glob(f"monai_triton_{app}_*"))
        ended = re.search(
            r"ended \d+ Python-backend stub\(s\) left running by dead processes: pids \[(.*)\]", started.stderr
        )
        if ended:  # this start found them (else another worker's start did): it names them
            assert set(orphans) <= {int(p) for p in ended.group(1).split(", ")}, started.stderr[-3000:]
    finally:
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_stub_that_never_starts_leaves_the_load_within_30_s_and_the_process_exits_cleanly(
    repo: Path, tmp_path: Path
) -> None:
    """The launch fails before the stub's first message (here: a broken ``EXECUTION_ENV_PATH`` environment),
    where the stub preflight cannot see it: Triton waits forever, the owner's watch ends the load."""
    stuck = tmp_path / "repo"
    triton_models.passthrough(stuck, "ok")
    triton_models.passthrough(stuck, "stuck")
    environment = tmp_path / "broken_env.tar.gz"
    with tarfile.open(environment, "w:gz") as tar:
        script = b"echo 'activate: this environment is broken' >&2\nreturn 1\n"
        info = tarfile.TarInfo("bin/activate")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    config = stuck / "stuck" / "config.pbtxt"
    config.write_text(
        config.read_text() + f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{environment}" }} }}\n'
    )
    body = """
    server = open_server(5, "ok")
    faulthandler.dump_traceback_later(30, exit=True)  # the load must end within 30 s
    try:
        server.load("stuck", REPO)
    except b.UnavailableError as exc:
        print("load failed:", exc, flush=True)
    faulthandler.cancel_dump_traceback_later()
    ending = server.close()
    print("deleted", ending.deleted, "reason", ending.reason, flush=True)
    sys.exit(0)
    """
    result, pid = run_owner_child(body, stuck)
    assert_clean_exit(result, pid)
    assert "model 'stuck': its Python backend stub's launcher" in result.stdout, result.stdout
    assert "exited with status 1" in result.stdout
    assert "deleted False reason models stuck loading ['stuck']" in result.stdout


@pytest.mark.slow
def test_an_app_whose_model_stub_cannot_start_exits_3_with_one_line(tmp_path: Path) -> None:
    """The App SDK sample app (``apps/minimal``) with ``--backend triton`` on a model whose stub cannot link."""
    repo = tmp_path / "models"
    triton_models.identity(repo, "minimal_seg")  # a Python-backend model: it never gets to run
    torch.jit.save(torch.jit.script(torch.nn.Identity()), repo / "minimal_seg" / "1" / "model.pt")  # the app checks it
    broken_stub(repo / "minimal_seg" / "triton_python_backend_stub")
    image = tmp_path / "image.nii.gz"
    made = warm_python.run([sys.executable, str(ROOT / "apps" / "minimal" / "make_input.py"), "--out", str(image)])
    assert made.returncode == 0, made.stderr[-2000:]
    app = [sys.executable, str(ROOT / "apps" / "minimal"), "-i", str(image), "-o", str(tmp_path / "out")]
    result = warm_python.run([*app, "-m", str(repo), "--backend", "triton"], timeout=300)
    assert result.returncode == 3, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert (
        "model 'minimal_seg': the Python backend stub cannot start: error while loading shared libraries" in errors[0]
    )
    assert "Traceback" not in result.stderr


def test_a_missing_library_is_backend_unavailable_with_the_install_hint(repo: Path, tmp_path: Path) -> None:
    result = run_python(
        f"""
        from monai_triton_ops import create_backend
        try:
            create_backend("triton", "passthrough", model_repository={str(repo)!r}).open()
        except Exception as exc:
            print(type(exc).__name__, exc)
        """,
        env={"TRITONSERVER_LIB": str(tmp_path / "nowhere.so")},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("BackendUnavailableError"), result.stdout
    assert "nvidia-pytriton" in result.stdout
    assert "TRITONSERVER_HOME" in result.stdout


def test_no_leaks_over_5000_requests_nothing_left_at_the_last_close_and_exit_without_close(repo: Path) -> None:
    """One interpreter, two process-level properties: 5,000 requests keep RSS flat and the last close leaves
    no thread, handle, stub or region; then a backend left open with 8 requests in flight at exit drains."""
    result = run_python(
        f"""
        import os, gc, sys, threading
        import numpy as np
        from monai_triton_ops import create_backend
        from monai_triton_ops.backends.inprocess import shared
        from monai_triton_ops.bindings import live_handles

        def rss():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024

        tasks_before = len(os.listdir("/proc/self/task"))
        backend = create_backend("triton", "other", model_repository={str(repo)!r}).open()
        x = np.ones(256, np.float32)
        for _ in range(300):
            backend.infer({{"INPUT__0": x}})
        gc.collect()
        before = rss()
        for _ in range(5000):
            backend.infer({{"INPUT__0": x}})
        gc.collect()
        after = rss()
        backend.close()
        assert shared.current() is None
        print("rss", before, after, after / before)
        print("tasks", tasks_before, len(os.listdir("/proc/self/task")))
        print("handles", live_handles())
        print("pid", os.getpid())
        print("threads", [t.name for t in threading.enumerate()])
        sys.stdout.flush()
        backend = create_backend("triton", "slow", model_repository={str(repo)!r}, max_in_flight=8).open()
        futures = [backend.submit({{"INPUT__0": np.ones(8, np.float32)}}) for _ in range(8)]
        sys.exit(0)
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    ratio = float(lines["rss"].split()[2])
    assert ratio <= 1.05, lines["rss"]
    tasks_before, tasks_after = map(int, lines["tasks"].split())
    assert tasks_after <= tasks_before, lines
    assert lines["handles"] == "0"
    assert "'MainThread'" in lines["threads"]
    assert "triton" not in lines["threads"]
    assert_clean_exit(result, int(lines["pid"]))
