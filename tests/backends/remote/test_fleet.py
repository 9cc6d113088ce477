"""Several servers behind one backend: spread, failover without loss, servers down and back, a mixed fleet refused,
waiting said aloud, and the in-process last resort. Against three real ``tritonserver`` processes on loopback.

``a`` and ``b`` serve the same models (passthrough ones: they load in a fraction of a second, without torch); a
test that kills one brings it back on the same ports before the next test (``Replica.restart``). ``c`` serves
another model under the same name, in explicit mode, where a model can be seen loading. Shares are read from each
server's own statistics, never from the backend under test; no test asserts a duration.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from monai.inferers import sliding_window_inference

from monai_triton_ops import create_backend
from monai_triton_ops.backends.base import BaseBackend
from monai_triton_ops.errors import ConfigError, InferenceError, InferenceTimeoutError, ServerUnavailableError
from monai_triton_ops.pipeline import Predictor
from monai_triton_ops.server import TritonInstall

from ... import triton_models
from . import sharing
from .conftest import Open
from .replicas import Replica

T = TypeVar("T")

pytestmark = pytest.mark.triton
SCHEMES = ["grpc", "http"]
CLOSED = "127.0.0.1:9"  # nothing listens on the discard port
#: Fast probing, so a server that comes back is used again within a second or two.
FAST = "probe_backoff_s=0.1&max_probe_backoff_s=0.5"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fleet") / "repo"
    triton_models.passthrough(folder, "pt")
    triton_models.passthrough(folder, "win", dims=(-1, -1, -1, -1, -1), delay_s=0.01)
    triton_models.passthrough(folder, "slow", delay_s=1.0)
    triton_models.passthrough(folder, "boom", error="deliberate model error")
    # The same identity as TorchScript beside it: what fallback=torch runs from this repository.
    torch.jit.save(torch.jit.script(torch.nn.Identity()), folder / "win" / "1" / "model.pt")
    return folder


@pytest.fixture(scope="module")
def replicas(
    triton_install: TritonInstall, repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Replica, Replica]]:
    folder = tmp_path_factory.mktemp("fleet_tmp")
    a = Replica(repo, folder)
    b = Replica(repo, folder)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def fleet(replicas: tuple[Replica, Replica]) -> Iterator[tuple[Replica, Replica]]:
    """Both servers running at the start of the test, and again after it (a killed one restarted)."""
    for replica in replicas:
        replica.restart()
    yield replicas
    for replica in replicas:
        replica.restart()


@pytest.fixture(scope="module")
def other(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    """Another model under the same name (``pt`` takes a matrix here); ``loading`` takes 8 s to load, on demand."""
    folder = tmp_path_factory.mktemp("other")
    repo = folder / "repo"
    triton_models.passthrough(repo, "pt", dims=(-1, -1))
    triton_models.passthrough(repo, "loading", load_s=8.0)
    replica = Replica(repo, folder, model_control_mode="explicit", models=["pt"], stop_timeout_s=5.0)
    try:
        yield replica
    finally:
        replica.stop()


def spec(scheme: str, *replicas: Replica, extra: str = "") -> str:
    """``grpc://H1:P1,H2:P2?...``: every replica's address in one spec."""
    hosts = ",".join(r.url(scheme).split("://", 1)[1] for r in replicas)
    return f"{scheme}://{hosts}" + (f"?{extra}" if extra else "")


def label(replica: Replica, scheme: str) -> str:
    return replica.url(scheme)


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def read_when_equal(read: Callable[[], T], expected: T, timeout_s: float = 10.0) -> T:
    """``read()`` once it gives ``expected``, else its last value: a server counts a request a little after the
    client has its answer (more so on a busy machine)."""
    wait_for(lambda: read() == expected, timeout_s)
    return read()


_X = np.arange(8, dtype=np.float32)


