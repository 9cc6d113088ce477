"""A Python-backend stub that cannot start, or dies while its model loads, ends the start with one clear line.

Triton 2.51 waits forever for a stub that cannot link (a machine without ``libpython3.X.so.1.0``): the
server's start hung until its deadline, an app's load for 590 s. The stub here is the real one with its
``libpython`` dependency renamed (``broken_stub_home``), so the loader fails as it does on such a machine.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from monai_triton_ops.discovery import STUB_NAME
from monai_triton_ops.errors import ServerStartError
from monai_triton_ops.server import LocalTritonServer, ServerState, TritonInstall, find_tritonserver, logs, readiness
from monai_triton_ops.server.environment import server_environment
from monai_triton_ops.server.stub import model_stub, python_models, repository_stub_problems, stub_problem

from .conftest import MISSING_LIBPYTHON, assert_server_gone, write_model

MISSING = MISSING_LIBPYTHON.decode()
#: Lines the real 2.51 server wrote (one per case), with the timestamps and paths they had.
LOADER_LINE = (
    "/tmp/monai-triton-server-gw_96agv/backends/python/triton_python_backend_stub: error while loading shared "
    f"libraries: {MISSING}: cannot open shared object file: No such file or directory"
)
EXITED_LINE = (
    'E1203 22:09:23.506732 26654 backend_model.cc:692] "ERROR: Failed to create instance: Stub process '
    "'crash_0_0' is not healthy.\""
)
HEALTHY_LOG = """\
W1203 22:07:32.798887 20170 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, pinned memory \
pool will not be available: CUDA driver version is insufficient for CUDA runtime version"
E1203 22:07:32.799173 20170 server.cc:241] "CudaDriverHelper has not been initialized."
I1203 22:07:32.801049 20170 model_lifecycle.cc:472] "loading: m:1"
I1203 22:07:41.315599 20170 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: m_0_0 (CPU device 0)"
I1203 22:07:42.506898 20170 model_lifecycle.cc:839] "successfully loaded 'm'"
"""


# -- the log scanner --------------------------------------------------------------------------------
def test_a_stub_that_cannot_link_is_read_from_the_log() -> None:
    cause = logs.stub_failure(HEALTHY_LOG + LOADER_LINE + "\n")
    assert cause == (
        f"the Python backend stub cannot start: error while loading shared libraries: {MISSING}: cannot open "
        "shared object file: No such file or directory"
    )


def test_a_stub_that_died_while_loading_is_read_from_the_log() -> None:
    cause = logs.stub_failure(HEALTHY_LOG + EXITED_LINE + "\n")
    assert cause == "the Python backend stub exited while its model loaded: Stub process 'crash_0_0' is not healthy."


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "/opt/x/triton_python_backend_stub: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found "
            "(required by /opt/x/triton_python_backend_stub)",
            "cannot start: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found",
        ),
        ("Fatal Python error: init_fs_encoding: failed to get the Python codec", "cannot start its interpreter"),
        ("Failed to run python backend stub. Errno = 2 (No such file or directory)", "cannot start: Failed to run"),
    ],
    ids=["symbol-version", "interpreter", "exec"],
)
def test_other_stub_failures_are_read_from_the_log(line: str, expected: str) -> None:
    cause = logs.stub_failure(HEALTHY_LOG + line + "\n")
    assert cause is not None
    assert expected in cause


def test_a_healthy_log_has_no_stub_failure() -> None:
    assert logs.stub_failure(HEALTHY_LOG) is None


# -- the check before a start -----------------------------------------------------------------------
def test_the_installed_stub_starts_here(triton_install: TritonInstall) -> None:
    assert triton_install.stub_path is not None
    assert stub_problem(triton_install.stub_path, server_environment(triton_install)) is None


def test_a_stub_without_its_libpython_is_named_with_how_to_fix_it(broken_stub_home: Path) -> None:
    install = find_tritonserver(broken_stub_home)
    assert install.stub_path is not None
    problem = stub_problem(install.stub_path, server_environment(install))
    assert problem is not None
    assert "\n" not in problem
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert problem.startswith(
        f"the Python backend stub cannot start: error while loading shared libraries: {MISSING}: cannot open"
    )  # the loader's own words
    assert f"{str(install.stub_path)!r}, exit status 127" in problem
    assert f"; install the Python {version} shared library (Debian/Ubuntu: apt-get install libpython{version})" in (
        problem
    )


def test_a_stub_that_cannot_be_run_is_named_with_what_it_said(tmp_path: Path) -> None:
    """The in-process server hands Triton a wrapper script that execs the real stub: any stand-in is run, not
    inspected, so a wrapper whose stub is gone, or a file that is no program at all, is caught too."""
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(f"#!/bin/sh\nexec {tmp_path / 'gone' / STUB_NAME}\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    problem = stub_problem(wrapper, dict(os.environ))
    assert problem is not None
    assert problem.startswith("the Python backend stub cannot start: ")
    assert str(tmp_path / "gone" / STUB_NAME) in problem
    assert "exit status 127" in problem
    not_a_program = tmp_path / "stub"
    not_a_program.write_text("no program\n")
    problem = stub_problem(not_a_program, dict(os.environ))
    assert problem is not None
    assert "Permission denied" in problem


def test_python_models_are_found_by_their_config(tmp_path: Path) -> None:
    write_model(tmp_path, "b_model")
    write_model(tmp_path, "a_model")
    (tmp_path / "onnx" / "1").mkdir(parents=True)
    (tmp_path / "onnx" / "config.pbtxt").write_text('name: "onnx"\n# backend: "python"\nbackend: "onnxruntime"\n')
    (tmp_path / "libtorch" / "1").mkdir(parents=True)
    (tmp_path / "libtorch" / "config.pbtxt").write_text('name: "libtorch"\nplatform: "pytorch_libtorch"\n')
    write_model(tmp_path, "inferred")  # neither backend nor platform: Triton picks python for a model.py
    config = tmp_path / "inferred" / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "python"', ""))
    write_model(tmp_path, "unparsable")  # Triton reports the config itself; its model.py says python
    (tmp_path / "unparsable" / "config.pbtxt").write_text("name: {")
    assert python_models(tmp_path) == ["a_model", "b_model", "inferred", "unparsable"]
    assert model_stub(tmp_path / "onnx", Path("/x/stub")) is None


def test_a_models_own_stub_is_the_one_checked(
    triton_install: TritonInstall, broken_stub_home: Path, tmp_path: Path
) -> None:
    """Triton starts the stub in a model's folder when it has one (a stub for another Python)."""
    repo = write_model(write_model(tmp_path / "repo", "own"), "shared")
    broken = find_tritonserver(broken_stub_home).stub_path
    assert broken is not None
    (repo / "own" / STUB_NAME).symlink_to(broken)
    assert model_stub(repo / "shared", triton_install.stub_path) == triton_install.stub_path
    assert model_stub(repo / "own", triton_install.stub_path) == repo / "own" / STUB_NAME
    problems = repository_stub_problems(repo, triton_install.stub_path, server_environment(triton_install))
    ((problem, models),) = problems.items()
    assert models == ["own"]
    assert MISSING in problem


