"""The real tritonserver from the nvidia-pytriton wheel, started by ``LocalTritonServer``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from monai_triton_ops.errors import PortInUseError, ServerError, ServerStartError
from monai_triton_ops.server import LocalTritonServer, ServerState, TritonInstall, local
from monai_triton_ops.server.environment import remove_shm_regions

from .conftest import FAIL_REASON, assert_server_gone, group_members, kill_group, process_exists, write_model

pytestmark = pytest.mark.triton

TIMEOUT_S = 10.0


def http_get(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=TIMEOUT_S) as response:
        return int(response.status)


@pytest.fixture
def listening_socket() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# -- one shared server ------------------------------------------------------------------------------
def test_running_server(server: LocalTritonServer) -> None:
    assert server.state is ServerState.RUNNING
    assert server.is_alive()
    assert server.returncode is None
    assert server.grpc_url == f"grpc://127.0.0.1:{server.grpc_port}"
    assert server.http_url == f"http://127.0.0.1:{server.http_port}"
    assert len({server.http_port, server.grpc_port, server.metrics_port}) == 3
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/add_one/ready", "/v2/models/identity/ready"):
        assert http_get(server.http_url + path) == 200
    assert http_get(server.metrics_url) == 200
    assert server.log_path is not None
    assert server.workdir is not None
    assert server.log_path.parent == server.workdir
    assert "Started GRPCInferenceService at 127.0.0.1:" in server.log_path.read_text()
    assert sorted(p.name for p in (server.workdir / "backends" / "python").iterdir() if p.is_symlink()) == [
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    # Its Python backend stubs run in the server's own process group, so a SIGKILL of the group takes them too.
    assert os.getpgid(server.pid) == server.pid  # type: ignore[arg-type]
    assert len(group_members(server.pid)) >= 3  # type: ignore[arg-type]  # server + one stub per model


def test_nothing_listens_beyond_loopback(server: LocalTritonServer) -> None:
    listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
    ports = {server.http_port, server.grpc_port, server.metrics_port}
    for line in listening:
        local_address, state = line.split()[1], line.split()[3]
        host, port = local_address.split(":")
        if state == "0A" and int(port, 16) in ports:  # LISTEN
            assert host == "0100007F", f"port {int(port, 16)} listens on {host}"


def test_grpc_infer(server: LocalTritonServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        assert client.is_server_live(client_timeout=TIMEOUT_S)
        assert client.is_server_ready(client_timeout=TIMEOUT_S)
        assert client.is_model_ready("add_one", client_timeout=TIMEOUT_S)
        x = np.array([0.5, -1.0, 41.0, 1e6], dtype=np.float32)
        inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("add_one", [inp], client_timeout=TIMEOUT_S)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x + 1)

        ids = np.arange(-3, 2**40, 2**38, dtype=np.int64)
        inp = grpcclient.InferInput("INPUT__0", list(ids.shape), "INT64")
        inp.set_data_from_numpy(ids)
        result = client.infer("identity", [inp], client_timeout=TIMEOUT_S)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), ids)
    finally:
        client.close()


def test_http_infer(server: LocalTritonServer) -> None:
    client = httpclient.InferenceServerClient(
        server.http_address, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S
    )
    try:
        assert client.is_server_ready()
        assert client.is_model_ready("add_one")
        x = np.linspace(-2, 2, 1000, dtype=np.float32)
        inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        out = httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)
        result = client.infer("add_one", [inp], outputs=[out])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x + 1)
    finally:
        client.close()


# -- servers of their own ---------------------------------------------------------------------------
def test_start_stop_idempotent_no_restart(make_server: Callable[..., LocalTritonServer], empty_repo: Path) -> None:
    server = make_server(empty_repo)
    assert server.start() is server
    pid, workdir = server.pid, server.workdir
    assert pid is not None
    assert workdir is not None
    assert workdir.is_dir()
    with pytest.raises(ServerError, match="running"):
        server.start()
    server.stop()
    assert server.returncode == 0  # SIGINT is a clean stop
    assert_server_gone(pid)
    assert not workdir.exists()
    assert server.workdir is None
    assert server.log_path is None
    server.stop()
    with pytest.raises(ServerError, match="stopped; create a new one"):
        server.start()


def test_context_manager_stops_when_the_body_fails(
    make_server: Callable[..., LocalTritonServer], empty_repo: Path
) -> None:
    server = make_server(empty_repo)

    def body() -> None:
        with server:
            assert server.is_alive()
            raise RuntimeError("body failed")

    with pytest.raises(RuntimeError, match="body failed"):
        body()
    assert server.state is ServerState.STOPPED
    assert server.pid is not None
    assert_server_gone(server.pid)


def test_given_ports_are_used_and_log_kept(
    make_server: Callable[..., LocalTritonServer], empty_repo: Path, tmp_path: Path
) -> None:
    from monai_triton_ops.server.ports import pick_free_ports

    http, grpc, metrics = pick_free_ports(3)
    log = tmp_path / "logs" / "server.log"
    with make_server(empty_repo, http_port=http, grpc_port=grpc, metrics_port=metrics, log_path=log) as server:
        assert (server.http_port, server.grpc_port, server.metrics_port) == (http, grpc, metrics)
        assert http_get(f"http://127.0.0.1:{http}/v2/health/ready") == 200
    assert server.log_path == log
    assert f"Started HTTPService at 127.0.0.1:{http}" in log.read_text()


@pytest.mark.parametrize("which", ["http_port", "grpc_port", "metrics_port"])
def test_port_in_use_before_launch(
    make_server: Callable[..., LocalTritonServer], empty_repo: Path, listening_socket: int, which: str
) -> None:
    server = make_server(empty_repo, **{which: listening_socket})
    with pytest.raises(PortInUseError, match=f"{which} {listening_socket} ") as info:
        server.start()
    assert isinstance(info.value, OSError)
    assert server.pid is None, "nothing may be launched"


@pytest.mark.parametrize(
    ("which", "service"), [("http_port", "HTTP"), ("grpc_port", "GRPC"), ("metrics_port", "Metrics")]
)
def test_port_in_use_detected_from_the_log(
    make_server: Callable[..., LocalTritonServer],
    empty_repo: Path,
    listening_socket: int,
    monkeypatch: pytest.MonkeyPatch,
    which: str,
    service: str,
) -> None:
    """The check before launch can lose a race; the server's own failure to bind must give the same error."""
    monkeypatch.setattr(local, "port_is_free", lambda port: True)
    server = make_server(empty_repo, **{which: listening_socket})
    with pytest.raises(PortInUseError, match=f"{service} port {listening_socket} "):
        server.start()
    assert server.pid is not None
    assert not process_exists(server.pid)