def exact(backend: BaseBackend, count: int, *, model_input: str = "INPUT__0", start: int = 0) -> None:
    for i in range(start, start + count):
        np.testing.assert_array_equal(backend.infer({model_input: _X + i}, timeout_s=60)["OUTPUT__0"], _X + i)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_requests_spread_over_the_servers_and_each_servers_statistics_show_its_share(
    fleet: tuple[Replica, Replica], open_backend: Open, scheme: str
) -> None:
    a, b = fleet
    before = a.inferences("pt"), b.inferences("pt")
    backend = open_backend(spec(scheme, a, b), "pt")
    assert backend.shared_memory == "none"  # several servers: tensors in the request body
    exact(backend, 20)
    counted = read_when_equal(lambda: (a.inferences("pt") - before[0], b.inferences("pt") - before[1]), (10, 10))
    assert counted == (10, 10)  # round robin, one at a time
    shares = {e["server"]: int(e["inference_count"]) for e in backend.statistics()["model_stats"]}
    assert set(shares) == {label(a, scheme), label(b, scheme)}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_two_models_on_one_fleet_share_one_connection_per_server_and_close_apart(
    fleet: tuple[Replica, Replica], scheme: str
) -> None:
    """Issue 37: two models of one process on a 2-server fleet, one connection (HTTP: one pool) per server and one
    probing thread; one closed with requests in flight, the other still answers; both closed, nothing grows."""
    a, b = fleet
    ports = [r.server.grpc_port if scheme == "grpc" else r.server.http_port for r in fleet]
    with create_backend(spec(scheme, a, b), "pt") as warm:  # what the process keeps (the deadline thread) starts
        warm.submit({"INPUT__0": _X}).result(timeout=60)
    before = sharing.counts()

    def flat() -> bool:
        grown = wait_for(lambda: all(v <= before[k] for k, v in sharing.counts().items()), 30.0)
        assert grown, (before, sharing.counts(), sorted(t.name for t in threading.enumerate()))
        return grown

    sharing.two_models_share_and_close_apart(spec(scheme, a, b), "pt", "slow", ports, scheme, flat)


def _labels(backend: BaseBackend, image: torch.Tensor) -> torch.Tensor:
    predictor = Predictor(backend, request_batch_size=1, max_in_flight=4)
    out = sliding_window_inference(image, roi_size=(16, 16, 16), sw_batch_size=4, predictor=predictor, overlap=0.5)
    return torch.argmax(torch.as_tensor(out), dim=1)


def _kill_at_attempt(backend: BaseBackend, attempt: int, *replicas: Replica) -> Callable[[], int]:
    """SIGKILL ``replicas`` just before the backend's ``attempt``-th request leaves: in the middle of a run on a
    machine of any speed (a thread watching the servers' statistics was outrun when the run was quick).

    A spy on the request path: the real send runs. Returns a function that reads the number of attempts so far.
    """
    exchange = backend._exchange  # type: ignore[attr-defined]
    send, lock, attempts = exchange.send, threading.Lock(), [0]

    def killing(transport: object, request: object) -> object:
        with lock:  # the other workers wait: none sends between the count and the kill
            attempts[0] += 1
            if attempts[0] == attempt:
                for replica in replicas:
                    replica.kill()
        return send(transport, request)

    exchange.send = killing
    return lambda: attempts[0]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_server_killed_in_the_middle_of_a_sliding_window_run_changes_no_label(
    fleet: tuple[Replica, Replica], open_backend: Open, scheme: str
) -> None:
    a, b = fleet
    image = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 48, 48, 48)).astype(np.float32))
    backend = open_backend(spec(scheme, a, b, extra="max_in_flight=4"), "win")
    reference = _labels(backend, image)  # 125 windows, undisturbed
    assert torch.equal(reference, torch.argmax(image, dim=1))  # blended identity windows: the image's own argmax
    attempts = _kill_at_attempt(backend, 40, b)  # of 125 windows: b has answered about 20 of them
    labels = _labels(backend, image)
    assert attempts() > 40
    assert not b.running  # it died during the run, which still completed
    assert torch.equal(labels, reference)
    assert backend.events["failed_over"] >= 1  # type: ignore[attr-defined]
    assert backend.servers[label(b, scheme)] in ("suspect", "down")  # type: ignore[attr-defined]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_stopped_server_is_skipped_then_used_again_once_restarted(
    fleet: tuple[Replica, Replica], open_backend: Open, scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = fleet
    backend = open_backend(spec(scheme, a, b, extra=FAST), "pt")
    exact(backend, 4)
    b.kill()
    with caplog.at_level(logging.WARNING):
        exact(backend, 20, start=4)  # every one answered: the first on b fails over to a
        assert wait_for(lambda: backend.servers[label(b, scheme)] == "down")  # type: ignore[attr-defined]
    down = [r.getMessage() for r in caplog.records if "is down" in r.getMessage()]
    assert len(down) == 1, down
    assert label(b, scheme) in down[0]
    assert "connection refused" in down[0]
    b.restart()
    assert wait_for(lambda: backend.servers[label(b, scheme)] == "up")  # type: ignore[attr-defined]
    exact(backend, 10, start=24)
    assert b.inferences("pt") >= 4  # the restarted server takes its share again


