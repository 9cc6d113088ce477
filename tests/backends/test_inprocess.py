"""The in-process ``triton`` backend beyond the contract: one shared server, exact dtypes, load errors, stop.

One repository per module (Python-backend kit models, cheap to load); every backend here shares the
process's one server, which the last close of the module stops. What needs a fresh interpreter (leaks,
interpreter exit, a missing library) runs in a subprocess, so a crash fails that test, not the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from monai_triton_ops import create_backend
from monai_triton_ops.backends import shared_server
from monai_triton_ops.backends.base import BaseBackend
from monai_triton_ops.backends.inprocess import InProcessBackend, TritonOptions, deserialize_bytes, serialize_bytes
from monai_triton_ops.errors import (
    BackendStateError,
    ConfigError,
    ModelLoadError,
)
from monai_triton_ops.server.discovery import find_triton_library

from .. import triton_models

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
    triton_models.slow(repo, "slow", delay_s=0.3)
    # Two models Triton cannot load: a config naming a backend this install does not have, and a Python model
    # whose initialize() raises.
    triton_models.passthrough(repo, "broken")
    config = repo / "broken" / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "python"', 'backend: "no_such_backend"'))
    tensor = [("INPUT__0", "TYPE_FP32", [-1])]
    triton_models.write_python_model(
        repo, "initfail", inputs=tensor, outputs=tensor, execute="pass", initialize="raise RuntimeError('no weights')"
    )
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = build(tmp_path_factory.mktemp("inprocess") / "repo")
    # One backend holds the server (and passthrough) for the module: tests open and close around it.
    with create_backend("triton", "passthrough", model_repository=path):
        yield path
    assert shared_server.current() is None


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
        assert one.server is two.server is shared_server.current()
        ready = {m["name"] for m in one.server.server.model_index(1).json()}
        assert {"passthrough", "other", "mixed"} <= ready
        assert "slow" not in ready  # explicit model control: only what was opened
    still = {m["name"] for m in shared_server.current().server.model_index(1).json()}  # type: ignore[union-attr]
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
    server = shared_server.current()
    assert server is not None  # the server the holder uses keeps running, and tried the load once
    assert server.log_path.read_text(errors="replace").count(f"failed to load '{model}' version 1") <= 1
    with open_backend(repo, "other") as other:
        (out,) = other.infer({"INPUT__0": np.ones(3, np.float32)}).values()
        np.testing.assert_array_equal(out, np.ones(3, np.float32))


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


def test_bytes_serialization_matches_tritons_layout() -> None:
    items = np.array([b"", b"a\x00\x00", "é".encode(), b"x" * 70000], dtype=np.object_)
    raw = serialize_bytes(items)
    assert raw[:4] == b"\x00\x00\x00\x00"
    assert raw[4:8] == b"\x03\x00\x00\x00"
    back = deserialize_bytes(np.frombuffer(raw, np.uint8), len(raw), (2, 2))
    assert back.reshape(-1).tolist() == items.tolist()


# -- in a fresh interpreter ---------------------------------------------------------------------------
def run_python(
    code: str, *, env: dict[str, str] | None = None, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=environ,
        check=False,
    )


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


def test_no_leaks_over_5000_requests_and_nothing_left_after_the_last_close(repo: Path) -> None:
    result = run_python(
        f"""
        import os, gc, threading
        import numpy as np
        from monai_triton_ops import create_backend
        from monai_triton_ops.backends import shared_server
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
        assert shared_server.current() is None
        print("rss", before, after, after / before)
        print("tasks", tasks_before, len(os.listdir("/proc/self/task")))
        print("handles", live_handles())
        print("pid", os.getpid())
        print("threads", [t.name for t in threading.enumerate()])
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
    pid = int(lines["pid"])
    assert not _stubs_of(pid)
    assert not list(Path("/dev/shm").glob(f"monai_triton_{pid}_*"))


def test_interpreter_exit_without_close_drains_and_exits_0(repo: Path) -> None:
    result = run_python(
        f"""
        import os, sys
        import numpy as np
        from monai_triton_ops import create_backend
        print(os.getpid(), flush=True)
        backend = create_backend("triton", "slow", model_repository={str(repo)!r}, max_in_flight=8).open()
        futures = [backend.submit({{"INPUT__0": np.ones(8, np.float32)}}) for _ in range(8)]
        sys.exit(0)
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for bad in ("FATAL", "terminate called", "Fatal Python error", "Segmentation fault"):
        assert bad not in result.stderr, result.stderr[-3000:]
    pid = int(result.stdout.split()[0])
    assert not _stubs_of(pid)
    assert not list(Path("/dev/shm").glob(f"monai_triton_{pid}_*"))