def test_picked_port_taken_meanwhile_is_retried(
    make_server: Callable[..., LocalTritonServer],
    empty_repo: Path,
    listening_socket: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = local.pick_free_ports
    calls = []

    def first_one_taken(count: int, *, exclude: tuple[int, ...] = ()) -> list[int]:
        calls.append(count)
        ports = real(count, exclude=(*exclude, listening_socket))
        return [listening_socket, *ports[1:]] if len(calls) == 1 else ports

    monkeypatch.setattr(local, "pick_free_ports", first_one_taken)
    with make_server(empty_repo) as server:
        assert server.http_port != listening_socket
        assert http_get(server.http_url + "/v2/health/ready") == 200
    assert len(calls) == 2


@pytest.mark.slow
def test_model_that_fails_to_load(make_server: Callable[..., LocalTritonServer], tmp_path: Path) -> None:
    repo = write_model(tmp_path / "repo", "good", expression="x + 1")
    write_model(repo, "broken", initialize=f'raise RuntimeError("{FAIL_REASON}")')
    server = make_server(repo)
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="model 'broken' version 1 failed to load") as info:
        server.start()
    elapsed = time.monotonic() - started
    assert FAIL_REASON in str(info.value).splitlines()[0]
    assert FAIL_REASON in info.value.log_tail
    assert len(info.value.log_tail) <= 8192
    assert server.state is ServerState.STOPPED
    assert server.workdir is None
    assert server.pid is not None
    assert_server_gone(server.pid)
    assert elapsed < 60, f"a load failure took {elapsed:.1f} s to report"


@pytest.mark.slow
def test_startup_deadline(make_server: Callable[..., LocalTritonServer], tmp_path: Path) -> None:
    # a model that loads for two minutes: a fast machine must not start the server within the deadline
    repo = write_model(tmp_path / "repo", "slow_to_load", initialize="import time\ntime.sleep(120)")
    server = make_server(repo, startup_timeout_s=2.0)
    with pytest.raises(ServerStartError, match=r"not ready within 2(\.0)? s"):
        server.start()
    assert server.pid is not None
    assert_server_gone(server.pid)


@pytest.mark.slow
def test_explicit_model_control(make_server: Callable[..., LocalTritonServer], demo_repo: Path) -> None:
    with make_server(demo_repo, model_control_mode="explicit", models=["add_one"]) as server:
        index = {m["name"]: m.get("state") for m in json.loads(_post(server.http_url + "/v2/repository/index"))}
        assert index["add_one"] == "READY"
        assert index["identity"] != "READY"


def test_unknown_model_to_wait_for(make_server: Callable[..., LocalTritonServer], empty_repo: Path) -> None:
    server = make_server(empty_repo, models=["ghost"])
    with pytest.raises(ServerStartError, match=r"models \['ghost'\] are not in the repository"):
        server.start()


def _post(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=b"{}", method="POST")
    with opener.open(request, timeout=TIMEOUT_S) as response:
        return response.read().decode()


# -- the child dies with its parent -----------------------------------------------------------------
PARENT = textwrap.dedent(
    """
    import sys, time
    from monai_triton_ops.server import LocalTritonServer
    server = LocalTritonServer(sys.argv[1]).start()
    print(server.pid, flush=True)
    time.sleep(300)
    """
)