def test_a_server_down_at_open_joins_once_it_is_ready(
    fleet: tuple[Replica, Replica], open_backend: Open, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = fleet
    b.kill()
    with caplog.at_level(logging.WARNING):
        backend = open_backend(spec("http", a, b, extra=FAST), "pt")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "1 of 2 servers ready" in said
    assert label(b, "http") in said
    assert "connection refused" in said
    exact(backend, 4)
    b.restart()
    assert wait_for(lambda: backend.servers[label(b, "http")] == "up")  # type: ignore[attr-defined]
    exact(backend, 10)
    assert b.inferences("pt") >= 4


def test_every_server_stopped_mid_run_is_one_clear_error_within_the_deadline(
    fleet: tuple[Replica, Replica], open_backend: Open
) -> None:
    a, b = fleet
    image = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 3, 48, 48, 48)).astype(np.float32))
    backend = open_backend(spec("grpc", a, b, extra="max_in_flight=4&timeout_s=20"), "win")
    _kill_at_attempt(backend, 20, a, b)  # of 125 windows
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            _labels(backend, image)
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    runner.join(timeout=20 + 30)  # the request deadline, and room for the machine
    assert not runner.is_alive()
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], ServerUnavailableError), outcome
    message = str(outcome[0])
    assert "model 'win' on grpc://127.0.0.1:" in message
    assert "server unavailable" in message


def test_a_server_whose_model_process_died_fails_over_and_is_named_once(
    fleet: tuple[Replica, Replica], open_backend: Open, caplog: pytest.LogCaptureFixture
) -> None:
    """Triton 2.51 keeps a model READY after its stub died and answers every request with an error: another server
    takes them, and one WARNING names the server whose model process is gone."""
    a, b = fleet
    backend = open_backend(spec("grpc", a, b), "pt")
    exact(backend, 2)
    a.kill_stub("pt")
    try:
        with caplog.at_level(logging.WARNING):
            exact(backend, 10)  # every one answered: those sent to a go on to b
        said = [r.getMessage() for r in caplog.records if "backend process is gone" in r.getMessage()]
        assert len(said) == 1, caplog.text
        assert label(a, "grpc") in said[0]
        assert backend.events["failed_over"] >= 1  # type: ignore[attr-defined]
    finally:
        a.kill()  # its model cannot come back on its own: the next test gets a new server


def test_a_one_request_infer_on_the_callers_thread_fails_over_within_its_deadline(
    fleet: tuple[Replica, Replica], open_backend: Open
) -> None:
    """Over gRPC a one-request ``infer()`` makes its attempts on the caller's thread (no worker): a server killed
    under it is left for the other one there, at once, within the request's deadline."""
    a, b = fleet
    backend = open_backend(spec("grpc", a, b), "pt")
    exchange = backend._exchange  # type: ignore[attr-defined]
    send, threads = exchange.send, []

    def spying(transport: object, request: object) -> object:  # a spy: the real send runs
        threads.append(threading.current_thread())
        return send(transport, request)

    exchange.send = spying
    exact(backend, 2)
    b.kill()
    for i in range(6):  # round robin: the first request for b is the one that fails over
        out = backend.infer({"INPUT__0": _X + i}, timeout_s=10)["OUTPUT__0"]
        np.testing.assert_array_equal(out, _X + i)
    assert backend.events["failed_over"] >= 1  # type: ignore[attr-defined]
    assert len(threads) > 8  # the failed attempt(s) too
    assert set(threads) == {threading.current_thread()}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_error_the_model_reports_is_never_sent_to_another_server(
    fleet: tuple[Replica, Replica], open_backend: Open, scheme: str
) -> None:
    a, b = fleet
    before = a.requests("boom") + b.requests("boom")
    backend = open_backend(spec(scheme, a, b, extra="retries=5"), "boom")
    with pytest.raises(InferenceError, match="deliberate model error") as caught:
        backend.infer({"INPUT__0": _X}, timeout_s=30)
    assert "attempts" not in str(caught.value)
    assert wait_for(lambda: a.requests("boom") + b.requests("boom") - before >= 1, timeout_s=10)
    time.sleep(0.5)  # statistics lag the response a little
    assert a.requests("boom") + b.requests("boom") - before == 1


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_deadline_is_never_passed_nor_the_request_resent(
    fleet: tuple[Replica, Replica], open_backend: Open, scheme: str
) -> None:
    a, b = fleet
    before = a.requests("slow") + b.requests("slow")
    backend = open_backend(spec(scheme, a, b, extra="retries=5"), "slow")
    with pytest.raises(InferenceTimeoutError, match="model 'slow'"):
        backend.infer({"INPUT__0": _X}, timeout_s=0.5)
    assert wait_for(lambda: a.requests("slow") + b.requests("slow") - before >= 1, timeout_s=10)
    time.sleep(1.5)  # a second request, had one been sent, would have finished by now
    assert a.requests("slow") + b.requests("slow") - before == 1


