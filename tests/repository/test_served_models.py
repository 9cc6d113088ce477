"""Every generated python-flavour model, served by the real tritonserver, answers exactly as the file does.

One server for the module: its repository holds every case of ``CASES`` built by ``build_repository``,
plus ``stacked`` (dynamic batching) to run the runner's batching path. Every request has a 30 s deadline.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from monai_triton_ops.errors import ServerNotFoundError
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.config import DynamicBatching
from monai_triton_ops.signature import dtype_of

from ..server.conftest import wait_until
from .conftest import CASES, save_scripted
from .test_builder import example_inputs, run_module
from .test_like import APP_SDK_CONFIG, SPLEEN_META, spleen_stand_in

if TYPE_CHECKING:
    from monai_triton_ops.server import LocalTritonServer

pytestmark = pytest.mark.triton

TIMEOUT_S = 30.0
#: The batcher waits for 4 items (or 5 s): 4 concurrent batch-1 requests run as one execution.
STACKED = DynamicBatching(preferred_batch_sizes=(4,), max_queue_delay_us=5_000_000)


@pytest.fixture(scope="module")
def server(model_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    """A running server over a repository of every case; stopped (and checked gone) even when tests fail.

    Besides ``CASES``: ``stacked`` (dynamic batching), ``spleen_ct`` (``--like`` the App SDK's client-side
    config, python runner on CPU) and ``renamed`` (chosen tensor names).
    """
    from monai_triton_ops.server import LocalTritonServer, find_tritonserver

    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    work = tmp_path_factory.mktemp("served")
    repo = work / "repo"
    for name, case in CASES.items():
        build_repository(model_files[name], repo, name, **case.build)
    build_repository(model_files["batched"], repo, "stacked", **CASES["batched"].build, dynamic_batching=STACKED)
    build_repository(spleen_file(work), repo, like=client_side_folder(work), flavor="python", instance_kind="cpu")
    build_repository(model_files["two_in_two_out"], repo, "renamed", **CASES["two_in_two_out"].build,
                     input_names=["INPUT_0", "INPUT_1"], output_names=["doubled", "positive"])  # fmt: skip
    server = LocalTritonServer(repo, startup_timeout_s=180.0)
    with server:
        yield server
    assert server.workdir is None
    assert server.pid is None or not _alive(server.pid)


@pytest.fixture(scope="module")
def served(server: LocalTritonServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        yield client
    finally:
        client.close()


def spleen_file(folder: Path) -> Path:
    return save_scripted(spleen_stand_in(), folder / "spleen.ts", SPLEEN_META)


def client_side_folder(folder: Path) -> Path:
    """The App SDK remote example's ``models_client_side/spleen_ct``."""
    model = folder / "models_client_side" / "spleen_ct"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(APP_SDK_CONFIG)
    return model


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def infer(client: grpcclient.InferenceServerClient, model: str, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    """One gRPC request with every input of ``model``, in config order; returns every output."""
    config = client.get_model_config(model, client_timeout=TIMEOUT_S).config
    inputs = []
    for spec, array in zip(config.input, arrays, strict=True):
        tensor = grpcclient.InferInput(spec.name, list(array.shape), dtype_of(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer(model, inputs, client_timeout=TIMEOUT_S)
    return {spec.name: result.as_numpy(spec.name) for spec in config.output}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_generated_model_answers_exactly_like_the_torchscript_file(
    served: grpcclient.InferenceServerClient, model_files: dict[str, Path], case: str
) -> None:
    arrays = example_inputs(case)
    outputs = infer(served, case, arrays)
    expected = run_module(model_files[case], arrays)
    assert len(outputs) == len(expected)
    for (name, got), want in zip(outputs.items(), expected, strict=True):
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        if want.dtype.kind == "f":
            assert float(np.max(np.abs(got - want))) == 0.0, name
        assert np.array_equal(got, want), name


def test_the_two_input_model_keeps_names_and_dtypes(served: grpcclient.InferenceServerClient) -> None:
    config = served.get_model_config("two_in_two_out", client_timeout=TIMEOUT_S).config
    assert [(t.name, t.data_type) for t in config.input] == [("image", 11), ("offset", 9)]  # TYPE_FP32, TYPE_INT64
    outputs = infer(served, "two_in_two_out", example_inputs("two_in_two_out"))
    assert [(n, a.dtype) for n, a in outputs.items()] == [("OUTPUT__0", np.float32), ("OUTPUT__1", np.bool_)]


def test_the_dict_model_answers_by_key(served: grpcclient.InferenceServerClient) -> None:
    outputs = infer(served, "dict_output", example_inputs("dict_output"))
    assert list(outputs) == ["probs", "labels"]
    assert outputs["labels"].dtype == np.uint8
    np.testing.assert_allclose(outputs["probs"].sum(axis=1), 1.0, rtol=1e-5)


def test_the_monai_metadata_reaches_a_remote_client(served: grpcclient.InferenceServerClient) -> None:
    config = served.get_model_config("unet_meta", client_timeout=TIMEOUT_S).config
    assert '"16*n"' in config.parameters["monai_metadata"].string_value


def test_a_model_failure_comes_back_as_that_requests_error(served: grpcclient.InferenceServerClient) -> None:
    odd = np.ones((1, 2, 5), np.float32)  # the model refuses odd widths
    with pytest.raises(InferenceServerException, match=r"model 'batched': builtins.ValueError: width must be even$"):
        infer(served, "batched", [odd])
    assert np.array_equal(
        infer(served, "batched", [np.ones((1, 2, 4), np.float32)])["OUTPUT__0"], np.full((1, 2, 4), 4.0)
    )


def test_batched_requests_run_as_one_and_each_gets_its_own_rows(served: grpcclient.InferenceServerClient) -> None:
    arrays = [np.full((1, 2, 6), float(i), np.float32) for i in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda a: infer(served, "stacked", [a])["OUTPUT__0"], arrays))
    for array, result in zip(arrays, results, strict=True):
        assert np.array_equal(result, array * 3.0 + 1.0)

    def stats() -> Any:
        return served.get_inference_statistics("stacked", client_timeout=TIMEOUT_S).model_stats[0]

    wait_until(lambda: stats().inference_count >= 4, timeout_s=10)  # counted a little after the answers left
    counted = stats()
    assert (counted.inference_count, counted.execution_count) == (4, 1)


def test_a_like_built_model_answers_the_app_sdk_client_unchanged(
    server: LocalTritonServer, served: grpcclient.InferenceServerClient, tmp_path: Path
) -> None:
    """The App SDK's own ``TritonRemoteModel`` (JSON over HTTP) with its client-side config: the model's output."""
    from monai.deploy.core.models.triton_model import TritonRemoteModel

    from monai_triton_ops.repository.config import read_config

    client_config = read_config(client_side_folder(tmp_path) / "config.pbtxt", name="spleen_ct")
    model = TritonRemoteModel("spleen_ct", server.http_address, client_config)
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 1, 96, 96, 96)).astype(np.float32))
    try:
        got = model(x).cpu().numpy()
    finally:
        model._triton_client.close()
    expected = run_module(spleen_file(tmp_path), [x.numpy()])[0]
    assert got.shape == expected.shape == (1, 2, 96, 96, 96)
    assert np.array_equal(got, expected)
    config = served.get_model_config("spleen_ct", client_timeout=TIMEOUT_S).config
    assert [t.name for t in config.input] == ["INPUT_0"]
    assert config.parameters["DISABLE_OPTIMIZED_EXECUTION"].string_value == "true"


