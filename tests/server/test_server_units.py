"""The launcher's parts that need no running server: options, discovery errors, environment, log parsing, ports."""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from monai_triton_ops import discovery
from monai_triton_ops.errors import ConfigError, ModelNotFoundError, ServerError, ServerNotFoundError
from monai_triton_ops.server import (
    LocalTritonServer,
    ServerOptions,
    ServerState,
    find_tritonserver,
    load_settings,
    logs,
)
from monai_triton_ops.server.environment import assemble_backend_dir, server_environment
from monai_triton_ops.server.options import Ports, build_argv
from monai_triton_ops.server.ports import pick_free_ports, port_is_free

HINT = "pip install --no-deps nvidia-pytriton==0.7.0"


# -- options ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"http_port": 0}, "http_port"),
        ({"grpc_port": 70000}, "grpc_port"),
        ({"metrics_port": "8002"}, "metrics_port"),
        ({"http_port": 8000, "grpc_port": 8000}, "grpc_port"),
        ({"startup_timeout_s": 0}, "startup_timeout_s"),
        ({"stop_timeout_s": float("inf")}, "stop_timeout_s"),
        ({"log_verbose": -1}, "log_verbose"),
        ({"model_control_mode": "poll"}, "model_control_mode"),
        ({"models": ["ok", "not/safe"]}, "models"),
        ({"models": "add_one"}, "models"),
        ({"model_load_thread_count": 0}, "model_load_thread_count"),
        ({"model_load_thread_count": True}, "model_load_thread_count"),
        ({"extra_args": "--foo"}, "extra_args"),
    ],
)
def test_invalid_options_name_the_field(tmp_path: Path, options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        LocalTritonServer(tmp_path, **options)  # type: ignore[arg-type]


def test_argv_is_loopback_only_with_explicit_ports(tmp_path: Path) -> None:
    options = ServerOptions(model_repository=tmp_path, model_control_mode="explicit", models=("a", "b"))
    argv = build_argv(
        options, server_path=Path("/x/tritonserver"), backend_dir=tmp_path / "b", ports=Ports(1, 2, 3), exit_timeout_s=7
    )
    assert argv[0] == "/x/tritonserver"
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"):
        assert flag in argv
    for flag in ("--http-port=1", "--grpc-port=2", "--metrics-port=3", "--exit-timeout-secs=7"):
        assert flag in argv
    assert argv[-2:] == ["--load-model=a", "--load-model=b"]


def test_lifecycle_without_start(tmp_path: Path) -> None:
    server = LocalTritonServer(tmp_path)
    assert server.state is ServerState.NEW
    assert server.pid is None
    assert not server.is_alive()
    with pytest.raises(ServerError, match="before start"):
        _ = server.grpc_url
    server.stop()
    server.stop()
    assert server.state is ServerState.STOPPED
    with pytest.raises(ServerError, match="create a new one"):
        server.start()


def test_missing_repository_is_reported_before_anything_runs(tmp_path: Path) -> None:
    server = LocalTritonServer(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="nope"):
        server.start()
    assert server.pid is None
    assert server.workdir is None
    assert server.state is ServerState.STOPPED


# -- discovery --------------------------------------------------------------------------------------
def test_explicit_bad_server_path(tmp_path: Path) -> None:
    server = LocalTritonServer(tmp_path, server_path=tmp_path / "no" / "tritonserver")
    with pytest.raises(ServerNotFoundError, match="server_path") as info:
        server.start()
    assert HINT in str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert server.pid is None
    assert server.workdir is None


def test_server_path_not_executable(tmp_path: Path) -> None:
    binary = tmp_path / "tritonserver"
    binary.write_text("not a program")
    with pytest.raises(ServerNotFoundError, match="not executable"):
        find_tritonserver(binary)


def test_home_env_pointing_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONSERVER_HOME", str(tmp_path / "nowhere"))
    server = LocalTritonServer(tmp_path)
    with pytest.raises(ServerNotFoundError, match="TRITONSERVER_HOME") as info:
        server.start()
    assert HINT in str(info.value)
    assert server.pid is None


def test_wheel_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITONSERVER_HOME", raising=False)
    monkeypatch.setattr(discovery, "_wheel_home", lambda: None)
    with pytest.raises(ServerNotFoundError, match="nvidia-pytriton wheel is not installed") as info:
        find_tritonserver()
    assert HINT in str(info.value)


def fake_install(root: Path, *, python_stub: bool = True) -> Path:
    """A Triton install layout with an executable 'server' and a Python backend."""
    (root / "bin").mkdir(parents=True)
    binary = root / "bin" / "tritonserver"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (root / "lib").mkdir()
    python = root / "backends" / "python"
    python.mkdir(parents=True)
    (root / "backends" / "onnxruntime").mkdir()
    for name in discovery.PYTHON_BACKEND_FILES:
        (python / name).write_text("")
    if python_stub:
        stub = python / discovery.STUB_NAME
        stub.write_text("")
        stub.chmod(0o755)
    return root


def test_home_env_and_explicit_path_override_in_that_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = fake_install(tmp_path / "home")
    other = fake_install(tmp_path / "other")
    monkeypatch.setenv("TRITONSERVER_HOME", str(home))
    found = find_tritonserver()
    assert (found.source, found.home) == ("TRITONSERVER_HOME", home.resolve())
    assert found.lib_dirs == (home / "lib",)
    found = find_tritonserver(other / "bin" / "tritonserver")
    assert (found.source, found.home) == ("server_path", other.resolve())
    assert found.stub_path == other.resolve() / "backends" / "python" / discovery.STUB_NAME


def test_backend_folder_and_environment(tmp_path: Path) -> None:
    install = find_tritonserver(fake_install(tmp_path / "home"))
    dest = assemble_backend_dir(install, tmp_path / "backends")
    python = dest / "python"
    assert sorted(p.name for p in python.iterdir()) == sorted([*discovery.PYTHON_BACKEND_FILES, discovery.STUB_NAME])
    assert all(p.is_symlink() for p in python.iterdir())
    assert (dest / "onnxruntime").is_symlink()

    env = server_environment(install, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/x"})
    ld = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert ld == [sysconfig.get_config_var("LIBDIR"), str(install.home / "lib"), "/opt/x"]
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin"]
    assert (env["OMP_WAIT_POLICY"], env["MALLOC_MMAP_THRESHOLD_"]) == ("PASSIVE", str(32 << 20))
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= 32 << 20  # freed tensor buffers stay for the next request
    mine = server_environment(install, {"OMP_WAIT_POLICY": "ACTIVE", "MALLOC_TRIM_THRESHOLD_": "0"})
    assert (mine["OMP_WAIT_POLICY"], mine["MALLOC_TRIM_THRESHOLD_"]) == ("ACTIVE", "0")  # the user's own win


def test_no_stub_for_this_python_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    install = find_tritonserver(fake_install(tmp_path / "home", python_stub=False))
    assert install.stub_path is None
    dest = assemble_backend_dir(install, tmp_path / "backends")
    assert not (dest / "python").exists()
    assert "will fail to load" in caplog.text


# -- log parsing, pinned to lines the real 2.51 server writes ---------------------------------------
LOG = r"""E1202 11:24:43.276901 4621 server.cc:241] "CudaDriverHelper has not been initialized."
I1202 11:24:44.594214 4621 pb_stub.cc:366] "Failed to initialize Python stub: RuntimeError: boom\n\nAt:\n"
E1202 11:24:44.865978 4621 model_lifecycle.cc:642] "failed to load 'bad' version 1: Internal: RuntimeError: boom\n\nAt:\n  /r/bad/1/model.py(3): initialize\n"
E1202 11:24:29.076792 4242 main.cc:257] "failed to start HTTP service: Unavailable - Socket '127.0.0.1:18000' already in use "
E1202 11:24:33.625879 4325 main.cc:245] "failed to start GRPC service: Unavailable - Socket '127.0.0.1:18001' already in use "
Error: Failed to initialize NVML
error: creating server: Internal - failed to load all models
"""  # noqa: E501


def test_log_facts() -> None:
    assert logs.model_failures(LOG) == [logs.ModelFailure("bad", 1, "Internal: RuntimeError: boom")]
    assert logs.port_conflicts(LOG) == [logs.PortConflict("HTTP", 18000), logs.PortConflict("GRPC", 18001)]
    errors = logs.error_lines(LOG)
    assert not any("Cuda" in line or "NVML" in line for line in errors)
    assert errors[-1] == "error: creating server: Internal - failed to load all models"


def test_tail_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("".join(f"line {i} " + "x" * 1000 + "\n" for i in range(500)))
    tail = logs.read_tail(log)
    assert len(tail) <= logs.MAX_TAIL_CHARS
    assert len(tail.splitlines()) <= logs.MAX_TAIL_LINES
    assert tail.splitlines()[-1].startswith("line 499 ")
    assert logs.read_tail(tmp_path / "missing") == ""


def test_incremental_read_returns_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("a\nb\npartial")
    text, offset = logs.read_from(log, 0)
    assert (text, offset) == ("a\nb\n", 4)
    with open(log, "a") as f:
        f.write(" line\n")
    assert logs.read_from(log, offset) == ("partial line\n", len("a\nb\npartial line\n"))


# -- ports ------------------------------------------------------------------------------------------
def test_ports() -> None:
    ports = pick_free_ports(3)
    assert len(set(ports)) == 3
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        assert not port_is_free(taken)
        assert taken not in pick_free_ports(5, exclude=(taken,))
    assert port_is_free(taken)


def test_the_served_mirror_links_every_file_and_leaves_the_repository_alone(tmp_path: Path) -> None:
    from monai_triton_ops.server.mirror import mirror_repository

    repo = tmp_path / "repo"
    (repo / "seg" / "1" / "__pycache__").mkdir(parents=True)
    (repo / "seg" / "config.pbtxt").write_text('name: "seg"')
    (repo / "seg" / "1" / "model.py").write_text("")
    (repo / "seg" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"")
    mirror = mirror_repository(repo, tmp_path / "work" / "repository")
    assert (mirror / "seg" / "config.pbtxt").is_symlink()
    assert (mirror / "seg" / "1" / "model.py").resolve() == (repo / "seg" / "1" / "model.py").resolve()
    assert not (mirror / "seg" / "1" / "__pycache__").exists()
    (mirror / "seg" / "1" / "__pycache__").mkdir()  # what the server's stub does, now in the mirror
    assert sorted(p.name for p in (repo / "seg" / "1").iterdir()) == ["__pycache__", "model.py"]


#: What tritonserver 2.51 printed when its Python backend aborted it during a CI run (pitfall B5), as it wrote it.
LOCK_ABORT_LOG = (
    'I1205 10:01:02.000000 4242 python_be.cc:2248] "TRITONBACKEND_ModelInstanceInitialize: untrained_seg_0_0"\n'
    "terminate called after throwing an instance of 'boost::interprocess::lock_exception'\n"
    "  what():  boost::interprocess::lock_exception\n"
)


def test_a_server_aborted_by_the_python_backend_is_named_with_the_cause_and_the_way_out(tmp_path: Path) -> None:
    """The abort cannot be caused at will (it needs a stub starved at the wrong moment), so a stand-in server
    prints the real server's last words and aborts itself; the launcher must say what happened, not a bare code."""
    home = fake_install(tmp_path / "home")
    script = f"#!/bin/sh\necho start >> {tmp_path / 'starts'}\ncat <<'LOG'\n{LOCK_ABORT_LOG}LOG\nkill -ABRT $$\n"
    (home / "bin" / "tritonserver").write_text(script)
    (tmp_path / "repo").mkdir()
    server = LocalTritonServer(tmp_path / "repo", server_path=home, startup_timeout_s=30.0)
    with pytest.raises(ServerError) as info:
        server.start()
    message = str(info.value).splitlines()[0]
    assert message.startswith("tritonserver was killed by SIGABRT before it was ready: the Python backend aborted")
    assert (tmp_path / "starts").read_text() == "start\nstart\n", "started once more, then gave up"
    assert "boost::interprocess::lock_exception" in message
    assert "--model-load-thread-count" in message
    assert server.state.name == "STOPPED"


def test_an_exit_status_without_a_known_abort_is_said_as_it_is() -> None:
    error = 'E1205 10:01:02.0 1 main.cc:1] "error: creating server: bad"'
    assert logs.exit_reason(1, error + "\n") == f"tritonserver exited with code 1 before it was ready: {error}"
    assert logs.exit_reason(-9, "") == "tritonserver was killed by SIGKILL before it was ready"
    assert logs.server_abort("I1205 some line\n") is None


def test_a_given_load_thread_count_is_on_the_command_line(tmp_path: Path) -> None:
    options = ServerOptions(model_repository=tmp_path, model_load_thread_count=3)
    argv = build_argv(options, server_path=Path("/x/t"), backend_dir=tmp_path, ports=Ports(1, 2, 3), exit_timeout_s=1)
    assert "--model-load-thread-count=3" in argv
    default = build_argv(replace(options, model_load_thread_count=None), server_path=Path("/x/t"), backend_dir=tmp_path,
                         ports=Ports(1, 2, 3), exit_timeout_s=1)  # fmt: skip
    assert not [arg for arg in default if arg.startswith("--model-load-thread-count")]  # Triton's own default


def test_auto_complete_is_needed_only_where_a_config_leaves_something_to_complete(tmp_path: Path) -> None:
    from .conftest import write_model

    repo = write_model(tmp_path / "repo", "add_one")
    assert not load_settings.needs_auto_complete(repo)
    assert load_settings.needs_auto_complete(tmp_path / "absent")
    (repo / "no_config" / "1").mkdir(parents=True)  # Triton derives this one's config from its files
    assert load_settings.needs_auto_complete(repo)
    (repo / "no_config").rename(tmp_path / "gone")
    (repo / "add_one" / "config.pbtxt").write_text('name: "add_one"\nbackend: "python"\n')  # no input, no output
    assert load_settings.needs_auto_complete(repo)
    write_model(repo, "add_one")
    script = repo / "add_one" / "1" / "model.py"
    script.write_text(script.read_text() + "\n    def auto_complete_config(config):\n        return config\n")
    assert load_settings.needs_auto_complete(repo)