@pytest.mark.slow
def test_server_dies_with_its_parent(triton_install: object, demo_repo: Path, tmp_path: Path) -> None:
    """SIGKILL the process that started the server: the kernel kills the server, its stubs follow."""
    orphan_tmp = tmp_path / "tmp"  # a SIGKILLed parent cannot remove its folder: keep it in ours
    orphan_tmp.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(demo_repo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(orphan_tmp)},
        text=True,
    )
    server_pid = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()  # the parent prints once ready, or exits (EOF) on failure
        assert line.strip().isdigit(), f"parent did not start the server: {line!r}"
        server_pid = int(line)
        assert process_exists(server_pid)
        assert len(group_members(server_pid)) >= 2
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=TIMEOUT_S)
        assert_server_gone(server_pid, timeout_s=30.0)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        if server_pid is not None:
            kill_group(server_pid)
        # A server killed with its parent cannot unlink its shared memory; the next launcher would.
        remove_shm_regions(f"monai_triton_{parent.pid}_")


# -- how models load -----------------------------------------------------------------------------------
#: A model that leaves its inputs and outputs to its model.py (Triton's auto-complete, Python backend hook).
SELF_COMPLETING_CONFIG = 'name: "completes_itself"\nbackend: "python"\nmax_batch_size: 0\n'
AUTO_COMPLETE_HOOK = """
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [-1]})
        config.add_output({"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [-1]})
        return config
"""


def stub_starts(log: str) -> dict[str, int]:
    """How many stubs the Python backend started for each model name its verbose log gives (last argv field)."""
    starts: dict[str, int] = {}
    for line in log.splitlines():
        if "Starting Python backend stub" in line:
            name = line.split("triton_python_backend_stub", 1)[1].split('"')[0].split()[-2]
            starts[name] = starts.get(name, 0) + 1
    return starts


@pytest.mark.slow
def test_complete_configs_load_one_stub_per_instance_and_a_self_completing_model_is_still_completed(
    make_server: Callable[..., LocalTritonServer], tmp_path: Path
) -> None:
    """Auto-complete costs one more stub start per Python model; it is off when no config needs it, and on when
    one model's ``model.py`` completes its config, which then serves as completed."""
    complete = write_model(tmp_path / "complete", "add_one", expression="x + 1")
    with make_server(complete, log_verbose=1) as server:
        argv = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")
        assert "--disable-auto-complete-config" in argv
        assert server.log_path is not None
        assert stub_starts(server.log_path.read_text()) == {"add_one_0_0": 1}

    mixed = write_model(tmp_path / "mixed", "add_one", expression="x + 1")
    write_model(mixed, "completes_itself", expression="x * 2")
    (mixed / "completes_itself" / "config.pbtxt").write_text(SELF_COMPLETING_CONFIG)
    script = mixed / "completes_itself" / "1" / "model.py"
    script.write_text(
        script.read_text().replace("class TritonPythonModel:\n", "class TritonPythonModel:" + AUTO_COMPLETE_HOOK)
    )
    with make_server(mixed, log_verbose=1) as server:
        argv = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")
        assert "--disable-auto-complete-config" not in argv
        client = grpcclient.InferenceServerClient(server.grpc_url.removeprefix("grpc://"))
        config = client.get_model_config("completes_itself", as_json=True)["config"]
        assert [t["name"] for t in config["input"]] == ["INPUT__0"]
        x = grpcclient.InferInput("INPUT__0", [3], "FP32")
        x.set_data_from_numpy(np.array([1.0, 2.0, 3.0], dtype=np.float32))
        result = client.infer("completes_itself", [x]).as_numpy("OUTPUT__0")
        np.testing.assert_array_equal(result, [2.0, 4.0, 6.0])
        client.close()


def test_a_server_the_python_backend_aborts_while_loading_is_started_once_more(
    make_server: Callable[..., LocalTritonServer],
    triton_install: TritonInstall,
    empty_repo: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The abort comes from a moment's CPU starvation (pitfall B5) and cannot be caused at will: a stand-in prints
    the real server's last words and aborts on the first start, then runs the real server."""
    from .test_server_units import LOCK_ABORT_LOG, fake_install

    home = fake_install(tmp_path / "home")
    first = tmp_path / "aborted_once"
    (home / "bin" / "tritonserver").write_text(
        f"#!/bin/sh\nif [ ! -e {first} ]; then\n  touch {first}\n  cat <<'LOG'\n{LOCK_ABORT_LOG}LOG\n"
        f'  kill -ABRT $$\nfi\nexec {triton_install.server_path} "$@"\n'
    )
    server = make_server(empty_repo, server_path=home, startup_timeout_s=60.0)
    with caplog.at_level("WARNING", logger="monai_triton_ops.server.local"):
        server.start()
    assert server.state is ServerState.RUNNING
    assert http_get(server.http_url + "/v2/health/ready") == 200
    (warning,) = [r.getMessage() for r in caplog.records if "starting it again" in r.getMessage()]
    assert "boost::interprocess::lock_exception" in warning