# -- the server ------------------------------------------------------------------------------------
@pytest.mark.triton
def test_a_stub_that_cannot_link_is_refused_before_anything_runs(
    make_server: Callable[..., LocalTritonServer], broken_stub_home: Path, tmp_path: Path
) -> None:
    repo = write_model(tmp_path / "repo", "add_one", expression="x + 1")
    server = make_server(repo, server_path=broken_stub_home, startup_timeout_s=120.0)
    with pytest.raises(ServerStartError, match=rf"^models \['add_one'\] cannot load: .* cannot start: .*{MISSING}"):
        server.start()
    assert server.pid is None, "nothing may be launched"
    assert server.state is ServerState.STOPPED


@pytest.mark.triton
def test_a_stub_failure_only_the_log_shows_ends_the_start_quoting_it(
    make_server: Callable[..., LocalTritonServer],
    broken_stub_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check cannot foresee every failure (an interpreter that will not start): the log is the backstop.

    Stands in for such a failure by skipping the check (the one thing not real here); the server and the stub's
    failure to link are. Before the scanner, this start waited out its whole deadline.
    """
    monkeypatch.setattr(readiness, "repository_stub_problems", lambda repository, default, env: {})
    repo = write_model(tmp_path / "repo", "add_one", expression="x + 1")
    server = make_server(repo, server_path=broken_stub_home, startup_timeout_s=30.0)  # a hang ends in "not ready"
    with pytest.raises(ServerStartError) as info:
        server.start()
    first = str(info.value).splitlines()[0]
    assert first == (
        "models ['add_one'] cannot load: the Python backend stub cannot start: error while loading shared libraries: "
        f"{MISSING}: cannot open shared object file: No such file or directory"
    )
    assert MISSING in info.value.log_tail
    assert server.pid is not None
    assert_server_gone(server.pid)


@pytest.mark.triton
@pytest.mark.slow
def test_a_stub_that_exits_in_initialize_ends_the_start_quoting_triton(
    make_server: Callable[..., LocalTritonServer], tmp_path: Path
) -> None:
    repo = write_model(tmp_path / "repo", "crash", initialize="import os\nos._exit(1)")
    server = make_server(repo, startup_timeout_s=60.0)
    with pytest.raises(ServerStartError) as info:
        server.start()
    assert str(info.value).splitlines()[0] == (
        "model 'crash' version 1 failed to load: Internal: Stub process 'crash_0_0' is not healthy."
    )
    assert server.pid is not None
    assert_server_gone(server.pid)