def test_chosen_names_are_served_in_order(served: grpcclient.InferenceServerClient) -> None:
    arrays = example_inputs("two_in_two_out")
    outputs = infer(served, "renamed", arrays)
    assert list(outputs) == ["doubled", "positive"]
    for got, want in zip(outputs.values(), infer(served, "two_in_two_out", arrays).values(), strict=True):
        assert np.array_equal(got, want)


# -- monai-triton repo check --server --------------------------------------------------------------------------
@pytest.mark.usefixtures("restore_console")
def test_check_lists_what_a_server_serves(server: LocalTritonServer, capsys: pytest.CaptureFixture[str]) -> None:
    from monai_triton_ops.cli import main

    for url in (server.grpc_url, server.http_url, server.http_address):  # the App SDK's -t is HOST:PORT (HTTP)
        assert main(["repo", "check", "--server", url]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"server {url}"
        assert out[1].split() == ["MODEL", "VERSION", "STATE", "PLATFORM", "INPUTS", "OUTPUTS"]
        rows = {line.split()[0]: line for line in out[2:]}
        assert sorted(rows) == sorted([*CASES, "stacked", "spleen_ct", "renamed"])
        assert rows["spleen_ct"].split()[:5] == ["spleen_ct", "1", "READY", "python", "INPUT_0"]
        assert "OUTPUT_0 FP32 [-1, 2, 96, 96, 96]" in rows["spleen_ct"]


@pytest.mark.usefixtures("restore_console")
def test_check_compares_a_client_side_folder_with_the_server(
    server: LocalTritonServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from monai_triton_ops.cli import main

    folder = client_side_folder(tmp_path)
    assert main(["repo", "check", str(folder.parent), "--server", server.grpc_url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"spleen_ct: note: the server {server.grpc_url} serves it, version 1" in out
    (folder / "config.pbtxt").write_text(
        APP_SDK_CONFIG.replace('"INPUT_0"', '"INPUT__0"').replace("[ 2, 96", "[ 3, 96").replace("16", "8")
    )
    shutil.copytree(folder, folder.parent / "liver")
    assert main(["repo", "check", str(folder.parent), "--server", server.http_url]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    label = f"the server ({server.http_url})"
    assert f"spleen_ct: config.pbtxt says max_batch_size 8, {label} 16" in lines
    assert f"spleen_ct: config.pbtxt names the inputs ['INPUT__0'], {label} ['INPUT_0']" in lines
    assert any(line.startswith(f"liver: not on the server {server.http_url} (it serves: batched, ") for line in lines)
    assert captured.err == "error: 2 of 2 model(s) have problems (listed above): ['liver', 'spleen_ct']\n"
    (folder / "config.pbtxt").write_text(APP_SDK_CONFIG.replace("[ 2, 96", "[ 3, 96"))
    assert main(["repo", "check", str(folder), "--server", server.http_url]) == 2
    assert (
        f"spleen_ct: output 0 (OUTPUT_0): config.pbtxt says FP32 [3, 96, 96, 96], {label} FP32 [2, 96, 96, 96]"
    ) in capsys.readouterr().out.splitlines()


@pytest.mark.usefixtures("restore_console")
def test_a_client_error_the_status_table_does_not_list_is_a_bad_request_not_a_server_failure(
    server: LocalTritonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pointed at the server's metrics port, the repository index is answered 405 by the real server: an HTTP
    client error with no row of its own in the status table is the request's fault (exit 2), not the server's
    internal error (exit 4)."""
    from monai_triton_ops.cli import main

    url = f"http://127.0.0.1:{server.metrics_port}"
    assert main(["repo", "check", "--server", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: Triton server {url!r}, the repository index: the server refused the request")
    assert "Method Not Allowed" in err


def test_a_server_nobody_answers_is_exit_3_within_the_timeout(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for url in (f"grpc://127.0.0.1:{port}", f"127.0.0.1:{port}"):
        command = [sys.executable, "-m", "monai_triton_ops.cli", "repo", "check", "--server", url, "--timeout", "2"]
        started = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 3, result.stderr
        assert result.stderr.startswith(f"error: Triton server {url!r} did not give the repository index within 2 s")
        assert time.monotonic() - started < 60