def test_servers_serving_different_models_are_refused_at_open(fleet: tuple[Replica, Replica], other: Replica) -> None:
    a, _ = fleet
    with pytest.raises(ConfigError, match="the servers do not serve the same model") as caught:
        create_backend(spec("grpc", a, other), "pt").open()
    message = str(caught.value)
    assert label(other, "grpc") in message
    assert label(a, "grpc") in message
    assert re.search(r"inputs .*\[-1\].*\[-1, -1\]", message), message


def test_waiting_is_said_at_the_default_level_and_the_error_tells_refused_from_loading(
    other: Replica, caplog: pytest.LogCaptureFixture
) -> None:
    client = grpcclient.InferenceServerClient(other.server.grpc_address)
    loader = threading.Thread(target=lambda: client.load_model("loading", client_timeout=120), daemon=True)
    loader.start()
    try:
        wait_for(lambda: _state(other, "loading") == "LOADING", timeout_s=30)
        backend = create_backend(f"grpc://{CLOSED},{other.server.grpc_address}?ready_timeout_s=3", "loading")
        with caplog.at_level(logging.WARNING), pytest.raises(ServerUnavailableError) as caught:
            backend.open()
    finally:
        loader.join(timeout=120)
        client.unload_model("loading", client_timeout=30)
        client.close()
    message = str(caught.value)
    assert "was not ready on any of its 2 servers within 3 s (ready_timeout_s)" in message
    assert f"grpc://{CLOSED} connection refused (nothing listens on {CLOSED})" in message
    assert f"{label(other, 'grpc')} model loading (state LOADING)" in message
    waiting = [r for r in caplog.records if r.levelno == logging.WARNING and "waiting for model" in r.getMessage()]
    assert waiting, caplog.text
    assert "connection refused" in waiting[0].getMessage()
    assert "model loading" in waiting[0].getMessage()
    assert "s left of ready_timeout_s=3" in waiting[0].getMessage()


def _state(replica: Replica, model: str) -> str:
    client = grpcclient.InferenceServerClient(replica.server.grpc_address)
    try:
        index = client.get_model_repository_index(as_json=True, client_timeout=10).get("models", [])
    finally:
        client.close()
    return next((str(m.get("state", "")) for m in index if m.get("name") == model), "")


def test_fallback_torch_runs_the_model_in_process_when_every_server_is_gone_and_says_so_once(
    fleet: tuple[Replica, Replica], repo: Path, open_backend: Open, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = fleet
    image = torch.from_numpy(np.random.default_rng(2).standard_normal((1, 3, 48, 48, 48)).astype(np.float32))
    extra = f"max_in_flight=4&fallback=torch&{FAST}"
    backend = open_backend(spec("grpc", a, b, extra=extra), "win", model_repository=repo)
    reference = _labels(backend, image)
    _kill_at_attempt(backend, 20, a, b)  # of 125 windows
    with caplog.at_level(logging.WARNING):
        labels = _labels(backend, image)  # the servers die under it; the in-process model takes the rest
    assert torch.equal(labels, reference)
    assert backend.events["fell_back"] > 0  # type: ignore[attr-defined]
    said = [r.getMessage() for r in caplog.records if "falls back to the in-process torch backend" in r.getMessage()]
    assert len(said) == 1, caplog.text
    a.restart()
    assert wait_for(lambda: backend.servers[label(a, "grpc")] == "up")  # type: ignore[attr-defined]
    before = a.inferences("win")
    assert torch.equal(_labels(backend, image), reference)
    # the server is the first choice again: every window went to it
    assert read_when_equal(lambda: a.inferences("win") - before, 125) == 125


def test_fallback_torch_at_open_when_no_server_is_ready(
    repo: Path, open_backend: Open, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        backend = open_backend(f"grpc://{CLOSED}?ready_timeout_s=1&fallback=torch", "win", model_repository=repo)
        x = np.random.default_rng(3).standard_normal((1, 3, 8, 8, 8)).astype(np.float32)
        for _ in range(3):
            np.testing.assert_array_equal(backend.infer({"INPUT__0": x})["OUTPUT__0"], x)
    said = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "connection refused" in said[0]


def test_fallback_torch_without_a_local_model_fails_at_open() -> None:
    with pytest.raises(ConfigError, match="fallback=torch needs the local model repository"):
        create_backend(f"grpc://{CLOSED}?fallback=torch", "win").open()
